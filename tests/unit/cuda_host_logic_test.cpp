// The host-side decisions of the CUDA backend and the NCCL exchange, checked on every machine (they need no GPU):
// grow-only scratch that retires instead of freeing (a captured graph may still point at it), the polling host wait
// that lets NCCL errors through, cuDNN's algorithm choice under a workspace cap, the shape-only reduction plans,
// the 32-bit division by a fixed divisor the kernels use, the communicator's teardown rule, and the shared-GPU
// decision by device UUID, which activation the linear products fold in (and the aux they leave), and the
// convolutions' formats (channels-last for 16-bit models, descriptor strides, the fused bias's algorithm), and which
// attention kernel runs (HPCTRAIN_CUDA_ATTENTION, what the tensor-core kernels cover) with their grids and tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda/algorithm_choice.hpp"
#include "hpctrain/kernels/cuda/attention_plan.hpp"
#include "hpctrain/kernels/cuda/convolution_layout.hpp"
#include "hpctrain/kernels/cuda/host_wait.hpp"
#include "hpctrain/kernels/cuda/launch_plan.hpp"
#include "hpctrain/kernels/cuda/linear_epilogue.hpp"
#include "hpctrain/kernels/cuda/retiring_buffer.hpp"
#include "hpctrain/kernels/math.hpp"
#include "hpctrain/train/backend_choice.hpp"

