// DistributedSampler: PyTorch's rules for padding, truncation and interleaving, checked against values worked out by
// hand from those rules, and the invariants (every sample once per epoch except padding; the global batch at a step is
// the same set of samples whatever the rank count).
#include "hpctrain/data/distributed_sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace hpctrain {
namespace {

using Indices = std::vector<std::int64_t>;

TEST(TorchRandperm, IsAPermutationDrivenByMersenneTwister) {
  // Rebuild the documented algorithm step by step with a separate generator: r[i] = i; swap(r[i], r[i + next() %
  // (n-i)]).
  const std::int64_t n = 10;
  std::mt19937 generator(1234);
  Indices expected(n);
  for (std::int64_t i = 0; i < n; ++i) expected[i] = i;
  for (std::int64_t i = 0; i < n - 1; ++i) std::swap(expected[i], expected[i + generator() % (n - i)]);
  EXPECT_EQ(torch_randperm(n, 1234), expected);
  Indices sorted = torch_randperm(1000, 5);
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(torch_randperm(1000, 5), torch_randperm(1000, 6));
}

TEST(DistributedSampler, PadsWithTheFirstElementsWithoutShuffle) {
  // N = 10, R = 4: num_samples = 3, total 12, padding perm[0], perm[1]
  EXPECT_EQ(DistributedSampler(10, 4, 0, 0, false, false).indices(0), (Indices{0, 4, 8}));
  EXPECT_EQ(DistributedSampler(10, 4, 1, 0, false, false).indices(0), (Indices{1, 5, 9}));
  EXPECT_EQ(DistributedSampler(10, 4, 2, 0, false, false).indices(0), (Indices{2, 6, 0}));
  EXPECT_EQ(DistributedSampler(10, 4, 3, 0, false, false).indices(0), (Indices{3, 7, 1}));
}

TEST(DistributedSampler, TruncatesWithDropLast) {
  // N = 10, R = 4, drop_last: num_samples = ceil((10 - 4) / 4) = 2, total 8
  EXPECT_EQ(DistributedSampler(10, 4, 0, 0, false, true).indices(0), (Indices{0, 4}));
  EXPECT_EQ(DistributedSampler(10, 4, 3, 0, false, true).indices(0), (Indices{3, 7}));
}

TEST(DistributedSampler, RepeatsThePermutationWhenFewerSamplesThanRanks) {
  // N = 2, R = 5: num_samples 1, total 5: order 0 1 0 1 0
  for (int rank = 0; rank < 5; ++rank)
    EXPECT_EQ(DistributedSampler(2, 5, rank, 0, false, false).indices(0), (Indices{rank % 2}));
}

TEST(DistributedSampler, ShuffledEpochUsesSeedPlusEpoch) {
  const auto order = torch_randperm(13, 100 + 3);
  const DistributedSampler sampler(13, 3, 1, 100, true, false);
  // total 15: padding with order[0], order[1]; rank 1 takes positions 1, 4, 7, 10, 13
  Indices padded = order;
  padded.push_back(order[0]);
  padded.push_back(order[1]);
  EXPECT_EQ(sampler.indices(3), (Indices{padded[1], padded[4], padded[7], padded[10], padded[13]}));
  EXPECT_NE(sampler.indices(3), sampler.indices(4));
}

TEST(DistributedSampler, EverySampleOncePerEpochAndGlobalBatchesIndependentOfRankCount) {
  const std::int64_t n = 96, batch = 12;
  for (int ranks : {1, 2, 3, 4}) {
    std::multiset<std::int64_t> seen;
    std::vector<Indices> per_rank;
    for (int rank = 0; rank < ranks; ++rank) {
      per_rank.push_back(DistributedSampler(n, ranks, rank, 9, true, false).indices(2));
      seen.insert(per_rank.back().begin(), per_rank.back().end());
    }
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(seen.count(i), 1u) << "ranks " << ranks << " sample " << i;
    // global batch at step s: the union over ranks of local rows [s*b, (s+1)*b), b = batch / ranks
    const auto order = torch_randperm(n, 9 + 2);
    const std::int64_t local = batch / ranks;
    for (std::int64_t step = 0; step < n / batch; ++step) {
      std::set<std::int64_t> global;
      for (int rank = 0; rank < ranks; ++rank)
        for (std::int64_t i = 0; i < local; ++i) global.insert(per_rank[rank][step * local + i]);
      const std::set<std::int64_t> expected(order.begin() + step * batch, order.begin() + (step + 1) * batch);
      EXPECT_EQ(global, expected) << "ranks " << ranks << " step " << step;
    }
  }
}

}  // namespace
}  // namespace hpctrain
