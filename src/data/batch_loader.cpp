// Batch loader: the sampler's order read into a ring of pre-allocated batches by a background thread (or in next()).
#include "hpctrain/data/batch_loader.hpp"

#include <algorithm>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"

namespace hpctrain {

BatchLoader::BatchLoader(TrainingData& data, const DataSection& section, const MpiEnvironment& mpi,
                         std::int64_t local_batch, std::uint64_t seed)
    : BatchLoader(data, section, mpi.size(), mpi.rank(), local_batch, seed) {}

BatchLoader::BatchLoader(TrainingData& data, const DataSection& section, int ranks, int rank, std::int64_t local_batch,
                         std::uint64_t seed)
    : data_(data), seed_(seed), local_batch_(local_batch), prefetch_(section.prefetch) {
  HPCTRAIN_ASSERT(local_batch > 0 && section.prefetch >= 0,
                  "local batch " << local_batch << ", prefetch " << section.prefetch);
  const ShuffleMode mode = section.shuffle;
  sampler_ = make_sampler(mode, data.samples(), ranks, rank, seed, section.drop_last);
  steps_per_epoch_ = hpctrain::steps_per_epoch(sampler_->samples_per_rank(), local_batch_, section.drop_last);

  // Staging: the local slice (all this rank ever reads) or, with data.in_memory, the whole split, read once here.
  if (mode == ShuffleMode::local) {
    const auto [first, end] = rank_slice(data.samples(), ranks, rank);
    data.load_into_memory(first, end - first, section.huge_pages);
  } else if (section.in_memory) {
    data.load_into_memory(0, data.samples(), section.huge_pages);
  }

  slots_.resize(static_cast<std::size_t>(prefetch_ + 1));
  for (Slot& slot : slots_) data.reserve(slot.batch, local_batch_);
  indices_.reserve(static_cast<std::size_t>(sampler_->samples_per_rank()));
  if (data.augmentation()) augmented_.resize(static_cast<std::size_t>(data.feature_width()));
  if (prefetch_ > 0) reader_ = std::thread([this] { reader_loop(); });
}

BatchLoader::~BatchLoader() {
  if (!reader_.joinable()) return;
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  reader_.join();
}

LoaderPosition BatchLoader::after(LoaderPosition position) const {
  if (++position.step_in_epoch == steps_per_epoch_) position = {position.epoch + 1, 0};
  return position;
}

void BatchLoader::fill(Slot& slot, LoaderPosition position) {
  if (indices_epoch_ != position.epoch) {
    sampler_->fill_indices(position.epoch, indices_);
    indices_epoch_ = position.epoch;
  }
  const std::int64_t first = position.step_in_epoch * local_batch_;
  const std::int64_t rows = std::min<std::int64_t>(local_batch_, static_cast<std::int64_t>(indices_.size()) - first);
  data_.read(indices_.data() + first, rows, slot.batch);
  if (const SampleAugmentation* augmentation = data_.augmentation()) {
    const std::int64_t width = data_.feature_width();
    for (std::int64_t r = 0; r < rows; ++r) {
      float* row = slot.batch.features.data() + r * width;
      augmentation->apply(augmentation->draw(seed_, position.epoch, slot.batch.sample_ids[r]), row, augmented_.data());
      std::copy(augmented_.begin(), augmented_.end(), row);
    }
  }
  slot.position = position;
}

void BatchLoader::reader_loop() {
  const std::size_t ring = slots_.size();
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || (!error_ && filled_ + (holding_ ? 1 : 0) < ring); });
    if (stopping_) return;
    Slot& slot = slots_[(head_ + (holding_ ? 1 : 0) + filled_) % ring];  // the first free slot: nobody else uses it
    const LoaderPosition position = fill_position_;
    const std::uint64_t generation = generation_;
    lock.unlock();
    std::exception_ptr failure;
    try {
      fill(slot, position);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // seek() discarded this batch while it was being read
    if (failure) {
      error_ = failure;
    } else {
      ++filled_;
      fill_position_ = after(position);
    }
    changed_.notify_all();
  }
}

void BatchLoader::seek(LoaderPosition position) {
  HPCTRAIN_ASSERT(position.epoch >= 0 && position.step_in_epoch >= 0 && position.step_in_epoch < steps_per_epoch_,
                  "position (epoch " << position.epoch << ", step " << position.step_in_epoch
                                     << ") outside an epoch of " << steps_per_epoch_ << " steps");
  position_ = position;
  if (prefetch_ == 0) return;
  {
    const std::lock_guard lock(mutex_);
    ++generation_;
    head_ = 0;
    filled_ = 0;
    holding_ = false;
    fill_position_ = position;
    error_ = nullptr;
  }
  changed_.notify_all();
}

const HostBatch& BatchLoader::next() {
  if (prefetch_ == 0) {
    Slot& slot = slots_.front();
    fill(slot, position_);
    position_ = after(position_);
    return slot.batch;
  }
  std::unique_lock lock(mutex_);
  if (holding_) {  // the caller is done with the batch it got last time: its slot goes back to the reader
    head_ = (head_ + 1) % slots_.size();
    holding_ = false;
    changed_.notify_all();
  }
  changed_.wait(lock, [&] { return filled_ > 0 || error_; });
  if (filled_ == 0) std::rethrow_exception(error_);  // the batch we need failed: the reader's exception, as it was
  --filled_;
  holding_ = true;
  const Slot& slot = slots_[head_];
  HPCTRAIN_ASSERT(slot.position == position_, "the reader filled (epoch "
                                                  << slot.position.epoch << ", step " << slot.position.step_in_epoch
                                                  << ") where (epoch " << position_.epoch << ", step "
                                                  << position_.step_in_epoch << ") was due");
  position_ = after(position_);
  lock.unlock();
  return slot.batch;
}

}  // namespace hpctrain
