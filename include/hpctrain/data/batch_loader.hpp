// The training batches of one rank, in order: the sampler's epoch order cut into local batches, read from the HDF5 file.
// The position (epoch, step in epoch) is independent of the rank count (the global batch is fixed), so a checkpoint can
// record it and a resumed run, on any rank count, continues the same global data order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "hpctrain/data/distributed_sampler.hpp"
#include "hpctrain/data/training_data.hpp"

namespace hpctrain {

struct DataSection;

struct LoaderPosition {
  std::int64_t epoch = 0;
  std::int64_t step_in_epoch = 0;
};

class BatchLoader {
 public:
  // local_batch = data.batch_size / ranks.
  BatchLoader(TrainingData& data, const DataSection& section, const MpiEnvironment& mpi, std::int64_t local_batch,
              std::uint64_t seed);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  [[nodiscard]] std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  [[nodiscard]] std::int64_t samples_per_rank() const { return sampler_.samples_per_rank(); }
  // Where the batch that next() returns next comes from.
  [[nodiscard]] LoaderPosition position() const { return position_; }
  void seek(LoaderPosition position);
  // The next batch; valid until the following call. Moves to the next epoch after the last batch of one.
  const HostBatch& next();
  // Seconds next() spent waiting for data (reading, when nothing was prefetched).
  [[nodiscard]] double wait_seconds() const { return wait_seconds_; }

 private:
  TrainingData& data_;
  DistributedSampler sampler_;
  std::int64_t local_batch_, steps_per_epoch_;
  LoaderPosition position_;
  std::int64_t indices_epoch_ = -1;
  std::vector<std::int64_t> indices_;  // this rank's order for indices_epoch_
  HostBatch batch_;
  double wait_seconds_ = 0.0;
};

}  // namespace hpctrain
