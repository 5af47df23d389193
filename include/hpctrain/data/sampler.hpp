// Which samples a rank reads in an epoch, and in which order: the interface the batch loader and `hpctrain data plan`
// use, the three shuffle modes of `data.shuffle`, and the local-shuffle sampler (the PyTorch-compatible one is in
// distributed_sampler.hpp).
//
// Every mode gives every rank the same number of samples per epoch (samples_per_rank), so all ranks take the same
// number of steps and meet at the same collectives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpctrain/config/choices.hpp"

namespace hpctrain {

// data.shuffle (ShuffleMode, config/choices.hpp): global (= true) PyTorch's DistributedSampler with shuffling, none
// (= false) the same without shuffling, local each rank shuffles within its own contiguous slice of the data.

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Samples per rank and epoch (the same on every rank).
  [[nodiscard]] virtual std::int64_t samples_per_rank() const = 0;
  // This rank's sample indices for an epoch, in the order it visits them: samples_per_rank() of them, into `out`
  // (resized; its memory reused from epoch to epoch, so a new epoch touches no fresh pages).
  virtual void fill_indices(std::int64_t epoch, std::vector<std::int64_t>& out) const = 0;
  [[nodiscard]] std::vector<std::int64_t> indices(std::int64_t epoch) const {
    std::vector<std::int64_t> out;
    fill_indices(epoch, out);
    return out;
  }
};

// data.shuffle = "local": rank r owns the contiguous slice [r N / R, (r + 1) N / R) of the N samples (rounded down; the
// slices differ in size by at most one) and visits it in a fresh random order every epoch. The order is a Fisher-Yates
// shuffle driven by the counter-based generator of core/rng.hpp keyed with seed + epoch, on a stream of its own per
// rank, so it depends on (seed, epoch, rank, slice) only. Like PyTorch's sampler, drop_last = false pads a short slice
// with the first samples of its own order up to ceil(N / R), and drop_last = true truncates every slice to floor(N /
// R).
//
// The trade-off: a rank reads one contiguous range once and never touches the file again (the staging pattern of large
// runs), but a sample only ever meets samples of its own slice in a batch, and the data order depends on the rank
// count. A file sorted by class must be shuffled once beforehand (`hpctrain data split --shuffle`).
class LocalShuffleSampler final : public Sampler {
 public:
  // Throws InputError when there are fewer samples than ranks (a rank would own nothing).
  LocalShuffleSampler(std::int64_t samples, int ranks, int rank, std::uint64_t seed, bool drop_last);
  [[nodiscard]] std::int64_t samples_per_rank() const override { return per_rank_; }
  void fill_indices(std::int64_t epoch, std::vector<std::int64_t>& out) const override;
  // The slice this rank owns: [slice_begin(), slice_end()).
  [[nodiscard]] std::int64_t slice_begin() const { return begin_; }
  [[nodiscard]] std::int64_t slice_end() const { return end_; }

 private:
  std::int64_t begin_ = 0, end_ = 0, per_rank_ = 0;
  int rank_ = 0;
  std::uint64_t seed_ = 0;
};

// rank_slice (core/numbers.hpp) is the contiguous slice of the samples that a rank owns in local-shuffle mode (also the
// rows a rank checks and loads).

std::unique_ptr<Sampler> make_sampler(ShuffleMode mode, std::int64_t samples, int ranks, int rank, std::uint64_t seed,
                                      bool drop_last);

// Steps of one epoch for a rank with samples_per_rank samples and local batches of local_batch: the last partial batch
// counts unless drop_last.
std::int64_t steps_per_epoch(std::int64_t samples_per_rank, std::int64_t local_batch, bool drop_last);

}  // namespace hpctrain
