// The bucketed gradient all-reduce sums every element exactly once over the ranks, whatever the bucket size, the
// algorithm and the order in which backward reports layers (values chosen so float sums are exact); the rank-order
// algorithm gives every element the bits of its sum in rank order, on every rank (random values, whose sums depend
// on the order); so does the all-reduce staged through host memory (used by CUDA ranks sharing a GPU), run here on
// the CPU backend; buckets tile the buffer; the sharded optimizer's reduce-scatter and gather.
#include "hpctrain/dist/gradient_allreduce.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "hpctrain/core/numbers.hpp"
#include "hpctrain/dist/rank_order_allreduce.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {
namespace {

class GradientAllreduceTest : public testing::TestWithParam<std::tuple<std::int64_t, MpiAllreduce>> {};

TEST_P(GradientAllreduceTest, SumsEveryElementOnce) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::vector<std::int64_t> layer_begins{0, 0, 100, 100, 1100, 1150, 5150};
  const std::int64_t count = 5200;
  std::vector<float> gradients(count);
  const auto [bucket_bytes, algorithm] = GetParam();
  GradientAllreduce allreduce(MPI_COMM_WORLD, gradients.data(), count, layer_begins, bucket_bytes,
                              {.algorithm = algorithm});
  EXPECT_GE(allreduce.bucket_count(), 1u);
  for (int repeat = 0; repeat < 2; ++repeat) {
    for (std::int64_t i = 0; i < count; ++i) gradients[i] = static_cast<float>((i % 97) * (rank + 1) + repeat);
    allreduce.begin_step();
    for (auto it = layer_begins.rbegin(); it != layer_begins.rend(); ++it) allreduce.ready_from(*it);
    allreduce.finish();
    const float rank_sum = static_cast<float>(ranks * (ranks + 1) / 2);
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(gradients[i], static_cast<float>(i % 97) * rank_sum + static_cast<float>(repeat * ranks))
          << "element " << i << " repeat " << repeat;
  }
}

INSTANTIATE_TEST_SUITE_P(BucketSizes, GradientAllreduceTest,
                         testing::Combine(testing::Values(4, 400, 4000, 1 << 20),
                                          testing::Values(MpiAllreduce::rank_order, MpiAllreduce::library)));

// Rank r's values: random, over several orders of magnitude, so that sums in different orders differ in their bits.
std::vector<float> random_values(int rank, std::int64_t count, unsigned seed) {
  std::mt19937 generator(seed * 1000u + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values) value = std::ldexp(mantissa(generator), exponent(generator));
  return values;
}

// What every rank must hold: each element summed in rank order, ((x_0 + x_1) + x_2) + ..., in float.
std::vector<float> rank_order_sums(int ranks, std::int64_t count, unsigned seed) {
  std::vector<float> sums = random_values(0, count, seed);
  for (int rank = 1; rank < ranks; ++rank) {
    const std::vector<float> values = random_values(rank, count, seed);
    for (std::int64_t i = 0; i < count; ++i) sums[i] += values[i];
  }
  return sums;
}

// Pieces: the default (256 KiB), and small ones, so that slices span many pieces and end in a short one.
class RankOrderAllreducePieces : public testing::TestWithParam<std::int64_t> {};

