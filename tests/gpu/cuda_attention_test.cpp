// The CUDA backend's sequence kernels against the CPU backend (the reference, itself checked against an f64 reference
// in tests/unit/attention_kernels_test.cpp): fused attention forward (output, row log-sum-exp) and backward, causal
// and not, sequences that are not multiples of the 64-row tiles, head_dim 64 and smaller, without and with dropout on
// the probabilities (both backends must drop the same elements: a different mask fails by far); the embedding lookup
// and its gradient (repeated ids, accumulate on and off); sequence pooling (mean, first). Random inputs, outputs
// poisoned with NaN, tolerances per storage dtype; the backward must give identical results on two runs. Skips (77)
// without a GPU; HPCTRAIN_GPU_TEST_SELF_CHECK=1 runs it CPU against CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test_support.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {
namespace {

// Summation orders differ between the backends (tiles of 32 or 16 keys against 64): fp32 results agree to a few
// 1e-6 relative, the backward's sums with cancellation (dS sums to zero per row) a little less; in bf16/f16 the
// rounding of the stored results dominates.
double forward_tolerance(DType dtype) { return dtype == DType::f32 ? 2e-5 : tolerance(dtype); }
double backward_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-4 : tolerance(dtype); }

std::vector<float> nan_floats(std::size_t count) { return std::vector<float>(count, nan_float); }

TEST_F(CudaVsCpu, AttentionForwardAndBackward) {
  std::vector<AttentionGeometry> shapes;
  for (bool causal : {true, false}) {
    shapes.push_back(make_attention(1, 37, 2, 64, causal));
    shapes.push_back(make_attention(2, 150, 2, 64, causal));
    shapes.push_back(make_attention(2, 70, 3, 16, causal));
    shapes.push_back(make_attention(1, 1, 1, 64, causal));
  }
  for (DType dtype : gpu_dtypes)
    for (const AttentionGeometry& g : shapes) {
      const std::string where = describe(g, dtype);
      const std::int64_t rows = g.batch * g.sequence;
      const auto lse_count = static_cast<std::size_t>(g.batch * g.heads * g.sequence);
      auto qkv = pair(dtype, rows, 3 * g.width());
      auto out = pair(dtype, rows, g.width());
      auto dout = pair(dtype, rows, g.width());
      auto dqkv = pair(dtype, rows, 3 * g.width());
      qkv.randomize(1009 + static_cast<std::uint64_t>(g.sequence), -2.0, 2.0);  // scores of a few units
      dout.randomize(2003 + static_cast<std::uint64_t>(g.head_dim));
      out.poison();
      dqkv.poison();
      auto lse = array(nan_floats(lse_count));
      cpu->attention_forward(g, qkv.cpu(), out.cpu(), lse.cpu());
      gpu->attention_forward(g, qkv.gpu(), out.gpu(), lse.gpu());
      EXPECT_LE(out.difference(), forward_tolerance(dtype)) << "out, " << where;
      EXPECT_LE(lse.difference(), 2e-5) << "lse, " << where;  // fp32 in every storage dtype

      // Both backwards from the CPU's forward results, so only the backward is compared.
      const auto out_values = out.cpu_values(0, static_cast<std::size_t>(rows * g.width()));
      out.set(out_values);
      lse.set(lse.cpu_values());
      cpu->attention_backward(g, qkv.cpu(), out.cpu(), dout.cpu(), lse.cpu(), dqkv.cpu());
      gpu->attention_backward(g, qkv.gpu(), out.gpu(), dout.gpu(), lse.gpu(), dqkv.gpu());
      EXPECT_LE(dqkv.difference(), backward_tolerance(dtype)) << "dqkv, " << where;

      // Deterministic: a second run gives the same bits.
      const std::size_t count = static_cast<std::size_t>(rows * 3 * g.width());
      const auto first = dqkv.gpu_values(0, count);
      dqkv.poison();
      gpu->attention_backward(g, qkv.gpu(), out.gpu(), dout.gpu(), lse.gpu(), dqkv.gpu());
      EXPECT_EQ(dqkv.gpu_values(0, count), first) << "dqkv not reproducible, " << where;
    }
}

// Dropout: the mask is kernels/math.hpp's function of (seed, step, layer, global sample, head, query, key), so the CUDA
// kernels drop exactly the CPU's elements and the results agree to the plain kernels' tolerances (sample ids in each
// backend's memory; large ones, so the 64-bit element index is exercised).
TEST_F(CudaVsCpu, AttentionDropoutDropsTheSameElements) {
  std::vector<AttentionGeometry> shapes;
  for (bool causal : {true, false}) {
    shapes.push_back(make_attention(2, 150, 2, 64, causal));
    shapes.push_back(make_attention(2, 70, 3, 16, causal));
  }
  auto samples = array(std::vector<std::int64_t>{3000000007, 12});
  for (DType dtype : gpu_dtypes)
    for (const AttentionGeometry& plain : shapes) {
      AttentionGeometry on_cpu = plain, on_gpu = plain;
      on_cpu.dropout = {0.2f, 99, 11, 6, samples.cpu()};
      on_gpu.dropout = {0.2f, 99, 11, 6, samples.gpu()};
      const std::string where = describe(plain, dtype) + " dropout 0.2";
      const std::int64_t rows = plain.batch * plain.sequence;
      const auto lse_count = static_cast<std::size_t>(plain.batch * plain.heads * plain.sequence);
      auto qkv = pair(dtype, rows, 3 * plain.width());
      auto out = pair(dtype, rows, plain.width());
      auto dout = pair(dtype, rows, plain.width());
      auto dqkv = pair(dtype, rows, 3 * plain.width());
      qkv.randomize(3001 + static_cast<std::uint64_t>(plain.sequence), -2.0, 2.0);
      dout.randomize(4001 + static_cast<std::uint64_t>(plain.head_dim));
      out.poison();
      dqkv.poison();
      auto lse = array(nan_floats(lse_count));
      cpu->attention_forward(on_cpu, qkv.cpu(), out.cpu(), lse.cpu());
      gpu->attention_forward(on_gpu, qkv.gpu(), out.gpu(), lse.gpu());
      EXPECT_LE(out.difference(), forward_tolerance(dtype)) << "out, " << where;
      EXPECT_LE(lse.difference(), 2e-5) << "lse, " << where;
      const auto out_values = out.cpu_values(0, static_cast<std::size_t>(rows * plain.width()));
      out.set(out_values);
      lse.set(lse.cpu_values());
      cpu->attention_backward(on_cpu, qkv.cpu(), out.cpu(), dout.cpu(), lse.cpu(), dqkv.cpu());
      gpu->attention_backward(on_gpu, qkv.gpu(), out.gpu(), dout.gpu(), lse.gpu(), dqkv.gpu());
      EXPECT_LE(dqkv.difference(), backward_tolerance(dtype)) << "dqkv, " << where;
    }
}

