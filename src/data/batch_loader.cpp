// Batch loader: synchronous reads of the sampler's order.
#include "hpctrain/data/batch_loader.hpp"

#include <mpi.h>

#include <algorithm>

#include "hpctrain/config/run_config.hpp"

namespace hpctrain {

BatchLoader::BatchLoader(TrainingData& data, const DataSection& section, const MpiEnvironment& mpi,
                         std::int64_t local_batch, std::uint64_t seed)
    : data_(data),
      sampler_(data.samples(), mpi.size(), mpi.rank(), seed, section.shuffle, section.drop_last),
      local_batch_(local_batch) {
  const std::int64_t per_rank = sampler_.samples_per_rank();
  steps_per_epoch_ = section.drop_last ? per_rank / local_batch_ : (per_rank + local_batch_ - 1) / local_batch_;
}

BatchLoader::~BatchLoader() = default;

void BatchLoader::seek(LoaderPosition position) { position_ = position; }

const HostBatch& BatchLoader::next() {
  const double start = MPI_Wtime();
  if (indices_epoch_ != position_.epoch) {
    indices_ = sampler_.indices(position_.epoch);
    indices_epoch_ = position_.epoch;
  }
  const std::int64_t first = position_.step_in_epoch * local_batch_;
  const std::int64_t rows = std::min<std::int64_t>(local_batch_, static_cast<std::int64_t>(indices_.size()) - first);
  data_.read(indices_.data() + first, rows, batch_);
  if (++position_.step_in_epoch == steps_per_epoch_) position_ = {position_.epoch + 1, 0};
  wait_seconds_ += MPI_Wtime() - start;
  return batch_;
}

}  // namespace hpctrain