namespace hpctrain {
namespace {

// ---- item 2: scratch that grows after a capture must not free what the graph points at ----

// Counts allocations and releases; releasing an unknown or already released block is a test failure.
struct Ledger {
  std::map<void*, std::size_t> live;
  std::vector<void*> released;
  int allocations = 0;
};
struct CountingAllocator {
  Ledger* ledger;
  void* allocate(std::size_t bytes) {
    ++ledger->allocations;
    void* block = ::operator new(bytes);
    ledger->live[block] = bytes;
    return block;
  }
  void release(void* block) noexcept {
    EXPECT_EQ(ledger->live.count(block), 1u) << "released a block twice or never allocated";
    ledger->live.erase(block);
    ledger->released.push_back(block);
    ::operator delete(block);
  }
};

TEST(RetiringBuffer, GrowingKeepsEveryEarlierBlockAliveUntilDestruction) {
  Ledger ledger;
  {
    cuda::RetiringBuffer<CountingAllocator> buffer(CountingAllocator{&ledger});
    void* captured = buffer.reserve(1000);  // what a graph captured
    EXPECT_EQ(buffer.capacity() % 256, 0u);
    EXPECT_EQ(buffer.reserve(1000), captured);  // fits: the same block
    EXPECT_EQ(buffer.reserve(10), captured);    // smaller: never shrinks
    void* grown = buffer.reserve(70000 * 16);   // evaluation with more rows after the capture
    EXPECT_NE(grown, captured);
    EXPECT_TRUE(ledger.released.empty()) << "the captured block was freed while a graph may still use it";
    EXPECT_EQ(ledger.live.count(captured), 1u);
    EXPECT_EQ(buffer.retired_blocks(), 1u);
    EXPECT_EQ(ledger.allocations, 2);
  }
  EXPECT_TRUE(ledger.live.empty()) << "destruction frees current and retired blocks";
  EXPECT_EQ(ledger.released.size(), 2u);
}

TEST(RetiringBuffer, AFailedGrowthLeavesTheCurrentBlock) {
  struct Failing {
    Ledger* ledger;
    void* allocate(std::size_t bytes) {
      if (bytes > 4096) throw std::runtime_error("out of memory");
      return CountingAllocator{ledger}.allocate(bytes);
    }
    void release(void* block) noexcept { CountingAllocator{ledger}.release(block); }
  };
  Ledger ledger;
  cuda::RetiringBuffer<Failing> buffer(Failing{&ledger});
  void* first = buffer.reserve(100);
  EXPECT_THROW(buffer.reserve(1 << 20), std::runtime_error);
  EXPECT_EQ(buffer.data(), first);
  EXPECT_EQ(buffer.capacity(), 256u);
}

// ---- items 3 and 8: host waits poll, calling the NCCL error check in between ----

TEST(HostWait, CallsTheMonitorWhileWaitingAndStopsWhenDone) {
  int queries = 0, checks = 0;
  cuda::wait_polling([&] { return ++queries == 5; }, [&] { ++checks; });
  EXPECT_EQ(queries, 5);
  EXPECT_EQ(checks, 4);  // between queries, not after the last
}

TEST(HostWait, AMonitorErrorEndsAWaitThatWouldNeverFinish) {
  int checks = 0;
  // A lost peer: the device work never completes; the monitor (NCCL's asynchronous error) ends the wait.
  EXPECT_THROW(cuda::wait_polling([] { return false; },
                                  [&] {
                                    if (++checks == 3) throw std::runtime_error("ncclRemoteError");
                                  }),
               std::runtime_error);
  EXPECT_EQ(checks, 3);
}

TEST(HostWait, BacksOffFromYieldingToShortSleeps) {
  EXPECT_EQ(cuda::wait_pause(0).count(), 0);
  EXPECT_GT(cuda::wait_pause(100).count(), 0);
  EXPECT_LE(cuda::wait_pause(1000000).count(), 1000);  // never longer than a millisecond
}

// ---- item 6: cuDNN algorithm choice under a workspace cap ----

TEST(ConvolutionAlgorithm, DeterministicWithinTheCapComesFirst) {
  const std::size_t cap = std::size_t{256} << 20;
  const std::vector<cuda::AlgorithmCandidate> results = {
      {1, true, true, false, 1 << 20},              // fastest, not deterministic
      {0, true, true, true, std::size_t{4} << 30},  // deterministic, wants 4 GiB
      {6, true, false, true, 0},                    // deterministic, imprecise math
      {2, true, true, true, 64 << 20},              // deterministic, fits
  };
  const auto choice = cuda::choose_algorithm(results, cap);
  EXPECT_EQ(choice.index, 3);
  EXPECT_TRUE(choice.deterministic);
}

TEST(ConvolutionAlgorithm, FallsBackToNonDeterministicAndSaysWhy) {
  const std::vector<cuda::AlgorithmCandidate> results = {
      {0, true, true, true, std::size_t{3} << 30},  // the only deterministic one: over the cap
      {1, false, true, true, 0},                    // failed status
      {5, true, true, false, 8 << 20},
  };
  const auto choice = cuda::choose_algorithm(results, std::size_t{512} << 20);
  EXPECT_EQ(choice.index, 2);
  EXPECT_FALSE(choice.deterministic);
  EXPECT_TRUE(choice.deterministic_over_cap);
  EXPECT_EQ(cuda::choose_algorithm({{0, true, false, true, 0}}, 1 << 30).index, -1);  // nothing precise
}

TEST(ConvolutionAlgorithm, WorkspaceCapFollowsFreeMemoryWithinBounds) {
  EXPECT_EQ(cuda::convolution_workspace_cap(0), std::size_t{64} << 20);
  EXPECT_EQ(cuda::convolution_workspace_cap(std::size_t{4} << 30), std::size_t{512} << 20);
  EXPECT_EQ(cuda::convolution_workspace_cap(std::size_t{140} << 30), std::size_t{1} << 30);
}

// ---- item 9: shape-only plans of the two-pass reductions ----

TEST(ReductionPlans, ColumnSumsCoverEveryRowOnceWithEnoughBlocks) {
  for (const auto [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {64, 3}, {256, 4096}, {70000, 10}, {70000, 4096}, {1 << 22, 7}}) {
    const cuda::ColumnSumPlan plan = cuda::plan_column_sums(rows, cols);
    EXPECT_EQ(plan.column_tiles, (cols + 31) / 32);
    EXPECT_GE(plan.row_chunks * plan.rows_per_chunk, rows) << rows << "x" << cols;
    EXPECT_LT((plan.row_chunks - 1) * plan.rows_per_chunk, rows) << "an empty chunk";
    EXPECT_LE(plan.row_chunks, cuda::max_row_chunks);
    EXPECT_EQ(plan.rows_per_chunk % 8, 0);
  }
  // A narrow layer's bias gradient over a large batch: many blocks, not one per 32 columns.
  const auto narrow = cuda::plan_column_sums(70000, 10);
  EXPECT_GE(narrow.column_tiles * narrow.row_chunks, 500);
  EXPECT_FALSE(cuda::plan_column_sums(100, 4096).two_pass());
}

TEST(ReductionPlans, SegmentsAreCutSoFewLongOnesFillTheGpu) {
  for (const auto [segments, length] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {32, 4 * 128 * 128 * 128}, {8192, 4096}, {4, 70000}, {100000, 64}, {3, 1025}}) {
    const cuda::SegmentPlan plan = cuda::plan_segments(segments, length);
    EXPECT_GE(plan.chunks * plan.chunk_length, length);
    EXPECT_LT((plan.chunks - 1) * plan.chunk_length, length) << "an empty chunk";
    EXPECT_LE(plan.chunks, cuda::max_segment_chunks);
    EXPECT_GE(plan.chunk_length, std::min<std::int64_t>(length, cuda::min_chunk_length));
  }
  // CosmoFlow's groupnorm: 4 samples x 8 groups of 8 channels x 128^3 used to be 32 blocks.
  const auto groups = cuda::plan_segments(32, 8 * 128 * 128 * 128);
  EXPECT_GE(32 * groups.chunks, 1024);
  EXPECT_FALSE(cuda::layernorm_uses_segments(8192, 256));  // many short rows: a warp each
  EXPECT_TRUE(cuda::layernorm_uses_segments(8, 70000));    // few long rows: chunks
  EXPECT_TRUE(cuda::fits_32bit_indexing((std::int64_t{1} << 31) - 1));
  EXPECT_FALSE(cuda::fits_32bit_indexing(std::int64_t{1} << 31));
}

// ---- item 13: the kernels' division by a fixed divisor is exact ----

TEST(FastDivisor, EqualsIntegerDivisionForEveryNumeratorBelowTwoToThe31) {
  std::mt19937 random(7);
  std::vector<std::uint32_t> divisors = {1,   2,    3,    5,     7,     10,       16,          27,         64,
                                         125, 1000, 4096, 65535, 65536, 1u << 20, 2147483647u, 2147483648u};
  for (int i = 0; i < 200; ++i) divisors.push_back(1u + random() % 1000000u);
  for (const std::uint32_t d : divisors) {
    const kernel_math::FastDivisor divisor(d);
    std::vector<std::uint32_t> numerators = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2147483647u, 2147483646u};
    for (int i = 0; i < 2000; ++i) numerators.push_back(static_cast<std::uint32_t>(random()) & 0x7fffffffu);
    for (const std::uint32_t n : numerators) {
      if (n > 2147483647u) continue;
      const std::uint32_t q = divisor.quotient(n);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(divisor.remainder(n, q), n % d) << n << " % " << d;
    }
  }
}

