// The training batches of one rank, in order: the sampler's epoch order cut into local batches, read from the HDF5
// files (or from memory) by a background thread into a ring of pre-allocated buffers, data.prefetch batches ahead, so
// that reading overlaps the training step.
//
// The position (epoch, step in epoch) is independent of the rank count (the global batch is fixed), so a checkpoint can
// record it and a resumed run, on any rank count, continues the same global data order (in the PyTorch-compatible
// modes; with data.shuffle = "local" the order depends on the rank count by design).
//
// Threads: the reader thread calls no MPI (the run is MPI_THREAD_FUNNELED) and takes lock_hdf5() around every HDF5 call
// (Hdf5Dataset does), so the main thread may use HDF5 meanwhile. While a loader with prefetch lives, only it reads its
// TrainingData. An exception in the reader thread is rethrown, with its original type, by the next() that would have
// returned the failed batch (and by every next() after it, until a seek()).
//
// When the training data has an augmentation (TrainingData::set_up_augmentation), the reader applies it to every row
// it reads, with the choices of (seed, epoch, global sample index): the batches stay independent of the rank count,
// prefetch and resumes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hpctrain/data/sampler.hpp"
#include "hpctrain/data/training_data.hpp"

namespace hpctrain {

struct DataSection;

struct LoaderPosition {
  std::int64_t epoch = 0;
  std::int64_t step_in_epoch = 0;
  friend bool operator==(const LoaderPosition&, const LoaderPosition&) = default;
};

class BatchLoader {
 public:
  // local_batch = data.batch_size / ranks. Uses data.shuffle, data.drop_last, data.prefetch and data.in_memory. With
  // data.shuffle = "local" or data.in_memory the rank's share is loaded into memory here, before returning.
  BatchLoader(TrainingData& data, const DataSection& section, const MpiEnvironment& mpi, std::int64_t local_batch,
              std::uint64_t seed);
  BatchLoader(TrainingData& data, const DataSection& section, int ranks, int rank, std::int64_t local_batch,
              std::uint64_t seed);
  ~BatchLoader();  // stops and joins the reader thread
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  [[nodiscard]] std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  [[nodiscard]] std::int64_t samples_per_rank() const { return sampler_->samples_per_rank(); }
  // Where the batch that next() returns next comes from.
  [[nodiscard]] LoaderPosition position() const { return position_; }
  // Continue from `position`: batches read ahead are discarded (and the batch next() returned last is no longer valid).
  void seek(LoaderPosition position);
  // The next batch; valid until the following call of next() or seek(). Moves to the next epoch after the last batch of
  // one.
  const HostBatch& next();

 private:
  struct Slot {
    HostBatch batch;  // sized for local_batch rows when the ring is set up
    LoaderPosition position;
  };
  [[nodiscard]] LoaderPosition after(LoaderPosition position) const;
  // Read the batch at `position` into slot (the reader thread, or next() without prefetch).
  void fill(Slot& slot, LoaderPosition position);
  void reader_loop();

  TrainingData& data_;
  std::uint64_t seed_ = 0;
  std::unique_ptr<Sampler> sampler_;
  std::int64_t local_batch_ = 0, steps_per_epoch_ = 0, prefetch_ = 0;
  LoaderPosition position_;  // the main thread's: what next() returns next

  // Used only by whoever fills slots (the reader thread, or the main thread without prefetch).
  std::int64_t indices_epoch_ = -1;
  std::vector<std::int64_t> indices_;  // (samples_per_rank) this rank's order for indices_epoch_
  std::vector<float> augmented_;       // (feature_width) one augmented sample, when the data has an augmentation

  // The ring: prefetch + 1 slots (one held by the caller of next(), the others filled ahead), allocated once. In ring
  // order from head_: the held slot (if holding_), then `filled_` ready slots, then free ones.
  std::vector<Slot> slots_;
  std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::size_t head_ = 0, filled_ = 0;
  bool holding_ = false;
  LoaderPosition fill_position_;  // the position the reader fills next
  std::uint64_t generation_ = 0;  // bumped by seek(): a batch read for an older generation is dropped
  std::exception_ptr error_;      // the reader's failure at fill_position_
  bool stopping_ = false;
  std::thread reader_;
};

}  // namespace hpctrain
