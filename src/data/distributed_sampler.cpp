// DistributedSampler with PyTorch's semantics.
#include "hpctrain/data/distributed_sampler.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/mt19937.hpp"

namespace hpctrain {

namespace {
// torch.randperm's loop on the CPU: p = 0..n-1, then for i in 0..n-2: z = next() % (n - i), swap(p[i], p[i + z]).
// Index is int32 where n allows: half the memory for the swaps' random accesses.
template <class Index>
void shuffle_like_torch(std::vector<Index>& p, std::int64_t n, std::uint64_t seed) {
  p.resize(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), Index{0});
  Mt19937Blocks generator(static_cast<std::uint32_t>(seed));  // std::mt19937 keeps the seed's low 32 bits too
  for (std::int64_t i = 0; i + 1 < n;) {
    const std::uint32_t* bits = generator.next_block();
    const std::int64_t end = std::min<std::int64_t>(n - 1, i + Mt19937Blocks::block_size);
    for (const std::uint32_t* next = bits; i < end; ++i, ++next) {
      const auto range = static_cast<std::uint64_t>(n - i);  // a 32-bit draw modulo 2^32 or more is the draw
      const std::uint64_t z = range > UINT32_MAX ? *next : *next % static_cast<std::uint32_t>(range);
      std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(i) + z]);
    }
  }
}
}  // namespace

std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> permutation;
  shuffle_like_torch(permutation, n, seed);
  return permutation;
}

DistributedSampler::DistributedSampler(std::int64_t samples, int ranks, int rank, std::uint64_t seed, bool shuffle,
                                       bool drop_last)
    : samples_(samples), ranks_(ranks), rank_(rank), seed_(seed), shuffle_(shuffle), drop_last_(drop_last) {
  HPCTRAIN_ASSERT(samples > 0 && ranks > 0 && rank >= 0 && rank < ranks, "bad sampler arguments");
  // PyTorch: drop_last and N % R != 0 -> ceil((N - R) / R) = floor(N / R); otherwise ceil(N / R).
  per_rank_ = (drop_last_ && samples_ % ranks_ != 0) ? samples_ / ranks_ : (samples_ + ranks_ - 1) / ranks_;
}

void DistributedSampler::fill_indices(std::int64_t epoch, std::vector<std::int64_t>& out) const {
  // Rank r takes positions r, r + R, ... of the padded order, whose position k holds the order's k % N (padding repeats
  // it from its start).
  out.resize(static_cast<std::size_t>(per_rank_));
  const auto take = [&](const auto& order) {
    std::int64_t j = 0;
    for (std::int64_t k = rank_; j < per_rank_ && k < samples_; ++j, k += ranks_)
      out[static_cast<std::size_t>(j)] = order(k);
    for (; j < per_rank_; ++j) out[static_cast<std::size_t>(j)] = order((rank_ + j * ranks_) % samples_);  // padding
  };
  const std::uint64_t seed = seed_ + static_cast<std::uint64_t>(epoch);
  if (!shuffle_) {
    take([](std::int64_t k) { return k; });
  } else if (samples_ <= std::numeric_limits<std::int32_t>::max()) {
    shuffle_like_torch(permutation32_, samples_, seed);
    take([&](std::int64_t k) { return std::int64_t{permutation32_[static_cast<std::size_t>(k)]}; });
  } else {
    shuffle_like_torch(permutation64_, samples_, seed);
    take([&](std::int64_t k) { return permutation64_[static_cast<std::size_t>(k)]; });
  }
}

}  // namespace hpctrain