TEST_F(CudaVsCpu, AttentionHeadsBeyondTheKernelsAreRefused) {
  if (self_check()) GTEST_SKIP() << "the CPU backend takes any head_dim";
  const AttentionGeometry g = make_attention(1, 8, 1, 128, true);
  auto qkv = pair(DType::f32, 8, 3 * g.width());
  auto out = pair(DType::f32, 8, g.width());
  qkv.randomize(5);
  auto lse = array(nan_floats(8));
  EXPECT_THROW(gpu->attention_forward(g, qkv.gpu(), out.gpu(), lse.gpu()), NotSupported);
}

TEST_F(CudaVsCpu, EmbeddingForwardAndBackward) {
  const std::int64_t vocabulary = 50, rows = 300, cols = 96;
  std::vector<std::int32_t> id_values;
  for (std::int64_t r = 0; r < rows; ++r)  // repeated ids, some ids never used, unsorted
    id_values.push_back(static_cast<std::int32_t>((r * 37 + r / 7) % 41 + (r % 5 == 0 ? 9 : 0)));
  auto ids = array(id_values);
  const auto table_count = static_cast<std::size_t>(vocabulary * cols);
  for (DType dtype : gpu_dtypes) {
    const std::string where = dtype_name(dtype);
    auto table = array(random_floats(table_count, 17));
    auto y = pair(dtype, rows, cols);
    y.poison();
    cpu->embedding_forward(ids.cpu(), table.cpu(), vocabulary, y.cpu());
    gpu->embedding_forward(ids.gpu(), table.gpu(), vocabulary, y.gpu());
    EXPECT_TRUE(y.identical()) << "forward, " << where;
    // With a learned position embedding (sequence 30: rows are 10 sequences), added before the one rounding.
    auto positions = array(random_floats(static_cast<std::size_t>(30 * cols), 19));
    y.poison();
    cpu->embedding_forward(ids.cpu(), table.cpu(), vocabulary, y.cpu(), positions.cpu(), 30);
    gpu->embedding_forward(ids.gpu(), table.gpu(), vocabulary, y.gpu(), positions.gpu(), 30);
    EXPECT_TRUE(y.identical()) << "forward with positions, " << where;

    auto dy = pair(dtype, rows, cols);
    dy.randomize(23);
    for (bool accumulate : {false, true}) {
      auto dtable = array(accumulate ? random_floats(table_count, 29) : nan_floats(table_count));
      cpu->embedding_backward(ids.cpu(), dy.cpu(), vocabulary, dtable.cpu(), accumulate);
      gpu->embedding_backward(ids.gpu(), dy.gpu(), vocabulary, dtable.gpu(), accumulate);
      // The same additions in the same (row) order on both backends.
      EXPECT_LE(dtable.difference(), 1e-6) << "backward, accumulate " << accumulate << ", " << where;
      const auto first = dtable.gpu_values();
      if (!accumulate) {
        dtable.set(nan_floats(table_count));
        gpu->embedding_backward(ids.gpu(), dy.gpu(), vocabulary, dtable.gpu(), accumulate);
        EXPECT_EQ(dtable.gpu_values(), first) << "backward not reproducible, " << where;
      }
    }
  }
}

// Sequence pooling: the same fp32 additions in position order on both backends, so identical results.
TEST_F(CudaVsCpu, SequencePoolForwardAndBackward) {
  const std::int64_t rows = 9, sequence = 77, channels = 40;
  for (DType dtype : gpu_dtypes)
    for (const SequencePooling mode : {SequencePooling::mean, SequencePooling::first}) {
      const std::string where = std::string(dtype_name(dtype)) + (mode == SequencePooling::mean ? " mean" : " first");
      auto x = pair(dtype, rows, sequence * channels);
      x.randomize(41);
      auto y = pair(dtype, rows, channels);
      y.poison();
      cpu->sequence_pool_forward(mode, sequence, x.cpu(), y.cpu());
      gpu->sequence_pool_forward(mode, sequence, x.gpu(), y.gpu());
      EXPECT_LE(y.difference(), 1e-6) << "forward, " << where;
      auto dy = pair(dtype, rows, channels);
      dy.randomize(43);
      auto dx = pair(dtype, rows, sequence * channels);
      dx.poison();
      cpu->sequence_pool_backward(mode, sequence, dy.cpu(), dx.cpu());
      gpu->sequence_pool_backward(mode, sequence, dy.gpu(), dx.gpu());
      EXPECT_TRUE(dx.identical()) << "backward, " << where;
    }
}

}  // namespace
}  // namespace hpctrain