// ---- item 1: how the NCCL communicator ends ----

TEST(CommunicatorEnd, GraphsFirstAndNoAbortUnderALiveGraph) {
  EXPECT_EQ(communicator_end(false, false), CommunicatorEnd::destroy);
  EXPECT_EQ(communicator_end(false, true), CommunicatorEnd::abort);
  // A live graph holds NCCL operations of the communicator: destroying or aborting it would wait for the graph.
  EXPECT_EQ(communicator_end(true, true), CommunicatorEnd::leave);
  EXPECT_EQ(communicator_end(true, false), CommunicatorEnd::leave);
}

// ---- item 4: ranks share a GPU only when their devices' UUIDs say so ----

DeviceUuid uuid(unsigned char tag) {
  DeviceUuid id{};
  id.fill(0x5a);
  id[15] = tag;
  return id;
}

// ---- item 9: which activation goes into the products' epilogues, and what the forward leaves for the backward ----
TEST(LinearEpilogue, ReluAndTanhGeluAreFoldedAndTheExactGeluIsNot) {
  using cuda::LinearEpilogue;
  EXPECT_TRUE(cuda::folds_activation(Activation::relu));
  EXPECT_TRUE(cuda::folds_activation(Activation::gelu_tanh));
  for (Activation kind : {Activation::gelu, Activation::tanh, Activation::leaky_relu}) {
    EXPECT_FALSE(cuda::folds_activation(kind)) << static_cast<int>(kind);
    for (bool bias : {true, false})
      for (std::int64_t width : {1, 8, 256, 1000})
        EXPECT_EQ(cuda::linear_epilogue(kind, bias, width, 2).epilogue, LinearEpilogue::none) << static_cast<int>(kind);
  }
  // relu: the mask when a row of bits (a multiple of 128) fits in a row of the pre-activation buffer.
  const auto wide = cuda::linear_epilogue(Activation::relu, true, 256, 2);
  EXPECT_EQ(wide.epilogue, LinearEpilogue::relu_aux_bias);
  EXPECT_EQ(wide.aux_ld, 256);
  EXPECT_EQ(wide.aux_bytes_per_row, 32u);
  const auto odd = cuda::linear_epilogue(Activation::relu, false, 129, 2);
  EXPECT_EQ(odd.epilogue, LinearEpilogue::relu_aux);
  EXPECT_EQ(odd.aux_ld, 256);  // cuBLASLt: divisible by 128, >= the rows of its output
  EXPECT_EQ(odd.aux_bytes_per_row, 32u);
  for (const auto& [width, bytes, masked] : std::vector<std::tuple<std::int64_t, std::size_t, bool>>{
           {8, 2, true}, {7, 2, false}, {4, 4, true}, {3, 4, false}, {1, 2, false}, {127, 2, true}}) {
    const auto choice = cuda::linear_epilogue(Activation::relu, true, width, bytes);
    EXPECT_EQ(choice.epilogue, masked ? LinearEpilogue::relu_aux_bias : LinearEpilogue::relu_bias) << width;
    EXPECT_LE(choice.aux_bytes_per_row, static_cast<std::size_t>(width) * bytes) << width;
    EXPECT_EQ(cuda::activation_gradient_epilogue(choice.epilogue),
              masked ? cuda::ActivationGradientEpilogue::drelu : cuda::ActivationGradientEpilogue::none);
  }
  // gelu(tanh): its input as aux, in the pre-activation's own layout, when the width is a multiple of 8.
  const auto gelu = cuda::linear_epilogue(Activation::gelu_tanh, true, 64, 2);
  EXPECT_EQ(gelu.epilogue, LinearEpilogue::gelu_aux_bias);
  EXPECT_EQ(gelu.aux_ld, 64);
  EXPECT_EQ(gelu.aux_bytes_per_row, 128u);
  EXPECT_EQ(cuda::activation_gradient_epilogue(gelu.epilogue), cuda::ActivationGradientEpilogue::dgelu);
  EXPECT_EQ(cuda::linear_epilogue(Activation::gelu_tanh, false, 64, 4).epilogue, LinearEpilogue::gelu_aux);
  EXPECT_EQ(cuda::linear_epilogue(Activation::gelu_tanh, true, 60, 4).epilogue, LinearEpilogue::none);
  EXPECT_EQ(cuda::linear_epilogue(Activation::relu, true, 0, 4).epilogue, LinearEpilogue::none);
  // Why relu may skip the mask: its backward may read the output instead of the pre-activation, bit for bit, NaN
  // and -0 included; GELU's derivative (and leaky_relu's with alpha <= 0) cannot be recovered from the output.
  for (float x : {-2.0f, -0.0f, 0.0f, 1e-30f, 3.0f, std::numeric_limits<float>::quiet_NaN()})
    EXPECT_EQ(kernel_math::relu_derivative(x), kernel_math::relu_derivative(kernel_math::relu(x))) << x;
  EXPECT_NE(kernel_math::gelu_derivative(-0.5), kernel_math::gelu_derivative(kernel_math::gelu(-0.5)));
}

