// DistributedSampler with PyTorch's semantics.
#include "hpctrain/data/distributed_sampler.hpp"

#include <numeric>
#include <random>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> permutation(static_cast<std::size_t>(n));
  std::iota(permutation.begin(), permutation.end(), 0);
  std::mt19937 generator(static_cast<std::mt19937::result_type>(seed));
  for (std::int64_t i = 0; i + 1 < n; ++i) {
    const auto z = static_cast<std::int64_t>(generator() % static_cast<std::uint64_t>(n - i));
    std::swap(permutation[static_cast<std::size_t>(i)], permutation[static_cast<std::size_t>(i + z)]);
  }
  return permutation;
}

DistributedSampler::DistributedSampler(std::int64_t samples, int ranks, int rank, std::uint64_t seed, bool shuffle,
                                       bool drop_last)
    : samples_(samples), ranks_(ranks), rank_(rank), seed_(seed), shuffle_(shuffle), drop_last_(drop_last) {
  HPCTRAIN_ASSERT(samples > 0 && ranks > 0 && rank >= 0 && rank < ranks, "bad sampler arguments");
  // PyTorch: drop_last and N % R != 0 -> ceil((N - R) / R) = floor(N / R); otherwise ceil(N / R).
  per_rank_ = (drop_last_ && samples_ % ranks_ != 0) ? samples_ / ranks_ : (samples_ + ranks_ - 1) / ranks_;
}

std::vector<std::int64_t> DistributedSampler::global_order(std::int64_t epoch) const {
  std::vector<std::int64_t> order;
  if (shuffle_) {
    order = torch_randperm(samples_, seed_ + static_cast<std::uint64_t>(epoch));
  } else {
    order.resize(static_cast<std::size_t>(samples_));
    std::iota(order.begin(), order.end(), 0);
  }
  const auto total = static_cast<std::size_t>(per_rank_ * ranks_);
  if (order.size() >= total) {
    order.resize(total);
  } else {  // pad by repeating the permutation from its start, as often as needed
    const std::size_t original = order.size();
    for (std::size_t i = 0; order.size() < total; ++i) order.push_back(order[i % original]);
  }
  return order;
}

std::vector<std::int64_t> DistributedSampler::indices(std::int64_t epoch) const {
  const std::vector<std::int64_t> order = global_order(epoch);
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(per_rank_));
  for (std::size_t i = static_cast<std::size_t>(rank_); i < order.size(); i += static_cast<std::size_t>(ranks_))
    mine.push_back(order[i]);
  return mine;
}

}  // namespace hpctrain