TEST_P(RankOrderAllreducePieces, EveryRankHoldsTheRankOrderSumsOfEveryElement) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  // Sizes below the rank count (empty slices), not divisible by it, and large enough for rendezvous messages.
  for (const std::int64_t count :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, std::int64_t{1001}, std::int64_t{300'007}}) {
    const auto seed = static_cast<unsigned>(count % 1000 + 1);
    std::vector<float> data = random_values(rank, count, seed);
    RankOrderAllreduce allreduce(MPI_COMM_WORLD, 10, GetParam());
    for (int repeat = 0; repeat < 2; ++repeat) {  // the same object twice: no state left from the first
      if (repeat == 1) data = random_values(rank, count, seed);
      allreduce.start(data.data(), count);
      allreduce.wait();
      EXPECT_FALSE(allreduce.active());
      const std::vector<float> expected = rank_order_sums(ranks, count, seed);
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(data[i], expected[i]) << "element " << i << " of " << count << " repeat " << repeat;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PieceSizes, RankOrderAllreducePieces,
                         testing::Values(RankOrderAllreduce::default_piece_elements, 1000, 4099));

TEST(RankOrderAllreduce, ExchangesInFlightTogetherAdvanceInAnyOrder) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::int64_t count = 50'000;
  std::vector<float> first = random_values(rank, count, 7), second = random_values(rank, count, 8);
  RankOrderAllreduce a(MPI_COMM_WORLD, 20, 3000), b(MPI_COMM_WORLD, 22);  // a: many pieces
  a.start(first.data(), count);
  b.start(second.data(), count);
  // Rank 0 tests the second exchange until it ends, then the first; the others test both in turn.
  if (rank == 0) {
    b.wait();
    a.wait();
  } else {
    bool a_done = false, b_done = false;
    while (!a_done || !b_done) {
      a_done = a.test() || a_done;
      b_done = b.test() || b_done;
    }
  }
  EXPECT_EQ(first, rank_order_sums(ranks, count, 7));
  EXPECT_EQ(second, rank_order_sums(ranks, count, 8));
}

TEST(RankSlice, TilesTheCountInSlicesThatDifferByOneAtMost) {
  for (const int ranks : {1, 2, 3, 4, 7})
    for (const std::int64_t count : {0, 1, 5, 6, 1000}) {
      std::int64_t end = 0;
      for (int rank = 0; rank < ranks; ++rank) {
        const auto [first, last] = rank_slice(count, ranks, rank);
        EXPECT_EQ(first, end) << count << " over " << ranks;
        EXPECT_GE(last - first, count / ranks);
        EXPECT_LE(last - first, (count + ranks - 1) / ranks);
        end = last;
      }
      EXPECT_EQ(end, count);
    }
}

TEST(RankSlice, WithAGranuleTilesTheCountInWholeGranulesButTheLast) {
  for (const int ranks : {1, 2, 3, 4, 7})
    for (const std::int64_t count : {0, 1, 64, 65, 1000, 4096 * 5 + 3}) {
      std::int64_t end = 0;
      const std::int64_t granule = 64, granules = (count + granule - 1) / granule;
      for (int rank = 0; rank < ranks; ++rank) {
        const auto [first, last] = rank_slice(count, ranks, rank, granule);
        EXPECT_EQ(first, end) << count << " over " << ranks;
        EXPECT_EQ(first % granule, 0);
        EXPECT_TRUE(last % granule == 0 || last == count) << last;
        EXPECT_LE(last - first, (granules + ranks - 1) / ranks * granule);
        end = last;
      }
      EXPECT_EQ(end, count);
    }
}

TEST(RankOrderAllreduce, SumInOrderWritesOverAnyOfItsSources) {
  const std::int64_t count = 2500;  // over two staging blocks
  for (const std::size_t sources : {std::size_t{2}, std::size_t{3}, std::size_t{5}})
    for (std::size_t out = 0; out < sources; ++out) {
      std::vector<std::vector<float>> values;
      for (std::size_t k = 0; k < sources; ++k) values.push_back(random_values(static_cast<int>(k), count, 3));
      std::vector<float> expected = values[0];
      for (std::size_t k = 1; k < sources; ++k)
        for (std::int64_t i = 0; i < count; ++i) expected[i] += values[k][i];
      std::vector<const float*> pointers;
      for (const auto& v : values) pointers.push_back(v.data());
      sum_in_order(values[out].data(), pointers, count);
      EXPECT_EQ(values[out], expected) << sources << " sources, written over source " << out;
    }
}

// Both algorithms through the gradient buckets: rank order gives the reference bits; on 2 ranks the library's
// all-reduce gives the same bits (a + b == b + a), so switching algorithms changes no 2-rank result.
TEST(GradientAllreduceAlgorithms, RankOrderBitsAndTheLibrarysOnTwoRanks) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::vector<std::int64_t> layer_begins{0, 20'000, 70'000};
  const std::int64_t count = 70'500;
  std::vector<float> rank_ordered = random_values(rank, count, 5), library = rank_ordered;
  for (auto* values : {&rank_ordered, &library}) {
    GradientAllreduce allreduce(MPI_COMM_WORLD, values->data(), count, layer_begins, 30'000 * 4,
                                {.algorithm = values == &library ? MpiAllreduce::library : MpiAllreduce::rank_order});
    allreduce.begin_step();
    for (auto it = layer_begins.rbegin(); it != layer_begins.rend(); ++it) allreduce.ready_from(*it);
    allreduce.finish();
  }
  EXPECT_EQ(rank_ordered, rank_order_sums(ranks, count, 5));
  if (ranks <= 2) EXPECT_EQ(library, rank_ordered);
}

