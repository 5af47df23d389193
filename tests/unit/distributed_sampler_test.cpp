// DistributedSampler: PyTorch's rules for padding, truncation and interleaving, checked against values worked out by
// hand from those rules and against a direct transcription of the rules over a sweep of (N, R, seed, epoch, shuffle,
// drop_last), and the invariants (every sample once per epoch except padding; the global batch at a step is the same
// set of samples whatever the rank count). LocalShuffleSampler: each rank sees exactly its slice, in a new order every
// epoch.
#include "hpctrain/data/distributed_sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "hpctrain/core/error.hpp"
#include "hpctrain/data/sampler.hpp"

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

// The rules of the issue written out as plainly as possible, independently of the sampler's code: randperm by swaps
// with mt19937(seed + epoch), pad by cycling through the permutation (or truncate with drop_last), rank r takes every
// R-th element from r.
Indices reference_indices(std::int64_t n, int ranks, int rank, std::uint64_t seed, std::int64_t epoch, bool shuffle,
                          bool drop_last) {
  Indices permutation(n);
  for (std::int64_t i = 0; i < n; ++i) permutation[i] = i;
  if (shuffle) {
    std::mt19937 generator(static_cast<std::uint32_t>(seed + epoch));
    for (std::int64_t i = 0; i + 1 < n; ++i) {
      const std::int64_t z = generator() % (n - i);
      std::swap(permutation[i], permutation[i + z]);
    }
  }
  // PyTorch: num_samples = ceil((N - R) / R) with drop_last when R does not divide N, ceil(N / R) otherwise.
  std::int64_t per_rank = 0;
  if (drop_last && n % ranks != 0) {
    per_rank = n > ranks ? (n - ranks + ranks - 1) / ranks : 0;
  } else {
    per_rank = (n + ranks - 1) / ranks;
  }
  Indices padded;
  for (std::int64_t i = 0; i < per_rank * ranks; ++i) padded.push_back(permutation[i % n]);
  Indices mine;
  for (std::int64_t i = rank; i < per_rank * ranks; i += ranks) mine.push_back(padded[i]);
  return mine;
}

TEST(TorchRandperm, MatchesTheRulesAcrossTheGeneratorsBlocks) {
  // The generator renews its 624 words of state at a time: sizes around one and several blocks, and one large size.
  for (std::int64_t n : {623, 624, 625, 626, 1248, 1249, 5000, 100003})
    for (std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{42}, (std::uint64_t{7} << 32) + 5}) {
      const Indices expected = reference_indices(n, 1, 0, seed, 0, true, false);
      ASSERT_EQ(torch_randperm(n, seed), expected) << "n " << n << " seed " << seed;
    }
}

TEST(DistributedSampler, FillsAReusedVector) {
  // The loader keeps one vector for every epoch: whatever it held before, it ends up holding exactly the epoch's
  // indices, for shuffled, ordered and padded cases.
  for (const auto& [n, ranks, shuffle] :
       {std::tuple{3001, 4, true}, std::tuple{3001, 4, false}, std::tuple{3, 8, true}})
    for (int rank : {0, ranks - 1}) {
      const DistributedSampler sampler(n, ranks, rank, 11, shuffle, false);
      Indices reused(5000, -7);
      for (std::int64_t epoch : {0, 1, 5}) {
        sampler.fill_indices(epoch, reused);
        ASSERT_EQ(reused, reference_indices(n, ranks, rank, 11, epoch, shuffle, false))
            << "n " << n << " ranks " << ranks << " rank " << rank << " epoch " << epoch;
        reused.assign(3, -7);  // smaller than the next epoch's
      }
    }
}

TEST(DistributedSampler, MatchesTheRulesOverASweep) {
  int cases = 0;
  for (std::int64_t n : {1, 2, 3, 5, 7, 10, 13, 64, 97, 100})
    for (int ranks : {1, 2, 3, 4, 5, 8})
      for (std::uint64_t seed : {0u, 42u})
        for (std::int64_t epoch : {0, 3})
          for (bool shuffle : {false, true})
            for (bool drop_last : {false, true})
              for (int rank = 0; rank < ranks; ++rank) {
                const DistributedSampler sampler(n, ranks, rank, seed, shuffle, drop_last);
                const Indices expected = reference_indices(n, ranks, rank, seed, epoch, shuffle, drop_last);
                ASSERT_EQ(sampler.indices(epoch), expected)
                    << "N " << n << " R " << ranks << " rank " << rank << " seed " << seed << " epoch " << epoch
                    << " shuffle " << shuffle << " drop_last " << drop_last;
                ASSERT_EQ(sampler.samples_per_rank(), static_cast<std::int64_t>(expected.size()));
                ++cases;
              }
  EXPECT_EQ(cases, 10 * 23 * 2 * 2 * 2 * 2);
}