TEST(SharedDevice, DecidedByUuidsNotByCounting) {
  // --gpus-per-task=1: four ranks, each sees one device (index 0) but a different GPU. `local ranks > visible
  // devices` (4 > 1) called this shared and sent the run through host memory.
  EXPECT_FALSE(ranks_share_a_device({uuid(1), uuid(2), uuid(3), uuid(4)}));
  // --gpus-per-node=4: each rank sees all four and takes local rank mod 4.
  EXPECT_FALSE(ranks_share_a_device({uuid(1), uuid(2), uuid(3), uuid(4)}));
  // Eight ranks on four GPUs, or two ranks given the same device.
  EXPECT_TRUE(ranks_share_a_device({uuid(1), uuid(2), uuid(3), uuid(4), uuid(1), uuid(2), uuid(3), uuid(4)}));
  EXPECT_TRUE(ranks_share_a_device({uuid(9), uuid(9)}));
  EXPECT_FALSE(ranks_share_a_device({uuid(9)}));
  EXPECT_FALSE(ranks_share_a_device({}));
}

// ---- item 11: 16-bit convolutions channels-last, their descriptors, the fused bias's algorithm ----
TEST(ConvolutionLayout, SixteenBitModelsRunChannelsLastAndFp32KeepsChannelsFirst) {
  EXPECT_EQ(cuda::convolution_layout(DType::bf16), SpatialLayout::channels_last);
  EXPECT_EQ(cuda::convolution_layout(DType::f16), SpatialLayout::channels_last);
  EXPECT_EQ(cuda::convolution_layout(DType::f32), SpatialLayout::channels_first);
  EXPECT_TRUE(cuda::mixed_weight_gradient(DType::bf16));
  EXPECT_TRUE(cuda::mixed_weight_gradient(DType::f16));
  EXPECT_FALSE(cuda::mixed_weight_gradient(DType::f32));
}

