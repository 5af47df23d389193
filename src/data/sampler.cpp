// The local-shuffle sampler and the sampler factory.
#include "hpctrain/data/sampler.hpp"

#include <numeric>
#include <tuple>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/data/distributed_sampler.hpp"

namespace hpctrain {

LocalShuffleSampler::LocalShuffleSampler(std::int64_t samples, int ranks, int rank, std::uint64_t seed, bool drop_last)
    : rank_(rank), seed_(seed) {
  HPCTRAIN_ASSERT(samples > 0 && ranks > 0 && rank >= 0 && rank < ranks, "bad sampler arguments");
  HPCTRAIN_VERIFY(samples >= ranks, InputError,
                  "data.shuffle = \"local\" gives each rank its own slice of the data, but there are "
                      << samples << " samples for " << ranks << " ranks",
                  "use more data, fewer ranks, or data.shuffle = true");
  std::tie(begin_, end_) = rank_slice(samples, ranks, rank);
  per_rank_ = drop_last ? samples / ranks : (samples + ranks - 1) / ranks;
}

void LocalShuffleSampler::fill_indices(std::int64_t epoch, std::vector<std::int64_t>& order) const {
  const std::int64_t owned = end_ - begin_;
  order.resize(static_cast<std::size_t>(owned));
  std::iota(order.begin(), order.end(), begin_);
  // Fisher-Yates from the back: position i swaps with a uniform j in [0, i]. 64 random bits scaled by (i + 1) (the
  // multiply-shift method) leave a bias below 2^-32 for any slice that fits in memory.
  const std::uint64_t key = seed_ + static_cast<std::uint64_t>(epoch);
  for (std::int64_t i = owned - 1; i > 0; --i) {
    const Philox4 bits =
        random_bits(key, RngPurpose::shuffle, static_cast<std::uint32_t>(rank_), static_cast<std::uint64_t>(i));
    const std::uint64_t word = (static_cast<std::uint64_t>(bits.v[0]) << 32) | bits.v[1];
    const auto j =
        static_cast<std::int64_t>((static_cast<unsigned __int128>(word) * static_cast<std::uint64_t>(i + 1)) >> 64);
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  // Pad with the start of this epoch's order (a slice one shorter than the longest), or truncate (drop_last).
  const std::size_t original = order.size();
  for (std::size_t i = 0; order.size() < static_cast<std::size_t>(per_rank_); ++i) order.push_back(order[i % original]);
  order.resize(static_cast<std::size_t>(per_rank_));
}

std::unique_ptr<Sampler> make_sampler(ShuffleMode mode, std::int64_t samples, int ranks, int rank, std::uint64_t seed,
                                      bool drop_last) {
  if (mode == ShuffleMode::local) return std::make_unique<LocalShuffleSampler>(samples, ranks, rank, seed, drop_last);
  return std::make_unique<DistributedSampler>(samples, ranks, rank, seed, mode == ShuffleMode::global, drop_last);
}

std::int64_t steps_per_epoch(std::int64_t samples_per_rank, std::int64_t local_batch, bool drop_last) {
  HPCTRAIN_ASSERT(local_batch > 0, "local batch " << local_batch);
  return drop_last ? samples_per_rank / local_batch : (samples_per_rank + local_batch - 1) / local_batch;
}

}  // namespace hpctrain