// The progress thread tests the buckets in flight while the step's thread makes no MPI call (as during a product),
// and the sums are those of the default mode. Needs MPI_THREAD_SERIALIZED (the test's main asks for it).
TEST(GradientAllreduceProgress, ThreadTestsBucketsInFlightAndSumsAsTheDefault) {
  int rank = 0, ranks = 1, provided = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) GTEST_SKIP() << "MPI provides no MPI_THREAD_SERIALIZED";
  const std::vector<std::int64_t> layer_begins{0, 3000, 9000};
  const std::int64_t count = 12000;
  std::vector<float> expected(count), gradients(count);
  const auto fill = [&](std::vector<float>& values) {
    for (std::int64_t i = 0; i < count; ++i)
      values[i] = static_cast<float>(i % 31) * 0.25f * static_cast<float>(rank + 1);
  };
  {
    fill(expected);
    GradientAllreduce calls(MPI_COMM_WORLD, expected.data(), count, layer_begins, 4000 * 4);
    calls.begin_step();
    for (auto it = layer_begins.rbegin(); it != layer_begins.rend(); ++it) calls.ready_from(*it);
    calls.finish();
    EXPECT_EQ(calls.progress_tests(), 0);
  }
  fill(gradients);
  GradientAllreduce threaded(MPI_COMM_WORLD, gradients.data(), count, layer_begins, 4000 * 4,
                             {.mode = MpiProgress::thread, .interval = std::chrono::microseconds(50)});
  threaded.begin_step();
  threaded.ready_from(9000);
  threaded.ready_from(3000);  // the first bucket, [3000, 12000), starts
  if (ranks > 1) {            // no MPI call from this thread now: only the progress thread can test the first bucket
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (threaded.progress_tests() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_GT(threaded.progress_tests(), 0);
  }
  threaded.ready_from(0);
  threaded.finish();
  EXPECT_EQ(gradients, expected);
}

TEST(GradientAllreduceProgress, BucketSizeIsAQuarterOfTheGradientsBetween1And25MiB) {
  EXPECT_EQ(mpi_bucket_bytes(1000), std::int64_t{1} << 20);
  EXPECT_EQ(mpi_bucket_bytes(6'316'042), 6'316'042);  // the benchmark MLP: a quarter of its 25 MB
  EXPECT_EQ(mpi_bucket_bytes(124'000'000), std::int64_t{25} << 20);
}

TEST(GradientBuckets, TileTheBufferFromItsEndAlongLayerBoundaries) {
  const auto buckets = gradient_buckets(5200, {0, 100, 1100, 1150, 5150}, 4 * 1000);
  ASSERT_FALSE(buckets.empty());
  EXPECT_EQ(buckets.front().end, 5200);
  EXPECT_EQ(buckets.back().begin, 0);
  for (std::size_t i = 1; i < buckets.size(); ++i) EXPECT_EQ(buckets[i].end, buckets[i - 1].begin);
}