TEST(DistributedSampler, HandWorkedShuffledCaseWithPadding) {
  // N = 5, R = 2, seed 7, epoch 1: randperm with mt19937(8); total 6, padding perm[0].
  std::mt19937 generator(8);
  Indices perm{0, 1, 2, 3, 4};
  for (int i = 0; i < 4; ++i) std::swap(perm[i], perm[i + generator() % (5 - i)]);
  EXPECT_EQ(DistributedSampler(5, 2, 0, 7, true, false).indices(1), (Indices{perm[0], perm[2], perm[4]}));
  EXPECT_EQ(DistributedSampler(5, 2, 1, 7, true, false).indices(1), (Indices{perm[1], perm[3], perm[0]}));
  // drop_last: total 4, perm[4] is dropped
  EXPECT_EQ(DistributedSampler(5, 2, 0, 7, true, true).indices(1), (Indices{perm[0], perm[2]}));
  EXPECT_EQ(DistributedSampler(5, 2, 1, 7, true, true).indices(1), (Indices{perm[1], perm[3]}));
}

TEST(DistributedSampler, NoSampleTwiceWithinAnEpochExceptPadding) {
  for (std::int64_t n : {3, 10, 13, 97})
    for (int ranks : {2, 3, 4, 8})
      for (bool drop_last : {false, true}) {
        std::map<std::int64_t, int> seen;
        std::int64_t total = 0;
        for (int rank = 0; rank < ranks; ++rank)
          for (const std::int64_t i : DistributedSampler(n, ranks, rank, 5, true, drop_last).indices(1)) {
            ++seen[i];
            ++total;
          }
        const Indices order = torch_randperm(n, 5 + 1);
        if (drop_last) {  // every sample at most once
          for (const auto& [sample, count] : seen) ASSERT_EQ(count, 1) << "sample " << sample;
          EXPECT_EQ(total, n / ranks * ranks);
        } else {  // every sample at least once; the extra visits are exactly the padding, the start of the order
          ASSERT_EQ(static_cast<std::int64_t>(seen.size()), n);
          const std::int64_t padding = total - n;
          std::map<std::int64_t, int> expected_extra;
          for (std::int64_t i = 0; i < padding; ++i) ++expected_extra[order[i % n]];
          for (const auto& [sample, count] : seen)
            ASSERT_EQ(count - 1, expected_extra.count(sample) ? expected_extra[sample] : 0)
                << "N " << n << " R " << ranks << " sample " << sample;
        }
      }
}

// (The deck's words for the modes are read by the config layer: run_config_test checks them.)
TEST(ShuffleMode, Factory) {
  EXPECT_EQ(make_sampler(ShuffleMode::global, 50, 3, 1, 9, false)->indices(2),
            DistributedSampler(50, 3, 1, 9, true, false).indices(2));
  EXPECT_EQ(make_sampler(ShuffleMode::none, 50, 3, 1, 9, true)->indices(2),
            DistributedSampler(50, 3, 1, 9, false, true).indices(2));
  EXPECT_EQ(steps_per_epoch(10, 4, false), 3);
  EXPECT_EQ(steps_per_epoch(10, 4, true), 2);
  EXPECT_EQ(steps_per_epoch(8, 4, false), 2);
}