// The strides name where element (n, c, d, h, w) lives: checked against the layouts' index formulas.
TEST(ConvolutionLayout, DescriptorStridesAddressBothLayouts) {
  const std::int64_t channels = 3;
  for (int dimensions : {2, 3}) {
    const std::array<std::int64_t, 3> spatial{4, 5, dimensions == 3 ? 6 : 1};
    const std::int64_t positions = spatial[0] * spatial[1] * spatial[2];
    for (SpatialLayout layout : {SpatialLayout::channels_first, SpatialLayout::channels_last}) {
      const auto strides = cuda::tensor_strides(layout, channels, spatial, dimensions);
      for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t c = 0; c < channels; ++c)
          for (std::int64_t p = 0; p < positions; ++p) {
            std::int64_t position[3] = {p / (spatial[1] * spatial[2]), p / spatial[2] % spatial[1], p % spatial[2]};
            if (dimensions == 2) position[0] = p / spatial[1], position[1] = p % spatial[1];
            std::int64_t offset = n * strides[0] + c * strides[1];
            for (int axis = 0; axis < dimensions; ++axis)
              offset += position[axis] * strides[static_cast<std::size_t>(2 + axis)];
            const std::int64_t want = layout == SpatialLayout::channels_first ? (n * channels + c) * positions + p
                                                                              : (n * positions + p) * channels + c;
            ASSERT_EQ(offset, want) << dimensions << "-D " << (layout == SpatialLayout::channels_last ? "NHWC" : "NCHW")
                                    << " n " << n << " c " << c << " p " << p;
          }
    }
  }
}

TEST(ConvolutionLayout, TheFusedBiasTakesItsAlgorithmOnlyWhenItIsUsable) {
  constexpr int precomp = 1, other = 6;  // made-up enum values
  const std::size_t cap = 64u << 20;
  const std::vector<cuda::AlgorithmCandidate> offered{{other, true, true, true, 0}, {precomp, true, true, true, 1024}};
  EXPECT_EQ(cuda::choose_algorithm(offered, cap).index, 0);
  EXPECT_EQ(cuda::choose_algorithm(offered, cap, precomp).index, 1);
  const std::vector<cuda::AlgorithmCandidate> too_big{{other, true, true, true, 0},
                                                      {precomp, true, true, true, cap + 1}};
  EXPECT_EQ(cuda::choose_algorithm(too_big, cap, precomp).index, -1);
  const std::vector<cuda::AlgorithmCandidate> absent{{other, true, true, true, 0}};
  EXPECT_EQ(cuda::choose_algorithm(absent, cap, precomp).index, -1);
  // The preference gives up nothing: not determinism.
  const auto taken = cuda::choose_algorithm_preferring(offered, cap, precomp);
  EXPECT_TRUE(taken.preferred_taken);
  EXPECT_EQ(taken.choice.index, 1);
  const std::vector<cuda::AlgorithmCandidate> racy{{other, true, true, true, 0}, {precomp, true, true, false, 0}};
  const auto kept = cuda::choose_algorithm_preferring(racy, cap, precomp);
  EXPECT_FALSE(kept.preferred_taken);
  EXPECT_EQ(kept.choice.index, 0);
  EXPECT_TRUE(kept.choice.deterministic);
  const std::vector<cuda::AlgorithmCandidate> all_racy{{other, true, true, false, 0}, {precomp, true, true, false, 0}};
  EXPECT_TRUE(cuda::choose_algorithm_preferring(all_racy, cap, precomp).preferred_taken);
  EXPECT_FALSE(cuda::choose_algorithm_preferring(too_big, cap, precomp).preferred_taken);
}

// ---- attention: the kernel choice and the tensor-core kernels' geometry ----

