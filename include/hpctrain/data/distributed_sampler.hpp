// Which samples each rank reads, with exactly the semantics of PyTorch's DistributedSampler, so a user can reproduce a
// PyTorch run's data order (and the order of an hpctrain run with another rank count).
//
// Per epoch: permutation = torch.randperm(N) with a generator seeded with seed + epoch (std::mt19937, core/mt19937.hpp;
// for each i in 0..N-2: z = next() % (N - i); swap(r[i], r[i + z])), or the identity without shuffling. drop_last =
// false pads the permutation with its own first elements up to a multiple of R; drop_last = true truncates it. Rank r
// takes perm[r], perm[r + R], ...
#pragma once

#include <cstdint>
#include <vector>

#include "hpctrain/data/sampler.hpp"

namespace hpctrain {

// torch.randperm(n) on the CPU for a generator seeded with `seed`.
std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed);

class DistributedSampler final : public Sampler {
 public:
  DistributedSampler(std::int64_t samples, int ranks, int rank, std::uint64_t seed, bool shuffle, bool drop_last);
  // Samples per rank and epoch (num_samples in PyTorch).
  [[nodiscard]] std::int64_t samples_per_rank() const override { return per_rank_; }
  // This rank's sample indices for an epoch, in the order it visits them.
  void fill_indices(std::int64_t epoch, std::vector<std::int64_t>& out) const override;

 private:
  std::int64_t samples_;
  int ranks_, rank_;
  std::uint64_t seed_;
  bool shuffle_, drop_last_;
  std::int64_t per_rank_;
  // (samples) the last epoch's permutation, kept for its memory (so fill_indices is for one caller at a time): 32-bit
  // while the samples fit.
  mutable std::vector<std::int32_t> permutation32_;
  mutable std::vector<std::int64_t> permutation64_;
};

}  // namespace hpctrain