TEST(LocalShuffleSampler, EachRankSeesExactlyItsSliceInANewOrderEveryEpoch) {
  const std::int64_t n = 120;
  for (int ranks : {1, 2, 3, 4}) {
    std::vector<bool> covered(n, false);
    for (int rank = 0; rank < ranks; ++rank) {
      const LocalShuffleSampler sampler(n, ranks, rank, 11, false);
      EXPECT_EQ(sampler.slice_begin(), n * rank / ranks);
      EXPECT_EQ(sampler.slice_end(), n * (rank + 1) / ranks);
      Indices previous;
      for (std::int64_t epoch = 0; epoch < 4; ++epoch) {
        const Indices order = sampler.indices(epoch);
        Indices sorted = order;
        std::sort(sorted.begin(), sorted.end());
        Indices slice(static_cast<std::size_t>(sampler.slice_end() - sampler.slice_begin()));
        std::iota(slice.begin(), slice.end(), sampler.slice_begin());
        ASSERT_EQ(sorted, slice) << "ranks " << ranks << " rank " << rank << " epoch " << epoch;
        EXPECT_NE(order, previous) << "the order did not change at epoch " << epoch;
        EXPECT_NE(order, slice) << "not shuffled";
        EXPECT_EQ(order, sampler.indices(epoch)) << "not deterministic";
        previous = order;
      }
      for (std::int64_t i = sampler.slice_begin(); i < sampler.slice_end(); ++i) covered[i] = true;
    }
    EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](bool c) { return c; })) << "ranks " << ranks;
  }
  // Another seed, another order; another rank's stream is not a shifted copy of this one's.
  EXPECT_NE(LocalShuffleSampler(n, 2, 0, 11, false).indices(0), LocalShuffleSampler(n, 2, 0, 12, false).indices(0));
  Indices rank1 = LocalShuffleSampler(n, 2, 1, 11, false).indices(0);
  for (auto& i : rank1) i -= n / 2;
  EXPECT_NE(LocalShuffleSampler(n, 2, 0, 11, false).indices(0), rank1);
}

TEST(LocalShuffleSampler, PadsShortSlicesAndTruncatesWithDropLast) {
  // N = 10, R = 4: slices [0, 2), [2, 5), [5, 7), [7, 10): sizes 2, 3, 2, 3.
  for (int rank = 0; rank < 4; ++rank) {
    const LocalShuffleSampler padded(10, 4, rank, 3, false);
    const Indices order = padded.indices(2);
    ASSERT_EQ(order.size(), 3u);  // ceil(10 / 4)
    const std::int64_t begin = padded.slice_begin(), end = padded.slice_end();
    for (const std::int64_t i : order) EXPECT_TRUE(i >= begin && i < end) << i;
    if (end - begin == 2) {
      EXPECT_EQ(order[2], order[0]) << "a short slice is padded with the start of its own order";
      EXPECT_NE(order[0], order[1]);
    } else {
      EXPECT_EQ(std::set<std::int64_t>(order.begin(), order.end()).size(), 3u);
    }
    const Indices truncated = LocalShuffleSampler(10, 4, rank, 3, true).indices(2);
    ASSERT_EQ(truncated.size(), 2u);  // floor(10 / 4)
    EXPECT_NE(truncated[0], truncated[1]);
    for (const std::int64_t i : truncated) EXPECT_TRUE(i >= begin && i < end) << i;
  }
  EXPECT_THROW(LocalShuffleSampler(3, 4, 0, 0, false), InputError);  // a rank would own nothing
}

TEST(LocalShuffleSampler, EveryPositionIsEquallyLikely) {
  // Over many epochs, each of the 4 samples of a slice comes first about a quarter of the time: a biased shuffle
  // (e.g. swapping with a j in [0, n) instead of [0, i]) fails this.
  std::map<std::int64_t, int> first;
  const int epochs = 8000;
  for (int epoch = 0; epoch < epochs; ++epoch) ++first[LocalShuffleSampler(8, 2, 1, 0, false).indices(epoch)[0]];
  ASSERT_EQ(first.size(), 4u);
  for (const auto& [sample, count] : first) EXPECT_NEAR(count, epochs / 4, 150) << "sample " << sample;
  // ... and the sixth sample of 6 equally often lands in each position (a position test, not only the first).
  std::map<std::int64_t, int> where;
  for (int epoch = 0; epoch < 6000; ++epoch) {
    const Indices order = LocalShuffleSampler(6, 1, 0, 1, false).indices(epoch);
    ++where[std::find(order.begin(), order.end(), 5) - order.begin()];
  }
  for (const auto& [position, count] : where) EXPECT_NEAR(count, 1000, 110) << "position " << position;
}

}  // namespace
}  // namespace hpctrain