TEST(GradientBuckets, AlignedToAGranuleStillTileTheBuffer) {
  const std::int64_t granule = 1024;
  const auto buckets = gradient_buckets(9000, {0, 100, 1030, 2000, 2040, 5150, 8999}, 4 * 900);
  const auto aligned = granule_aligned(buckets, granule);
  ASSERT_FALSE(aligned.empty());
  EXPECT_EQ(aligned.front().end, 9000);
  EXPECT_EQ(aligned.back().begin, 0);
  for (std::size_t i = 0; i < aligned.size(); ++i) {
    EXPECT_LT(aligned[i].begin, aligned[i].end);
    EXPECT_EQ(aligned[i].begin % granule, 0) << aligned[i].begin;
    if (i > 0) EXPECT_EQ(aligned[i].end, aligned[i - 1].begin);
    // Each begin is the first multiple at or above a bucket's begin: it starts no later than that bucket did.
    bool found = false;
    for (const GradientBucket& bucket : buckets)
      found = found || (bucket.begin <= aligned[i].begin && aligned[i].begin < bucket.begin + granule);
    EXPECT_TRUE(found) << aligned[i].begin;
  }
  EXPECT_EQ(aligned.size(), buckets.size() - 1) << "the bucket at 1030 rounds up to 2048, where the next begins";
  // The buffer's last bucket left empty: the next one takes its elements.
  const auto top = granule_aligned(gradient_buckets(300, {0, 100}, 4), granule);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].begin, 0);
  EXPECT_EQ(top[0].end, 300);
}

// The sharded optimizer's exchange: every rank owns whole chunks of the gradient norm, the ranks together own every
// element once, and after finish() a rank holds the rank-order sums of its own elements; gather_owned then gives
// every rank every owner's values (4- and 2-byte elements), and add_over_ranks sums doubles over the ranks.
TEST(ShardedGradientAllreduce, OwnsWholeChunksSumsThemAndGathersEveryOwnersValues) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::int64_t chunk = Backend::gradient_statistics_chunk, count = 9 * chunk + 77;
  const std::vector<std::int64_t> layer_begins{0, 1000, 3 * chunk + 5, 5 * chunk - 3, 9 * chunk};
  std::vector<float> gradients = random_values(rank, count, 9);
  GradientAllreduce allreduce(MPI_COMM_WORLD, gradients.data(), count, layer_begins, 2 * chunk * 4,
                              {.optimizer = MpiOptimizer::sharded});
  const auto owned = allreduce.owned();
  if (ranks == 1) {
    EXPECT_FALSE(allreduce.sharded()) << "one rank updates everything: nothing to shard";
    return;
  }
  EXPECT_TRUE(allreduce.sharded());
  EXPECT_GE(allreduce.bucket_count(), 3u);
  std::vector<int> owners(count, 0);
  for (const ElementRange& range : owned) {
    EXPECT_EQ(range.begin % chunk, 0) << range.begin;
    EXPECT_TRUE(range.end % chunk == 0 || range.end == count) << range.end;
    for (std::int64_t i = range.begin; i < range.end; ++i) ++owners[i];
  }
  MPI_Allreduce(MPI_IN_PLACE, owners.data(), static_cast<int>(count), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), count) << "elements with one owner";

  for (int repeat = 0; repeat < 2; ++repeat) {
    if (repeat == 1) {  // in place: the exchange holds the buffer's address
      const std::vector<float> fresh = random_values(rank, count, 9);
      std::copy(fresh.begin(), fresh.end(), gradients.begin());
    }
    allreduce.begin_step();
    for (auto it = layer_begins.rbegin(); it != layer_begins.rend(); ++it) allreduce.ready_from(*it);
    allreduce.finish();
    const std::vector<float> expected = rank_order_sums(ranks, count, 9);
    std::int64_t wrong = 0;  // counted, not asserted: every rank must go on to the collective calls below
    for (const ElementRange& range : owned)
      for (std::int64_t i = range.begin; i < range.end; ++i) wrong += gradients[i] != expected[i] ? 1 : 0;
    EXPECT_EQ(wrong, 0) << "owned elements without their rank-order sums, repeat " << repeat;
  }

  // Each owner writes its elements (a value that names the element), the rest is poison; after the gather every
  // rank holds every element's value.
  std::vector<float> values(count, std::nanf(""));
  std::vector<std::uint16_t> halves(count, 0);
  for (const ElementRange& range : owned)
    for (std::int64_t i = range.begin; i < range.end; ++i) {
      values[i] = static_cast<float>(i) * 0.5f;
      halves[i] = static_cast<std::uint16_t>(i % 65000 + 1);
    }
  allreduce.gather_owned(values.data(), sizeof(float));
  allreduce.gather_owned(halves.data(), sizeof(std::uint16_t));
  std::int64_t wrong_values = 0, wrong_halves = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    wrong_values += values[i] != static_cast<float>(i) * 0.5f ? 1 : 0;
    wrong_halves += halves[i] != i % 65000 + 1 ? 1 : 0;
  }
  EXPECT_EQ(wrong_values, 0) << "4-byte elements without their owner's value";
  EXPECT_EQ(wrong_halves, 0) << "2-byte elements without their owner's value";
  std::vector<double> partials{static_cast<double>(rank + 1), rank == 0 ? 0.25 : 0.0};
  allreduce.add_over_ranks(partials);
  EXPECT_EQ(partials[0], ranks * (ranks + 1) / 2.0);
  EXPECT_EQ(partials[1], 0.25);
}