TEST(AttentionKernelChoice, TheVariableNamesTheKernelAndAnythingElseIsRefused) {
  EXPECT_EQ(cuda::parse_attention_kernel(nullptr), cuda::AttentionKernel::reference);
  EXPECT_EQ(cuda::parse_attention_kernel(""), cuda::AttentionKernel::reference);
  EXPECT_EQ(cuda::parse_attention_kernel("reference"), cuda::AttentionKernel::reference);
  EXPECT_EQ(cuda::parse_attention_kernel("tensor_core"), cuda::AttentionKernel::tensor_core);
  EXPECT_THROW(cuda::parse_attention_kernel("tensor-core"), InputError);
  EXPECT_THROW(cuda::parse_attention_kernel("TENSOR_CORE"), InputError);
  EXPECT_STREQ(cuda::attention_kernel_name(cuda::AttentionKernel::tensor_core), "tensor_core");
}

cuda::AttentionCall covered_call() {
  cuda::AttentionCall call;
  call.dtype = DType::bf16;
  call.head_dim = 64;
  call.batch = 16;
  call.heads = 12;
  call.sequence = 1024;
  call.compute_major = 9;
  return call;
}

TEST(AttentionKernelChoice, TensorCoresOnlyWhenAskedForAndCovered) {
  using cuda::AttentionKernel;
  const auto choose = [](const cuda::AttentionCall& call) {
    return cuda::choose_attention_kernel(AttentionKernel::tensor_core, call);
  };
  EXPECT_EQ(choose(covered_call()), AttentionKernel::tensor_core);
  EXPECT_EQ(cuda::choose_attention_kernel(AttentionKernel::reference, covered_call()), AttentionKernel::reference);
  for (DType dtype : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    auto call = covered_call();
    call.dtype = dtype;
    EXPECT_EQ(choose(call) == AttentionKernel::tensor_core, dtype == DType::bf16 || dtype == DType::f16);
  }
  for (std::int64_t head_dim : {8, 16, 32, 48, 64, 80, 96, 128, 256}) {
    auto call = covered_call();
    call.head_dim = head_dim;
    EXPECT_EQ(choose(call) == AttentionKernel::tensor_core, head_dim == 32 || head_dim == 64 || head_dim == 128)
        << head_dim;
  }
  auto call = covered_call();
  call.dropout = true;  // only the reference kernel has attention dropout
  EXPECT_EQ(choose(call), AttentionKernel::reference);
  call = covered_call();
  call.compute_major = 7;  // no bf16 mma.sync before Ampere
  EXPECT_EQ(choose(call), AttentionKernel::reference);
  call.compute_major = 8;
  EXPECT_EQ(choose(call), AttentionKernel::tensor_core);
  call.buffers_aligned = false;  // the 16-byte loads
  EXPECT_EQ(choose(call), AttentionKernel::reference);
  call = covered_call();
  call.sequence = std::int64_t{64} * 65535 + 1;  // 65536 query blocks: beyond gridDim.y
  EXPECT_EQ(choose(call), AttentionKernel::reference);
  call.sequence = 1;
  call.batch = 0;  // nothing to do: the reference kernel returns at once
  EXPECT_EQ(choose(call), AttentionKernel::reference);
}

// A geometry with attention dropout (AttentionGeometry::dropout) and one without the member.
struct DropoutSetting {
  float p = 0.0f;
  [[nodiscard]] bool active() const { return p > 0.0f; }
};
struct GeometryWithDropout {
  DropoutSetting dropout;
};
struct GeometryWithoutDropout {
  std::int64_t head_dim = 64;
};

TEST(AttentionKernelChoice, DropoutIsReadFromTheGeometryWhereItHasIt) {
  GeometryWithDropout with;
  EXPECT_FALSE(cuda::attention_dropout_active(with));
  with.dropout.p = 0.1f;
  EXPECT_TRUE(cuda::attention_dropout_active(with));
  EXPECT_FALSE(cuda::attention_dropout_active(GeometryWithoutDropout{}));
  EXPECT_FALSE(cuda::attention_dropout_active(AttentionGeometry{}));  // no dropout asked for, whichever it is
  AttentionGeometry dropped;  // AttentionGeometry has the member now: its dropout sends the call to the reference
  dropped.dropout.p = 0.1f;
  EXPECT_TRUE(cuda::attention_dropout_active(dropped));
}

