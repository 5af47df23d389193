// The CUDA backend's paths beyond the per-kernel comparisons of cuda_kernels_test.cpp (issue 15): one large shape per
// kernel (>= 70,000 rows or >= 4,096 columns: the two-pass and segmented reductions, 32-bit index arithmetic), the
// bias gradient folded into the weight-gradient product, linear + relu / gelu(tanh) folded into the forward product
// and their backward into the next layer's input-gradient product, batch uploads
// on the copy stream, graph slots and scratch that grows after a capture, step bookkeeping replayed by a graph, phase
// timing on events, TF32, the residual add in the product (issue 16). Against the CPU backend with the tolerances of
// cuda_kernels_test; skips (77) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_support.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {
namespace {

constexpr std::int64_t many_rows = 70000, many_cols = 4096;

class CudaPaths : public CudaVsCpu {
 protected:
  // Tests of GPU-only machinery (graphs, copy stream, events) have no CPU counterpart to self-check against.
  void SetUp() override {
    CudaVsCpu::SetUp();
    if (self_check() && needs_gpu_machinery_) GTEST_SKIP() << "GPU-only machinery";
  }
  bool needs_gpu_machinery_ = false;
};
class CudaMachinery : public CudaPaths {
 protected:
  CudaMachinery() { needs_gpu_machinery_ = true; }
};

TEST_F(CudaPaths, LargeColumnSumsAndBiasGradients) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (const auto [rows, cols] : {std::pair{many_rows, std::int64_t{10}}, std::pair{many_rows, many_cols}}) {
      auto dy = pair(dtype, rows, cols);
      dy.randomize(1);
      auto dbias = array(std::vector<float>(static_cast<std::size_t>(cols), nan_float));
      cpu->bias_gradient(dy.cpu(), dbias.cpu(), DType::f32, false);
      gpu->bias_gradient(dy.gpu(), dbias.gpu(), DType::f32, false);
      EXPECT_LE(dbias.difference(), 1e-5) << rows << "x" << cols << " " << dtype_name(dtype);
    }
}

TEST_F(CudaPaths, LargeLayernormWarpAndSegmentedRows) {
  // 70,000 short rows (a warp each) and a few 70,000-wide rows (cut into chunks of a 2-D grid).
  for (const auto [rows, cols] : {std::pair{many_rows, std::int64_t{96}}, std::pair{std::int64_t{6}, many_rows},
                                  std::pair{std::int64_t{8}, many_cols}})
    for (DType dtype : {DType::f32, DType::bf16}) {
      auto x = pair(dtype, rows, cols), y = pair(dtype, rows, cols), dy = pair(dtype, rows, cols);
      auto dx = pair(dtype, rows, cols);
      x.randomize(2, -2.0, 3.0);
      dy.randomize(3);
      y.poison();
      dx.poison();
      auto gamma = array(random_floats(static_cast<std::size_t>(cols), 4, 0.5, 1.5));
      auto beta = array(random_floats(static_cast<std::size_t>(cols), 5));
      auto mean = array(std::vector<float>(static_cast<std::size_t>(rows), nan_float));
      auto rstd = array(std::vector<float>(static_cast<std::size_t>(rows), nan_float));
      auto dgamma = array(std::vector<float>(static_cast<std::size_t>(cols), nan_float));
      auto dbeta = array(std::vector<float>(static_cast<std::size_t>(cols), nan_float));
      cpu->layernorm_forward(x.cpu(), gamma.cpu(), beta.cpu(), 1e-5f, y.cpu(), mean.cpu(), rstd.cpu());
      gpu->layernorm_forward(x.gpu(), gamma.gpu(), beta.gpu(), 1e-5f, y.gpu(), mean.gpu(), rstd.gpu());
      const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(dtype);
      EXPECT_LE(y.difference(), tolerance(dtype)) << what;
      EXPECT_LE(rstd.difference(), 1e-5) << what;
      cpu->layernorm_backward(x.cpu(), dy.cpu(), gamma.cpu(), mean.cpu(), rstd.cpu(), dx.cpu(), dgamma.cpu(),
                              dbeta.cpu(), false);
      gpu->layernorm_backward(x.gpu(), dy.gpu(), gamma.gpu(), mean.gpu(), rstd.gpu(), dx.gpu(), dgamma.gpu(),
                              dbeta.gpu(), false);
      EXPECT_LE(dx.difference(), 10 * tolerance(dtype)) << what;
      EXPECT_LE(dgamma.difference(), 1e-4) << what;
      EXPECT_LE(dbeta.difference(), 1e-5) << what;
    }
}