// Fewer chunks than ranks: the ranks without one own nothing, yet they take part in the sharded exchange's gathers
// (every rank must make the same collective calls).
TEST(ShardedGradientAllreduce, RanksThatOwnNothingStillGather) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::int64_t count = 300;  // one chunk: the last rank owns it
  std::vector<float> gradients(count, static_cast<float>(rank + 1));
  GradientAllreduce allreduce(MPI_COMM_WORLD, gradients.data(), count, {0, 100}, 4,
                              {.optimizer = MpiOptimizer::sharded});
  EXPECT_EQ(allreduce.sharded(), ranks > 1);
  if (ranks == 1) return;
  const bool last = rank == ranks - 1;
  EXPECT_EQ(allreduce.owned().size(), last ? 1u : 0u);
  allreduce.begin_step();
  allreduce.ready_from(100);
  allreduce.ready_from(0);
  allreduce.finish();
  const float sum = ranks * (ranks + 1) / 2.0f;
  if (last) {
    EXPECT_EQ(std::count(gradients.begin(), gradients.end(), sum), count) << "elements summed";
  } else {
    std::fill(gradients.begin(), gradients.end(), std::nanf(""));
  }
  allreduce.gather_owned(gradients.data(), sizeof(float));
  EXPECT_EQ(std::count(gradients.begin(), gradients.end(), sum), count) << "elements gathered";
}

TEST(StagedGradientAllreduce, SumsEveryElementOnceOnTheCpuBackend) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  auto backend = make_cpu_backend();
  const std::int64_t count = 3001;
  auto* gradients = static_cast<float*>(backend->allocate(count * sizeof(float)));
  StagedGradientAllreduce allreduce(MPI_COMM_WORLD, *backend, gradients, count);
  for (std::int64_t i = 0; i < count; ++i) gradients[i] = static_cast<float>((i % 89) * (rank + 1));
  allreduce.begin_step();
  allreduce.ready_from(0);
  allreduce.finish();
  const float rank_sum = static_cast<float>(ranks * (ranks + 1) / 2);
  for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(gradients[i], static_cast<float>(i % 89) * rank_sum) << i;
  backend->deallocate(gradients);
}

}  // namespace
}  // namespace hpctrain