TEST(TensorCoreAttentionPlan, GridsCoverEverySequencePositionOnce) {
  for (std::int64_t sequence : {1, 63, 64, 65, 257, 1024}) {
    const auto grid = cuda::tc_grid(3, 5, sequence);
    EXPECT_EQ(grid.x, 15);
    EXPECT_GE(grid.y * cuda::tc_block_rows, sequence);
    EXPECT_LT((grid.y - 1) * cuda::tc_block_rows, sequence);
    EXPECT_TRUE(cuda::tc_grid_fits(grid));
  }
  EXPECT_EQ(cuda::tc_block_rows, 64);
  EXPECT_EQ(cuda::tc_threads, 128);
}

TEST(TensorCoreAttentionPlan, StreamedTilesStopAtTheCausalBoundary) {
  // T = 257: 5 blocks of 64 rows. Forward (64-key tiles): block b sees keys < 64 (b + 1) when causal.
  for (std::int64_t block = 0; block < 5; ++block) {
    EXPECT_EQ(cuda::tc_forward_key_tiles(257, true, block, 64), std::min<std::int64_t>(block + 1, 5));
    EXPECT_EQ(cuda::tc_forward_key_tiles(257, false, block, 64), 5);
    // dK/dV: key block b is seen by queries >= 64 b; 64-query tiles (32 for head_dim 128).
    EXPECT_EQ(cuda::tc_dkdv_query_tiles(257, true, block, 64), 5 - block);
    EXPECT_EQ(cuda::tc_dkdv_query_tiles(257, true, block, 128), (257 - 64 * block + 31) / 32);
    EXPECT_EQ(cuda::tc_dkdv_query_tiles(257, false, block, 64), 5);
    EXPECT_EQ(cuda::tc_dq_key_tiles(257, true, block, 128), std::min<std::int64_t>(2 * (block + 1), 9));
  }
  EXPECT_EQ(cuda::tc_forward_key_tiles(1, true, 0, 64), 1);
  EXPECT_EQ(cuda::tc_dkdv_query_tiles(1, true, 0, 32), 1);
}

TEST(TensorCoreAttentionPlan, SharedMemoryFitsAndRowsStartInDifferentBanks) {
  for (int head_dim : {32, 64, 128}) {
    EXPECT_TRUE(cuda::tc_head_dim_supported(head_dim));
    // Every tile row starts on 16 bytes (the 16-byte stores), and 8 consecutive rows start in 8 different 4-bank
    // groups (the fragment loads read 8 rows at a time).
    const int stride_bytes = cuda::tc_row_stride(head_dim) * 2;
    EXPECT_EQ(stride_bytes % 16, 0);
    std::vector<int> banks;
    for (int row = 0; row < 8; ++row) banks.push_back(row * stride_bytes / 4 % 32 / 4);
    std::sort(banks.begin(), banks.end());
    EXPECT_EQ(std::unique(banks.begin(), banks.end()), banks.end()) << head_dim;
    // Within what an sm_80 block may opt in to (163 KiB).
    EXPECT_LE(cuda::tc_forward_shared_bytes(head_dim), std::size_t{163} << 10);
    EXPECT_LE(cuda::tc_backward_shared_bytes(head_dim), std::size_t{163} << 10);
    // The backward's streamed tiles divide the 64-row blocks (the causal start of the dK/dV kernel is a tile start).
    EXPECT_EQ(cuda::tc_block_rows % cuda::tc_backward_stream_rows(head_dim), 0);
  }
  EXPECT_EQ(cuda::tc_backward_shared_bytes(64), std::size_t{(128 + 128) * 72 * 2 + 128 * 4});
  EXPECT_EQ(cuda::tc_forward_shared_bytes(64), std::size_t{(64 + 128) * 72 * 2});
  EXPECT_LE(cuda::tc_forward_shared_bytes(64), cuda::tc_default_shared_limit);  // no opt-in at head_dim <= 64
  EXPECT_LE(cuda::tc_backward_shared_bytes(64), cuda::tc_default_shared_limit);
  EXPECT_GT(cuda::tc_forward_shared_bytes(128), cuda::tc_default_shared_limit);  // head_dim 128 opts in
  EXPECT_GT(cuda::tc_backward_shared_bytes(128), cuda::tc_default_shared_limit);
  EXPECT_FALSE(cuda::tc_head_dim_supported(16));
  EXPECT_FALSE(cuda::tc_head_dim_supported(96));
}

}  // namespace
}  // namespace hpctrain