TEST_F(CudaPaths, LargeLossesWithTheGradientOverTheLogits) {
  for (const auto [rows, cols] : {std::pair{many_rows, std::int64_t{10}}, std::pair{std::int64_t{64}, many_cols}})
    for (DType dtype : gpu_dtypes) {
      auto logits = pair(dtype, rows, cols);
      logits.randomize(6, -4.0, 4.0);
      std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
      for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>((i * 7919) % cols);
      auto label_array = array(labels);
      auto scale = array(std::vector<float>{0.25f});
      auto sums = array(std::vector<double>{0.0, 0.0});
      // In place, as training runs it: the gradient overwrites the logits (the lane reading logits[label] and the
      // lane writing it are ordered by __syncwarp).
      cpu->softmax_cross_entropy(logits.cpu(), label_array.cpu(), scale.cpu(), logits.cpu(),
                                 reinterpret_cast<LossSums*>(sums.cpu()));
      gpu->softmax_cross_entropy(logits.gpu(), label_array.gpu(), scale.gpu(), logits.gpu(),
                                 reinterpret_cast<LossSums*>(sums.gpu()));
      EXPECT_LE(logits.difference(), tolerance(dtype)) << rows << "x" << cols << " " << dtype_name(dtype);
      EXPECT_LE(sums.difference(), 1e-5);
    }
}

TEST_F(CudaPaths, LargeElementWiseAndOptimizer) {
  auto x = pair(DType::bf16, many_rows, 64), y = pair(DType::bf16, many_rows, 64);
  x.randomize(7, -3.0, 3.0);
  for (Activation kind : all_activations) {
    y.poison();
    cpu->activation_forward(kind, 0.1f, x.cpu(), y.cpu());
    gpu->activation_forward(kind, 0.1f, x.gpu(), y.gpu());
    EXPECT_LE(y.difference(), tolerance(DType::bf16)) << static_cast<int>(kind);
  }
  std::vector<std::int64_t> ids(static_cast<std::size_t>(many_rows));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 3 + 1);
  auto sample_ids = array(ids);
  y.poison();
  cpu->dropout_forward(0.3f, 9, 4, 2, sample_ids.cpu(), x.cpu(), y.cpu());
  gpu->dropout_forward(0.3f, 9, 4, 2, sample_ids.gpu(), x.gpu(), y.gpu());
  EXPECT_TRUE(y.identical()) << "dropout masks of a 70,000-row batch (32-bit index path)";

  const std::size_t count = static_cast<std::size_t>(many_rows) * 1024;
  auto parameters = array(random_floats(count, 8)), state1 = array(std::vector<float>(count, 0.0f));
  auto state2 = array(std::vector<float>(count, 0.0f)), gradients = array(random_floats(count, 9, -1e-2, 1e-2));
  StepScalars initial;
  initial.learning_rate = 1e-3f;
  auto scalars = array(std::vector<StepScalars>{initial});
  OptimizerHyper hyper;
  hyper.max_grad_norm = 1.0f;
  hyper.weight_decay = 0.01f;
  for (Backend* backend : {cpu.get(), gpu.get()}) {
    const bool on_cpu = backend == cpu.get();
    StepScalars* device_scalars = on_cpu ? scalars.cpu() : scalars.gpu();
    backend->gradient_statistics(on_cpu ? gradients.cpu() : gradients.gpu(), static_cast<std::int64_t>(count), hyper,
                                 device_scalars);
    backend->optimizer_step(hyper, true, on_cpu ? parameters.cpu() : parameters.gpu(),
                            on_cpu ? gradients.cpu() : gradients.gpu(), on_cpu ? state1.cpu() : state1.gpu(),
                            on_cpu ? state2.cpu() : state2.gpu(), static_cast<std::int64_t>(count), TensorView{},
                            device_scalars);
  }
  EXPECT_LE(parameters.difference(), 1e-6);
  EXPECT_NEAR(scalars.gpu_values()[0].grad_norm, scalars.cpu_values()[0].grad_norm,
              1e-6 * scalars.cpu_values()[0].grad_norm);
}

