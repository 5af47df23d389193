// The device gradient all-reduce on 1 and 2 ranks: NCCL when every rank has a GPU of its own, MPI through host memory
// when ranks share a GPU (NCCL refuses that); and NCCL inside a captured graph with the trainer's teardown order.
// Values are small integers, so the sums are exact (nccl-tests' verifiable inputs): every element must equal its
// expected sum exactly, whatever the bucket size. Skips (77) without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/train/backend_choice.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

struct World {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
  }
};

class DeviceAllreduce : public testing::TestWithParam<std::int64_t> {
 protected:
  void SetUp() override {
    // Every rank must agree to skip, or the others would wait in a collective.
    int visible = cuda_device_count(), fewest = 0;
    MPI_Allreduce(&visible, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (fewest == 0) GTEST_SKIP() << "no CUDA device";
    backend = make_cuda_backend(world.local_rank % visible);
    // As the trainer decides (train/backend_choice.cpp): by the UUIDs of the node's ranks' devices.
    const DeviceUuid mine = backend->device_uuid();
    std::vector<DeviceUuid> node(static_cast<std::size_t>(world.local_size));
    MPI_Comm node_communicator = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &node_communicator);
    MPI_Allgather(mine.data(), 16, MPI_UNSIGNED_CHAR, node.data(), 16, MPI_UNSIGNED_CHAR, node_communicator);
    MPI_Comm_free(&node_communicator);
    int shared_here = ranks_share_a_device(node) ? 1 : 0;
    MPI_Allreduce(&shared_here, &shared, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  World world;
  std::unique_ptr<Backend> backend;
  int shared = 0;
};

TEST_P(DeviceAllreduce, SumsEveryElementExactlyOnce) {
  const std::int64_t count = 100000;
  const std::vector<std::int64_t> layer_begins = {0, 1000, 1001, 40000, 99999};
  std::vector<float> values(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    values[static_cast<std::size_t>(i)] = static_cast<float>((world.rank + 1) * (i % 13 + 1));
  test_support::TestArray<float> gradients(*backend, values);
  std::unique_ptr<GradientExchange> exchange;
  if (shared)
    exchange = std::make_unique<StagedGradientAllreduce>(MPI_COMM_WORLD, *backend, gradients.data(), count);
  else
    exchange =
        make_nccl_gradient_allreduce(MPI_COMM_WORLD, *backend, gradients.data(), count, layer_begins, GetParam());
  for (int step = 0; step < 2; ++step) {  // twice: events and buckets are reused
    gradients.set(values);
    exchange->begin_step();
    for (auto it = layer_begins.rbegin(); it != layer_begins.rend(); ++it) exchange->ready_from(*it);
    exchange->finish();
    const auto result = gradients.get();
    const double rank_sum = world.size * (world.size + 1) / 2.0;
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < count; ++i)
      if (result[static_cast<std::size_t>(i)] != static_cast<float>(rank_sum * static_cast<double>(i % 13 + 1)))
        ++wrong;
    EXPECT_EQ(wrong, 0) << "step " << step << (shared ? " (staged through the host)" : " (NCCL)");
  }
}

// The all-reduce captured into a CUDA graph with the step and replayed (run.cuda_graphs), then torn down in the order
// the trainer uses: graphs first, then the communicator (NCCL 2.28's ncclCommDestroy waits for graphs that use it, so
// the other order hangs here, which the gpu-check timeout turns into a failure).
TEST_P(DeviceAllreduce, CapturedInAGraphAndReleasedInOrder) {
  if (shared) GTEST_SKIP() << "ranks share a GPU: gradients go through host memory, which is not captured";
  const std::int64_t count = 50000;
  const std::vector<std::int64_t> layer_begins = {0, 20000, 49999};
  std::vector<float> values(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) values[static_cast<std::size_t>(i)] = static_cast<float>(world.rank + 1);
  test_support::TestArray<float> gradients(*backend, values);
  auto exchange =
      make_nccl_gradient_allreduce(MPI_COMM_WORLD, *backend, gradients.data(), count, layer_begins, GetParam());
  backend->begin_capture(CaptureSlot::step);
  exchange->begin_step();
  for (auto it = layer_begins.rbegin(); it != layer_begins.rend(); ++it) exchange->ready_from(*it);
  exchange->finish();
  backend->end_capture(CaptureSlot::step);
  const double rank_sum = world.size * (world.size + 1) / 2.0;
  for (int replay = 0; replay < 3; ++replay) {
    gradients.set(values);
    backend->replay_capture(CaptureSlot::step);
    const auto result = gradients.get();  // a polling wait: NCCL's errors are checked meanwhile
    std::int64_t wrong = 0;
    for (float value : result) wrong += value != static_cast<float>(rank_sum);
    EXPECT_EQ(wrong, 0) << "replay " << replay;
  }
  backend->release_graphs();
  exchange->release();
  exchange.reset();
}

INSTANTIATE_TEST_SUITE_P(BucketSizes, DeviceAllreduce, testing::Values(4, 4000, 1 << 20));

}  // namespace
}  // namespace hpctrain
