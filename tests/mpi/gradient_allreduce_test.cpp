// The bucketed gradient all-reduce sums every element exactly once over the ranks, whatever the bucket size and the
// order in which backward reports layers (values chosen so float sums are exact); so does the all-reduce staged
// through host memory (used by CUDA ranks sharing a GPU), run here on the CPU backend; buckets tile the buffer.
#include "hpctrain/dist/gradient_allreduce.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <thread>
#include <vector>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {
namespace {

class GradientAllreduceTest : public testing::TestWithParam<std::int64_t> {};

TEST_P(GradientAllreduceTest, SumsEveryElementOnce) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::vector<std::int64_t> layer_begins{0, 0, 100, 100, 1100, 1150, 5150};
  const std::int64_t count = 5200;
  std::vector<float> gradients(count);
  GradientAllreduce allreduce(MPI_COMM_WORLD, gradients.data(), count, layer_begins, GetParam());
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

INSTANTIATE_TEST_SUITE_P(BucketSizes, GradientAllreduceTest, testing::Values(4, 400, 4000, 1 << 20));

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
                             {MpiProgress::thread, std::chrono::microseconds(50)});
  threaded.begin_step();
  threaded.ready_from(9000);
  threaded.ready_from(3000);  // the first bucket, [3000, 12000), starts
  if (ranks > 1) {  // no MPI call from this thread now: only the progress thread can test the first bucket
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