TEST_F(CudaPaths, LargeGemmAndFusedBiasGradient) {
  for (DType dtype : gpu_dtypes) {
    // Forward: (70,000, 64) x (4,096, 64)^T + bias.
    auto a = pair(dtype, many_rows, 64), w = pair(dtype, many_cols, 64), c = pair(dtype, many_rows, many_cols);
    a.randomize(10);
    w.randomize(11);
    c.poison();
    auto bias = array(random_floats(static_cast<std::size_t>(many_cols), 12));
    cpu->gemm(a.cpu(), false, w.cpu(), true, c.cpu(), bias.cpu(), false);
    gpu->gemm(a.gpu(), false, w.gpu(), true, c.gpu(), bias.gpu(), false);
    EXPECT_LE(c.difference(), tolerance(dtype)) << dtype_name(dtype);
  }
  // A linear layer's parameter gradients, fused (CUBLASLT_EPILOGUE_BGRADB) and, accumulating, composed.
  for (DType dtype : gpu_dtypes)
    for (bool accumulate : {false, true}) {
      auto dy = pair(dtype, many_rows, 1024), x = pair(dtype, many_rows, 64);
      auto dweight = pair(DType::f32, 1024, 64);
      dy.randomize(13);
      x.randomize(14);
      auto dbias = array(random_floats(1024, 15));
      if (accumulate) {
        dweight.randomize(16);
      } else {
        dweight.poison();
        dbias.set(std::vector<float>(1024, nan_float));
      }
      cpu->linear_weight_gradient(dy.cpu(), x.cpu(), dweight.cpu(), dbias.cpu(), accumulate);
      gpu->linear_weight_gradient(dy.gpu(), x.gpu(), dweight.gpu(), dbias.gpu(), accumulate);
      EXPECT_LE(dweight.difference(), 1e-5) << dtype_name(dtype) << " accumulate " << accumulate;
      EXPECT_LE(dbias.difference(), 1e-5) << dtype_name(dtype) << " accumulate " << accumulate;
    }
}

// Issue 15, item 9: linear + relu in one product (CUBLASLT_EPILOGUE_RELU_BIAS / RELU) against the CPU's gemm then
// relu, with and without a bias, aligned shapes (the epilogue) and odd ones (the product then relu in place). A NaN
// input row must come out NaN, as the CPU's relu passes it (a NaN-swallowing epilogue would hide a blown-up forward).
TEST_F(CudaPaths, LinearWithReluFoldedIntoTheProduct) {
  EXPECT_TRUE(gpu->fuses_linear_activation(Activation::relu) || self_check());
  EXPECT_FALSE(gpu->fuses_linear_activation(Activation::gelu)) << "cuBLASLt's GELU is the tanh approximation";
  EXPECT_TRUE(gpu->fuses_linear_activation(Activation::gelu_tanh) || self_check());
  struct Shape {
    std::int64_t rows, in, out;
  };
  for (const Shape shape : {Shape{1000, 64, 256}, Shape{333, 37, 129}, Shape{many_rows, 64, 512}})
    for (DType dtype : gpu_dtypes)
      for (bool with_bias : {true, false}) {
        auto x = pair(dtype, shape.rows, shape.in), w = pair(dtype, shape.out, shape.in);
        auto pre = pair(dtype, shape.rows, shape.out), y = pair(dtype, shape.rows, shape.out);
        std::vector<double> inputs = x.randomize(20);
        for (std::int64_t k = 0; k < shape.in; ++k) inputs[static_cast<std::size_t>(5 * shape.in + k)] = NAN;
        x.set(inputs);
        w.randomize(21);
        pre.poison();
        y.poison();
        auto bias = array(random_floats(static_cast<std::size_t>(shape.out), 22));
        const void* cpu_bias = with_bias ? bias.cpu() : nullptr;
        const void* gpu_bias = with_bias ? bias.gpu() : nullptr;
        cpu->linear_activation_forward(x.cpu(), w.cpu(), cpu_bias, Activation::relu, 0.0f, pre.cpu(), y.cpu());
        gpu->linear_activation_forward(x.gpu(), w.gpu(), gpu_bias, Activation::relu, 0.0f, pre.gpu(), y.gpu());
        const auto row = static_cast<std::size_t>(5 * shape.out);
        for (double value : y.gpu_values(row, row + static_cast<std::size_t>(shape.out)))
          ASSERT_TRUE(std::isnan(value)) << "the NaN row lost its NaN: " << value;
        // The comparison without the NaN row: set it to the same finite values on both sides.
        x.randomize(20);
        cpu->linear_activation_forward(x.cpu(), w.cpu(), cpu_bias, Activation::relu, 0.0f, pre.cpu(), y.cpu());
        gpu->linear_activation_forward(x.gpu(), w.gpu(), gpu_bias, Activation::relu, 0.0f, pre.gpu(), y.gpu());
        EXPECT_LE(y.difference(), tolerance(dtype))
            << dtype_name(dtype) << " " << shape.rows << "x" << shape.in << "->" << shape.out << " bias " << with_bias;
      }
}

// Issue 16: the residual add in the product that ends a branch (cuBLASLt's C = skip, beta = 1, with and without the
// bias epilogue) against the CPU's fused product (oneDNN post-op), aligned shapes and odd ones (the product and add()).
TEST_F(CudaPaths, LinearResidualAddFoldedIntoTheProduct) {
  EXPECT_TRUE(gpu->fuses_residual_add(DType::bf16));
  struct Shape {
    std::int64_t rows, in, out;
  };
  for (const Shape shape : {Shape{1000, 64, 256}, Shape{333, 37, 129}, Shape{many_rows, 64, 512}})
    for (DType dtype : gpu_dtypes)
      for (bool with_bias : {true, false}) {
        auto x = pair(dtype, shape.rows, shape.in), w = pair(dtype, shape.out, shape.in);
        auto skip = pair(dtype, shape.rows, shape.out), y = pair(dtype, shape.rows, shape.out);
        x.randomize(30);
        w.randomize(31);
        skip.randomize(32);
        y.poison();
        auto bias = array(random_floats(static_cast<std::size_t>(shape.out), 33));
        cpu->linear_residual_forward(x.cpu(), w.cpu(), with_bias ? bias.cpu() : nullptr, skip.cpu(), y.cpu());
        gpu->linear_residual_forward(x.gpu(), w.gpu(), with_bias ? bias.gpu() : nullptr, skip.gpu(), y.gpu());
        EXPECT_LE(y.difference(), tolerance(dtype))
            << dtype_name(dtype) << " " << shape.rows << "x" << shape.in << "->" << shape.out << " bias " << with_bias;
      }
}

// Issue 15, item 9: linear + relu and linear + gelu(tanh) pairs forward (RELU_AUX[_BIAS] writing the mask, GELU_AUX
// [_BIAS] writing the gelu input into `pre`) and the activation's backward folded into the next linear layer's
// input-gradient product (DRELU, DGELU reading them), against the CPU's composed operations. Widths that take each
// path: 256 (mask / aux), 129 (relu mask with a padded leading dimension; gelu composed: not a multiple of 8), 8 and 4
// (relu's mask fits only for some dtypes: otherwise RELU_BIAS and relu's backward on its output). NaN rows: a NaN
// input row stays NaN through the forward, a NaN row of dy leaves NaN in its dx row (the CPU's 0 * NaN makes all of
// it NaN; DRELU may write 0 where the mask is 0, so at least one NaN is required, not all).
TEST_F(CudaPaths, LinearActivationPairsForwardAndBackwardFoldedIntoTheProducts) {
  struct Shape {
    std::int64_t rows, in, width, next;
  };
  for (const Activation kind : {Activation::relu, Activation::gelu_tanh})
    for (const Shape shape : {Shape{1000, 64, 256, 128}, Shape{333, 37, 129, 40}, Shape{500, 16, 8, 24},
                              Shape{500, 16, 4, 24}, Shape{many_rows, 64, 512, 64}})
      for (DType dtype : gpu_dtypes)
        for (bool with_bias : {true, false}) {
          // The large shape once per activation (bf16, bias): its CPU reference dominates the run time.
          if (shape.rows == many_rows && (dtype != DType::bf16 || !with_bias)) continue;
          const std::string what = std::string(kind == Activation::relu ? "relu " : "gelu(tanh) ") + dtype_name(dtype) +
                                   " " + std::to_string(shape.rows) + "x" + std::to_string(shape.in) + "->" +
                                   std::to_string(shape.width) + "->" + std::to_string(shape.next) +
                                   (with_bias ? " bias" : "");
          auto x = pair(dtype, shape.rows, shape.in), w = pair(dtype, shape.width, shape.in);
          auto w_next = pair(dtype, shape.next, shape.width), dy = pair(dtype, shape.rows, shape.next);
          auto pre = pair(dtype, shape.rows, shape.width), y = pair(dtype, shape.rows, shape.width);
          auto dx = pair(dtype, shape.rows, shape.width);
          std::vector<double> inputs = x.randomize(30);
          for (std::int64_t k = 0; k < shape.in; ++k) inputs[static_cast<std::size_t>(7 * shape.in + k)] = NAN;
          x.set(inputs);
          w.randomize(31);
          w_next.randomize(32);
          std::vector<double> gradients = dy.randomize(33);
          for (std::int64_t k = 0; k < shape.next; ++k) gradients[static_cast<std::size_t>(9 * shape.next + k)] = NAN;
          dy.set(gradients);
          pre.poison();
          y.poison();
          dx.poison();
          auto bias = array(random_floats(static_cast<std::size_t>(shape.width), 34));
          const void* cpu_bias = with_bias ? bias.cpu() : nullptr;
          const void* gpu_bias = with_bias ? bias.gpu() : nullptr;
          const auto both = [&] {
            cpu->linear_activation_forward(x.cpu(), w.cpu(), cpu_bias, kind, 0.0f, pre.cpu(), y.cpu());
            gpu->linear_activation_forward(x.gpu(), w.gpu(), gpu_bias, kind, 0.0f, pre.gpu(), y.gpu());
            cpu->linear_activation_backward(dy.cpu(), w_next.cpu(), kind, 0.0f, pre.cpu(), y.cpu(), dx.cpu());
            gpu->linear_activation_backward(dy.gpu(), w_next.gpu(), kind, 0.0f, pre.gpu(), y.gpu(), dx.gpu());
          };
          both();
          const auto forward_row = static_cast<std::size_t>(7 * shape.width);
          for (double value : y.gpu_values(forward_row, forward_row + static_cast<std::size_t>(shape.width)))
            ASSERT_TRUE(std::isnan(value)) << what << ": the NaN input row lost its NaN: " << value;
          const auto backward_row = static_cast<std::size_t>(9 * shape.width);
          const auto row = dx.gpu_values(backward_row, backward_row + static_cast<std::size_t>(shape.width));
          EXPECT_TRUE(std::any_of(row.begin(), row.end(), [](double value) { return std::isnan(value); }))
              << what << ": the NaN row of dy left no NaN in dx";
          // The comparison without the NaN rows: the same finite values on both sides, outputs poisoned again.
          x.randomize(30);
          dy.randomize(33);
          pre.poison();
          y.poison();
          dx.poison();
          both();
          // cuBLASLt's GELU may evaluate tanh with the hardware approximation (about 2^-11 relative): fp32 gets
          // 5e-4 there, still far below what a wrong derivative or a misread aux gives.
          const double bound = kind == Activation::gelu_tanh ? std::max(tolerance(dtype), 5e-4) : tolerance(dtype);
          EXPECT_LE(y.difference(), bound) << what;
          // gelu's pre-activation is its input (the aux, or the composed product); relu's may hold the mask.
          if (kind == Activation::gelu_tanh) EXPECT_LE(pre.difference(), tolerance(dtype)) << what;
          EXPECT_LE(dx.difference(), 2 * bound) << what;
        }
}

TEST_F(CudaPaths, LargeGroupnormAndPooling) {
  // CosmoFlow-like: few samples, few groups of a million values each (segmented chunks), and 3-D max pooling
  // with 32-bit index arithmetic.
  SpatialGeometry pool;
  pool.dimensions = 3;
  pool.in_channels = pool.out_channels = 8;
  pool.input = {64, 64, 64};
  pool.output = {32, 32, 32};
  pool.kernel = pool.stride = {2, 2, 2};
  pool.padding = {0, 0, 0};
  pool.dilation = {1, 1, 1};
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::int64_t rows = 3, channels = 8, groups = 2, cols = channels * 64 * 64 * 64;
    auto x = pair(dtype, rows, cols), y = pair(dtype, rows, cols), dy = pair(dtype, rows, cols);
    auto dx = pair(dtype, rows, cols);
    x.randomize(17, -1.0, 2.0);
    dy.randomize(18);
    y.poison();
    dx.poison();
    auto gamma = array(random_floats(8, 19, 0.5, 1.5)), beta = array(random_floats(8, 20));
    auto mean = array(std::vector<float>(6, nan_float)), rstd = array(std::vector<float>(6, nan_float));
    auto dgamma = array(std::vector<float>(8, nan_float)), dbeta = array(std::vector<float>(8, nan_float));
    for (Backend* backend : {cpu.get(), gpu.get()}) {
      const bool c = backend == cpu.get();
      backend->groupnorm_forward(channels, groups, SpatialLayout::channels_first, c ? x.cpu() : x.gpu(),
                                 c ? gamma.cpu() : gamma.gpu(), c ? beta.cpu() : beta.gpu(), 1e-5f,
                                 c ? y.cpu() : y.gpu(), c ? mean.cpu() : mean.gpu(), c ? rstd.cpu() : rstd.gpu());
      backend->groupnorm_backward(channels, groups, SpatialLayout::channels_first, c ? x.cpu() : x.gpu(),
                                  c ? dy.cpu() : dy.gpu(), c ? gamma.cpu() : gamma.gpu(), c ? mean.cpu() : mean.gpu(),
                                  c ? rstd.cpu() : rstd.gpu(), c ? dx.cpu() : dx.gpu(), c ? dgamma.cpu() : dgamma.gpu(),
                                  c ? dbeta.cpu() : dbeta.gpu(), false);
    }
    EXPECT_LE(y.difference(), tolerance(dtype)) << dtype_name(dtype);
    EXPECT_LE(dx.difference(), 10 * tolerance(dtype)) << dtype_name(dtype);
    EXPECT_LE(dgamma.difference(), 1e-4);
    EXPECT_LE(dbeta.difference(), 1e-4);

    auto pooled = pair(dtype, rows, channels * 32 * 32 * 32), back = pair(dtype, rows, cols);
    pooled.poison();
    back.poison();
    cpu->pooling_forward(PoolingKind::max, pool, x.cpu(), pooled.cpu());
    gpu->pooling_forward(PoolingKind::max, pool, x.gpu(), pooled.gpu());
    EXPECT_TRUE(pooled.identical()) << dtype_name(dtype);
    cpu->pooling_backward(PoolingKind::max, pool, x.cpu(), pooled.cpu(), back.cpu());
    gpu->pooling_backward(PoolingKind::max, pool, x.gpu(), pooled.gpu(), back.gpu());
    EXPECT_TRUE(back.identical()) << dtype_name(dtype);
  }
}

TEST_F(CudaPaths, MaxPoolingWithKeptArgmaxEqualsTheCpu) {
  // Overlapping windows with padding, and ties (values on a coarse grid): the kept first maxima must route every
  // gradient as the CPU's recomputed windows do, bit for bit.
  SpatialGeometry g;
  g.in_channels = g.out_channels = 3;
  g.input = {33, 30};
  g.kernel = {3, 3};
  g.stride = {2, 2};
  g.padding = {1, 1};
  g.dilation = {1, 1};
  g.output = {17, 15};
  // Both layouts: 16-bit conv stacks run channels-last (issue 15, item 11).
  for (SpatialLayout layout : {SpatialLayout::channels_first, SpatialLayout::channels_last})
    for (DType dtype : gpu_dtypes) {
      g.layout = layout;
      const std::int64_t rows = 5, in_cols = 3 * 33 * 30, out_cols = 3 * 17 * 15;
      auto x = pair(dtype, rows, in_cols), y = pair(dtype, rows, out_cols), dx = pair(dtype, rows, in_cols);
      auto values = random_values(static_cast<std::size_t>(rows * in_cols), 31, -4.0, 4.0);
      for (double& value : values) value = std::round(value);
      x.set(values);
      y.poison();
      dx.poison();
      auto argmax = array(std::vector<std::int32_t>(static_cast<std::size_t>(rows * out_cols), -7));
      cpu->max_pooling_forward(g, x.cpu(), y.cpu(), argmax.cpu());
      gpu->max_pooling_forward(g, x.gpu(), y.gpu(), argmax.gpu());
      EXPECT_TRUE(y.identical()) << dtype_name(dtype) << " layout " << static_cast<int>(layout);
      cpu->max_pooling_backward(g, x.cpu(), y.cpu(), argmax.cpu(), dx.cpu());
      gpu->max_pooling_backward(g, x.gpu(), y.gpu(), argmax.gpu(), dx.gpu());
      EXPECT_TRUE(dx.identical()) << dtype_name(dtype) << " layout " << static_cast<int>(layout);
    }
}

TEST_F(CudaMachinery, DeviceIdentityAndLayout) {
  EXPECT_TRUE(gpu->supports_capture());
  EXPECT_EQ(gpu->parameter_alignment(), 256u);
  EXPECT_NE(gpu->device_uuid(), DeviceUuid{}) << "a GPU has a UUID";
}

TEST_F(CudaMachinery, UploadsFromPinnedAndPageableMemoryKeepBatchesApart) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool pinned : {false, true}) {
      // Two 8 MiB batches in a row, each source overwritten as soon as upload_cast returns (as the loader's reader
      // thread may): the device must hold what the source held at the call.
      const std::int64_t rows = 2048, cols = 1024;
      std::vector<float> source(static_cast<std::size_t>(rows * cols));
      if (pinned) ASSERT_TRUE(gpu->pin_host_memory(source.data(), source.size() * sizeof(float)));
      auto first = pair(dtype, rows, cols), second = pair(dtype, rows, cols);
      first.poison();
      second.poison();
      const auto first_values = random_floats(source.size(), 21, -100.0, 100.0);
      const auto second_values = random_floats(source.size(), 22, -100.0, 100.0);
      std::memcpy(source.data(), first_values.data(), source.size() * sizeof(float));
      gpu->upload_cast(source.data(), first.gpu());
      std::memcpy(source.data(), second_values.data(), source.size() * sizeof(float));
      gpu->upload_cast(source.data(), second.gpu());
      std::fill(source.begin(), source.end(), nan_float);
      cpu->upload_cast(first_values.data(), first.cpu());
      cpu->upload_cast(second_values.data(), second.cpu());
      EXPECT_TRUE(first.identical()) << dtype_name(dtype) << " pinned " << pinned;
      EXPECT_TRUE(second.identical()) << dtype_name(dtype) << " pinned " << pinned;
      if (pinned) gpu->unpin_host_memory(source.data());
    }
}

TEST_F(CudaMachinery, GraphSlotsAndScratchThatGrowsAfterACapture) {
  // A captured loss over 1,000 rows; then an eager loss over 140,000 rows grows the per-row scratch (retiring the
  // captured block, not freeing it); replaying the capture must still give its own result.
  const std::int64_t rows = 1000, cols = 12;
  auto logits = pair(DType::f32, rows, cols);
  logits.randomize(23, -3.0, 3.0);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(2 * many_rows));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % cols);
  auto label_array = array(labels);
  auto sums = array(std::vector<double>{0.0, 0.0});
  auto* gpu_sums = reinterpret_cast<LossSums*>(sums.gpu());
  gpu->begin_capture(CaptureSlot::inference);
  gpu->softmax_cross_entropy(logits.gpu(), label_array.gpu(), nullptr, TensorView{}, gpu_sums);
  gpu->end_capture(CaptureSlot::inference);
  EXPECT_TRUE(gpu->has_capture(CaptureSlot::inference));
  EXPECT_FALSE(gpu->has_capture(CaptureSlot::step));
  auto big = pair(DType::f32, 2 * many_rows, cols);
  big.randomize(24);
  auto big_sums = array(std::vector<double>{0.0, 0.0});
  gpu->softmax_cross_entropy(big.gpu(), label_array.gpu(), nullptr, TensorView{},
                             reinterpret_cast<LossSums*>(big_sums.gpu()));
  gpu->replay_capture(CaptureSlot::inference);
  gpu->replay_capture(CaptureSlot::inference);
  auto want = array(std::vector<double>{0.0, 0.0});
  cpu->softmax_cross_entropy(logits.cpu(), label_array.cpu(), nullptr, TensorView{},
                             reinterpret_cast<LossSums*>(want.cpu()));
  const auto got = sums.gpu_values();
  EXPECT_NEAR(got[0], 2 * want.cpu_values()[0], 1e-6 * std::abs(want.cpu_values()[0])) << "two replays";
  gpu->release_graphs();
  EXPECT_FALSE(gpu->has_capture(CaptureSlot::inference));
}

TEST_F(CudaMachinery, StepBookkeepingReplaysFromDeviceMemory) {
  // The learning rate read from a table slot and the step's record written to a slot, both indexed by a counter in
  // device memory: one captured graph serves every step.
  auto table = array(std::vector<float>{0.5f, 0.25f, 0.125f, 0.0625f});
  auto slot = array(std::vector<std::int32_t>{0});
  auto learning_rate = array(std::vector<float>{-1.0f});
  auto records = array(std::vector<float>(4, -1.0f));
  gpu->begin_capture(CaptureSlot::step);
  gpu->copy_from_slot(learning_rate.gpu(), table.gpu(), sizeof(float), slot.gpu(), sizeof(float));
  gpu->copy_to_slot(records.gpu(), sizeof(float), slot.gpu(), learning_rate.gpu(), sizeof(float));
  gpu->advance_slot(slot.gpu());
  gpu->end_capture(CaptureSlot::step);
  for (int step = 0; step < 3; ++step) gpu->replay_capture(CaptureSlot::step);
  EXPECT_EQ(records.gpu_values(), (std::vector<float>{0.5f, 0.25f, 0.125f, -1.0f}));
  EXPECT_EQ(slot.gpu_values()[0], 3);
}

TEST_F(CudaMachinery, PhasesAreTimedOnEvents) {
  auto a = pair(DType::f32, 4096, 4096), c = pair(DType::f32, 4096, 4096);
  a.randomize(25);
  ASSERT_TRUE(gpu->mark_phase(2, "backward"));
  for (int i = 0; i < 4; ++i) gpu->gemm(a.gpu(), false, a.gpu(), true, c.gpu(), nullptr, false);
  gpu->mark_phase(-1, "");
  const auto seconds = gpu->phase_seconds();
  ASSERT_GE(seconds.size(), 3u);
  EXPECT_GT(seconds[2], 1e-4) << "four 4096^3 products take more than 0.1 ms";
  EXPECT_EQ(seconds[1], 0.0);
}

TEST_F(CudaMachinery, Tf32ProductsAreCloseButNotFp32Exact) {
  auto a = pair(DType::f32, 512, 512), b = pair(DType::f32, 512, 512), c = pair(DType::f32, 512, 512);
  a.randomize(26);
  b.randomize(27);
  cpu->gemm(a.cpu(), false, b.cpu(), false, c.cpu(), nullptr, false);
  gpu->gemm(a.gpu(), false, b.gpu(), false, c.gpu(), nullptr, false);
  const double strict = c.difference();
  gpu->allow_tf32(true);
  gpu->gemm(a.gpu(), false, b.gpu(), false, c.gpu(), nullptr, false);
  const double fast = c.difference();
  gpu->allow_tf32(false);
  EXPECT_LE(strict, 1e-5);
  EXPECT_LE(fast, 5e-3);
  EXPECT_GT(fast, strict) << "TF32 inputs keep 10 mantissa bits";
}

}  // namespace
}  // namespace hpctrain
