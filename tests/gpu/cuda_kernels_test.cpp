// The CUDA backend against the CPU backend (the reference): every kernel on the same random inputs (never zeros),
// outputs poisoned with NaN before each run, tolerances per storage dtype (fp32 ~1e-5 relative norm, fp16 ~1e-3,
// bf16 ~1e-2; NaN never passes). Dropout masks, the loss-scaler trajectory and to_sequence must be identical. Every
// test skips without a GPU, and the executable then exits 77 (CTest shows it as skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_support.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

TEST(CudaDevices, CountIsCheapAndNeverThrows) {
  EXPECT_GE(cuda_device_count(), 0);
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
}

TEST_F(CudaVsCpu, MemoryRoundTrip) {
  if (!self_check()) EXPECT_EQ(gpu->name().rfind("cuda:0", 0), 0u) << gpu->name();
  for (std::size_t bytes : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    void* first = gpu->allocate(bytes);
    void* second = gpu->allocate(bytes);
    std::vector<unsigned char> in(bytes), out(bytes, 0);
    for (std::size_t i = 0; i < bytes; ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
    gpu->copy_to_backend(first, in.data(), bytes);
    gpu->copy(second, first, bytes);
    gpu->copy_to_host(out.data(), second, bytes);
    EXPECT_EQ(in, out);
    gpu->zero(second, bytes);
    gpu->copy_to_host(out.data(), second, bytes);
    EXPECT_EQ(std::count(out.begin(), out.end(), 0), static_cast<long>(bytes));
    gpu->deallocate(first);
    gpu->deallocate(second);
  }
}

TEST_F(CudaVsCpu, CastIsBitIdenticalAlignedAndNot) {
  for (DType from : gpu_dtypes)
    for (DType to : gpu_dtypes)
      for (std::int64_t offset : {0, 1}) {  // offset 1 element: the unvectorised path
        auto source = pair(from, 37, 29);
        auto destination = pair(to, 37, 29);
        source.randomize(11, -300.0, 300.0);
        destination.poison();
        const auto shift = [&](TensorView view, std::int64_t rows) {
          view.data = static_cast<char*>(view.data) + offset * static_cast<std::int64_t>(dtype_size(view.dtype));
          view.rows = rows;
          return view;
        };
        // Elements before the offset stay poisoned on both sides; the shifted view covers 36 rows.
        cpu->cast(shift(source.cpu(), 36), shift(destination.cpu(), 36));
        gpu->cast(shift(source.gpu(), 36), shift(destination.gpu(), 36));
        const std::size_t first = static_cast<std::size_t>(offset), last = first + 36 * 29;
        const auto want = destination.cpu_values(first, last);
        EXPECT_FALSE(has_nan(want));
        EXPECT_EQ(destination.gpu_values(first, last), want)
            << dtype_name(from) << " -> " << dtype_name(to) << " offset " << offset;
      }
}

TEST_F(CudaVsCpu, GemmEveryDtypeTransposeBiasAndAccumulate) {
  struct Shape {
    std::int64_t m, n, k;
  };
  for (const Shape shape : {Shape{37, 29, 53}, Shape{64, 128, 96}})
    for (DType input : gpu_dtypes)
      for (DType output : {input, DType::f32})
        for (int transposes = 0; transposes < 4; ++transposes)
          for (int options = 0; options < 4; ++options) {
            const bool transpose_a = transposes & 1, transpose_b = transposes & 2;
            const bool with_bias = options & 1, accumulate = options & 2;
            auto a = transpose_a ? pair(input, shape.k, shape.m) : pair(input, shape.m, shape.k);
            auto b = transpose_b ? pair(input, shape.n, shape.k) : pair(input, shape.k, shape.n);
            auto c = pair(output, shape.m, shape.n);
            auto bias = array(random_floats(static_cast<std::size_t>(shape.n), 5));
            a.randomize(1);
            b.randomize(2);
            if (accumulate)
              c.randomize(3);
            else
              c.poison();
            cpu->gemm(a.cpu(), transpose_a, b.cpu(), transpose_b, c.cpu(), with_bias ? bias.cpu() : nullptr,
                      accumulate);
            gpu->gemm(a.gpu(), transpose_a, b.gpu(), transpose_b, c.gpu(), with_bias ? bias.gpu() : nullptr,
                      accumulate);
            EXPECT_LE(c.difference(), tolerance(output))
                << shape.m << "x" << shape.n << "x" << shape.k << " " << dtype_name(input) << "->" << dtype_name(output)
                << " ta " << transpose_a << " tb " << transpose_b << " bias " << with_bias << " accumulate "
                << accumulate;
          }
}

TEST_F(CudaVsCpu, GemmOnUnalignedViews) {
  for (DType dtype : gpu_dtypes) {
    // Views one element into larger buffers, as layers' weights are views into one flat buffer.
    auto a = pair(dtype, 33, 41), b = pair(dtype, 41, 18), c = pair(DType::f32, 31, 17);
    a.randomize(21);
    b.randomize(22);
    c.poison();
    const auto shift = [](TensorView view, std::int64_t rows, std::int64_t cols) {
      view.data = static_cast<char*>(view.data) + dtype_size(view.dtype);
      view.rows = rows;
      view.cols = cols;
      return view;
    };
    cpu->gemm(shift(a.cpu(), 31, 40), false, shift(b.cpu(), 40, 16), false, shift(c.cpu(), 31, 16), nullptr, false);
    gpu->gemm(shift(a.gpu(), 31, 40), false, shift(b.gpu(), 40, 16), false, shift(c.gpu(), 31, 16), nullptr, false);
    // The shifted output is elements [1, 1 + 31 * 16) of c.
    EXPECT_LE(relative_error(c.gpu_values(1, 1 + 31 * 16), c.cpu_values(1, 1 + 31 * 16)), tolerance(DType::f32))
        << dtype_name(dtype);
  }
}

TEST_F(CudaVsCpu, BiasGradient) {
  for (DType dtype : gpu_dtypes)
    for (bool accumulate : {false, true}) {
      auto dy = pair(dtype, 300, 150);
      dy.randomize(31);
      auto dbias = array(random_floats(150, 32));
      if (!accumulate) dbias.set(std::vector<float>(150, nan_float));
      cpu->bias_gradient(dy.cpu(), dbias.cpu(), DType::f32, accumulate);
      gpu->bias_gradient(dy.gpu(), dbias.gpu(), DType::f32, accumulate);
      EXPECT_LE(dbias.difference(), 1e-5) << dtype_name(dtype) << " accumulate " << accumulate;
    }
}

TEST_F(CudaVsCpu, ActivationsForwardAndBackward) {
  for (DType dtype : gpu_dtypes)
    for (Activation kind : all_activations) {
      auto x = pair(dtype, 67, 33), y = pair(dtype, 67, 33), dy = pair(dtype, 67, 33), dx = pair(dtype, 67, 33);
      x.randomize(41, -3.0, 3.0);
      dy.randomize(42);
      y.poison();
      dx.poison();
      cpu->activation_forward(kind, 0.05f, x.cpu(), y.cpu());
      gpu->activation_forward(kind, 0.05f, x.gpu(), y.gpu());
      EXPECT_LE(y.difference(), tolerance(dtype)) << dtype_name(dtype) << " kind " << static_cast<int>(kind);
      cpu->activation_backward(kind, 0.05f, x.cpu(), dy.cpu(), dx.cpu());
      gpu->activation_backward(kind, 0.05f, x.gpu(), dy.gpu(), dx.gpu());
      EXPECT_LE(dx.difference(), tolerance(dtype)) << dtype_name(dtype) << " kind " << static_cast<int>(kind);
      // In place (dx aliases dy), as layers run it.
      cpu->activation_backward(kind, 0.05f, x.cpu(), dy.cpu(), dy.cpu());
      gpu->activation_backward(kind, 0.05f, x.gpu(), dy.gpu(), dy.gpu());
      EXPECT_LE(dy.difference(), tolerance(dtype)) << "in place";
    }
}

TEST_F(CudaVsCpu, DropoutMasksAreIdentical) {
  const std::int64_t rows = 45, cols = 77;  // odd: groups of four straddle rows
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < rows; ++i) ids.push_back(1000003 * i % 7919 + 5000000000ll);
  auto sample_ids = array(ids);
  for (DType dtype : gpu_dtypes)
    for (float p : {0.1f, 0.5f}) {
      auto x = pair(dtype, rows, cols), y = pair(dtype, rows, cols);
      x.randomize(51, 0.5, 1.5);  // never zero: a dropped element is recognisable
      y.poison();
      cpu->dropout_forward(p, 1234, 17, 3, sample_ids.cpu(), x.cpu(), y.cpu());
      gpu->dropout_forward(p, 1234, 17, 3, sample_ids.gpu(), x.gpu(), y.gpu());
      EXPECT_TRUE(y.identical()) << dtype_name(dtype) << " p " << p;
      cpu->dropout_backward(p, 1234, 17, 3, sample_ids.cpu(), x.cpu(), x.cpu());  // in place
      gpu->dropout_backward(p, 1234, 17, 3, sample_ids.gpu(), x.gpu(), x.gpu());
      EXPECT_TRUE(x.identical()) << dtype_name(dtype) << " backward p " << p;
    }
}

TEST_F(CudaVsCpu, LayernormForwardAndBackward) {
  for (DType dtype : gpu_dtypes)
    for (std::int64_t cols : {7, 100, 1000})
      for (bool accumulate : {false, true}) {
        const std::int64_t rows = 37;
        auto x = pair(dtype, rows, cols), y = pair(dtype, rows, cols), dy = pair(dtype, rows, cols),
             dx = pair(dtype, rows, cols);
        x.randomize(61, -2.0, 3.0);
        dy.randomize(62);
        y.poison();
        dx.poison();
        auto gamma = array(random_floats(static_cast<std::size_t>(cols), 63, 0.5, 1.5));
        auto beta = array(random_floats(static_cast<std::size_t>(cols), 64));
        auto mean = array(std::vector<float>(static_cast<std::size_t>(rows), nan_float));
        auto rstd = array(std::vector<float>(static_cast<std::size_t>(rows), nan_float));
        auto dgamma = array(accumulate ? random_floats(static_cast<std::size_t>(cols), 65)
                                       : std::vector<float>(static_cast<std::size_t>(cols), nan_float));
        auto dbeta = array(accumulate ? random_floats(static_cast<std::size_t>(cols), 66)
                                      : std::vector<float>(static_cast<std::size_t>(cols), nan_float));
        cpu->layernorm_forward(x.cpu(), gamma.cpu(), beta.cpu(), 1e-5f, y.cpu(), mean.cpu(), rstd.cpu());
        gpu->layernorm_forward(x.gpu(), gamma.gpu(), beta.gpu(), 1e-5f, y.gpu(), mean.gpu(), rstd.gpu());
        const std::string where = std::string(dtype_name(dtype)) + " cols " + std::to_string(cols);
        EXPECT_LE(y.difference(), tolerance(dtype)) << where;
        EXPECT_LE(mean.difference(), 1e-5) << where;
        EXPECT_LE(rstd.difference(), 1e-5) << where;
        cpu->layernorm_backward(x.cpu(), dy.cpu(), gamma.cpu(), mean.cpu(), rstd.cpu(), dx.cpu(), dgamma.cpu(),
                                dbeta.cpu(), accumulate);
        gpu->layernorm_backward(x.gpu(), dy.gpu(), gamma.gpu(), mean.gpu(), rstd.gpu(), dx.gpu(), dgamma.gpu(),
                                dbeta.gpu(), accumulate);
        EXPECT_LE(dx.difference(), tolerance(dtype)) << where;
        EXPECT_LE(dgamma.difference(), 1e-5) << where;
        EXPECT_LE(dbeta.difference(), 1e-5) << where;
      }
}

TEST_F(CudaVsCpu, SoftmaxCrossEntropy) {
  for (DType dtype : gpu_dtypes)
    for (std::int64_t classes : {3, 10, 100}) {
      const std::int64_t rows = 70;
      auto logits = pair(dtype, rows, classes);
      logits.randomize(71, -4.0, 4.0);
      std::vector<std::int32_t> label_values;
      for (std::int64_t i = 0; i < rows; ++i)  // every ninth row a target not scored (sequence models' -100)
        label_values.push_back(i % 9 == 4 ? -100 : static_cast<std::int32_t>((i * 7 + 3) % classes));
      auto labels = array(label_values);
      auto scale = array(std::vector<float>{0.37f});
      auto sums = array(std::vector<LossSums>{LossSums{0.5, 2.0}});
      // Without the gradient, then with it written over the logits (as training does).
      cpu->softmax_cross_entropy(logits.cpu(), labels.cpu(), nullptr, TensorView{}, sums.cpu());
      gpu->softmax_cross_entropy(logits.gpu(), labels.gpu(), nullptr, TensorView{}, sums.gpu());
      cpu->softmax_cross_entropy(logits.cpu(), labels.cpu(), scale.cpu(), logits.cpu(), sums.cpu());
      gpu->softmax_cross_entropy(logits.gpu(), labels.gpu(), scale.gpu(), logits.gpu(), sums.gpu());
      const std::string where = std::string(dtype_name(dtype)) + " classes " + std::to_string(classes);
      EXPECT_LE(logits.difference(), tolerance(dtype)) << where;
      const LossSums want = sums.cpu_values()[0], got = sums.gpu_values()[0];
      EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * want.loss_sum) << where;
      EXPECT_EQ(got.correct, want.correct) << where;
    }
}

// Evaluation's argmax and top-5 hits (issue 16): the same counts as the CPU backend on scores with ties (integer
// grid), NaN scores (first and later in a row), ignored targets (-100) and targets on a row's tied maximum; counts
// NaN-poisoned before the overwriting call, then added to. 70,000 rows of 3 go past one grid of blocks; 300 rows of
// GPT-2's 50,304 classes are the real width.
TEST_F(CudaVsCpu, CountClassHits) {
  struct Shape {
    std::int64_t rows, cols;
  };
  for (DType dtype : gpu_dtypes)
    for (const Shape shape : {Shape{70, 37}, Shape{70000, 3}, Shape{300, 50304}}) {
      const std::string where =
          std::string(dtype_name(dtype)) + " " + std::to_string(shape.rows) + " x " + std::to_string(shape.cols);
      auto scores = pair(dtype, shape.rows, shape.cols);
      std::vector<double> values = random_values(static_cast<std::size_t>(shape.rows * shape.cols), 91, -4.5, 4.5);
      for (double& value : values) value = std::round(value);  // ties everywhere
      for (std::int64_t row = 0; row < shape.rows; row += 11)
        values[static_cast<std::size_t>(row * shape.cols + (row % 2 == 0 ? 0 : shape.cols - 1))] = std::nan("");
      scores.set(values);
      std::vector<std::int32_t> target_values;
      for (std::int64_t row = 0; row < shape.rows; ++row) {
        std::int64_t target = (row * 7 + 3) % shape.cols;
        if (row % 3 == 1)  // the row's maximum at its first or last index: ties decide
          for (std::int64_t k = 0; k < shape.cols; ++k)
            if (values[static_cast<std::size_t>(row * shape.cols + k)] >= 4.0) {
              target = k;
              if (row % 2 == 0) break;
            }
        target_values.push_back(row % 9 == 4 ? -100 : static_cast<std::int32_t>(target));
      }
      auto targets = array(target_values);
      auto counts = array(std::vector<double>(2, std::nan("")));
      cpu->count_class_hits(scores.cpu(), targets.cpu(), counts.cpu(), false);
      gpu->count_class_hits(scores.gpu(), targets.gpu(), counts.gpu(), false);
      const std::vector<double> want = counts.cpu_values();
      EXPECT_FALSE(std::isnan(want[0]) || std::isnan(want[1])) << where;
      EXPECT_GT(want[0], 0.0) << where;
      EXPECT_EQ(counts.gpu_values(), want) << where;
      cpu->count_class_hits(scores.cpu(), targets.cpu(), counts.cpu(), true);
      gpu->count_class_hits(scores.gpu(), targets.gpu(), counts.gpu(), true);
      EXPECT_EQ(counts.gpu_values(), counts.cpu_values()) << where;
      EXPECT_EQ(counts.gpu_values()[1], 2 * want[1]) << where;
    }
}

// predict's per-position scores (issue 16): the same argmax as the CPU backend, log p(target) within fp32 rounding
// (the double sum's order differs), NaN for ignored targets; outputs poisoned before the run.
TEST_F(CudaVsCpu, ScoreTargets) {
  for (DType dtype : gpu_dtypes)
    for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{70, 37}, {70000, 5}, {64, 50304}}) {
      const std::string where =
          std::string(dtype_name(dtype)) + " " + std::to_string(rows) + " x " + std::to_string(cols);
      auto logits = pair(dtype, rows, cols);
      std::vector<double> values = random_values(static_cast<std::size_t>(rows * cols), 93, -8.0, 8.0);
      for (std::size_t i = 0; i < values.size(); i += 2) values[i] = std::round(values[i]);  // tied maxima
      logits.set(values);
      std::vector<std::int32_t> target_values;
      for (std::int64_t row = 0; row < rows; ++row)
        target_values.push_back(row % 9 == 4 ? -100 : static_cast<std::int32_t>((row * 7 + 3) % cols));
      auto targets = array(target_values);
      auto argmax = array(std::vector<std::int32_t>(static_cast<std::size_t>(rows), -1));
      auto log_probability = array(std::vector<float>(static_cast<std::size_t>(rows), nan_float));
      cpu->score_targets(logits.cpu(), targets.cpu(), argmax.cpu(), log_probability.cpu());
      gpu->score_targets(logits.gpu(), targets.gpu(), argmax.gpu(), log_probability.gpu());
      EXPECT_EQ(argmax.gpu_values(), argmax.cpu_values()) << where;
      const std::vector<float> want = log_probability.cpu_values(), got = log_probability.gpu_values();
      double worst = 0.0;
      for (std::size_t row = 0; row < want.size(); ++row) {
        if (target_values[row] == -100) {
          EXPECT_TRUE(std::isnan(got[row]) && std::isnan(want[row])) << where << " row " << row;
          continue;
        }
        const double scale = std::max(std::abs(static_cast<double>(want[row])), 1e-3);
        worst = std::max(worst, std::abs(static_cast<double>(got[row]) - want[row]) / scale);
        ASSERT_FALSE(std::isnan(got[row])) << where << " row " << row;
      }
      EXPECT_LE(worst, 1e-6) << where;
    }
}

TEST_F(CudaVsCpu, MeanSquaredError) {
  for (DType dtype : gpu_dtypes) {
    const std::int64_t rows = 53, cols = 5;
    auto pred = pair(dtype, rows, cols);
    pred.randomize(81, -2.0, 2.0);
    auto targets = array(random_floats(static_cast<std::size_t>(rows * cols), 82));
    auto scale = array(std::vector<float>{1.7f});
    auto sums = array(std::vector<LossSums>{LossSums{0.25, 0.0}});
    cpu->mean_squared_error(pred.cpu(), targets.cpu(), scale.cpu(), pred.cpu(), sums.cpu());
    gpu->mean_squared_error(pred.gpu(), targets.gpu(), scale.gpu(), pred.gpu(), sums.gpu());
    EXPECT_LE(pred.difference(), tolerance(dtype)) << dtype_name(dtype);
    EXPECT_NEAR(sums.gpu_values()[0].loss_sum, sums.cpu_values()[0].loss_sum, 1e-5 * sums.cpu_values()[0].loss_sum);
  }
}

StepScalars scalars_with_scale(float loss_scale) {
  StepScalars scalars;
  scalars.loss_scale = loss_scale;
  scalars.learning_rate = 1e-2f;
  return scalars;
}

TEST_F(CudaVsCpu, SmoothedSoftmaxCrossEntropyAndWeightedGradientScale) {
  for (DType dtype : gpu_dtypes)
    for (std::int64_t classes : {3, 10, 100})
      for (const bool weighted : {true, false}) {
        const std::int64_t rows = 70;
        auto logits = pair(dtype, rows, classes);
        logits.randomize(73, -4.0, 4.0);
        std::vector<std::int32_t> label_values;
        for (std::int64_t i = 0; i < rows; ++i)
          label_values.push_back(static_cast<std::int32_t>((i * 7 + 3) % classes));
        auto labels = array(label_values);
        auto weights = array(random_floats(static_cast<std::size_t>(classes), 74, 0.2, 3.0));
        auto scale = array(std::vector<float>{0.37f});
        auto sums = array(std::vector<LossSums>{LossSums{0.5, 2.0}});
        const float smoothing = weighted ? 0.1f : 0.2f;
        const CrossEntropyOptions on_cpu{weighted ? weights.cpu() : nullptr, smoothing};
        const CrossEntropyOptions on_gpu{weighted ? weights.gpu() : nullptr, smoothing};
        cpu->smoothed_softmax_cross_entropy(logits.cpu(), labels.cpu(), on_cpu, nullptr, TensorView{}, sums.cpu());
        gpu->smoothed_softmax_cross_entropy(logits.gpu(), labels.gpu(), on_gpu, nullptr, TensorView{}, sums.gpu());
        cpu->smoothed_softmax_cross_entropy(logits.cpu(), labels.cpu(), on_cpu, scale.cpu(), logits.cpu(), sums.cpu());
        gpu->smoothed_softmax_cross_entropy(logits.gpu(), labels.gpu(), on_gpu, scale.gpu(), logits.gpu(), sums.gpu());
        const std::string where = std::string(dtype_name(dtype)) + " classes " + std::to_string(classes) +
                                  (weighted ? " weighted" : " unweighted");
        EXPECT_LE(logits.difference(), tolerance(dtype)) << where;
        const LossSums want = sums.cpu_values()[0], got = sums.gpu_values()[0];
        EXPECT_TRUE(std::isfinite(got.loss_sum)) << where;
        EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * want.loss_sum) << where;
        EXPECT_EQ(got.correct, want.correct) << where;
      }
  // The loss gradient's factor divides by the labels' weights in memory when given (rows otherwise).
  auto scalars = array(std::vector<StepScalars>{scalars_with_scale(1024.0f)});
  auto label_weights = array(std::vector<float>{37.5f});
  auto factor = array(std::vector<float>{nan_float});
  for (const bool weighted : {true, false}) {
    cpu->loss_gradient_scale(scalars.cpu(), 64.0f, weighted ? label_weights.cpu() : nullptr, factor.cpu());
    gpu->loss_gradient_scale(scalars.gpu(), 64.0f, weighted ? label_weights.gpu() : nullptr, factor.gpu());
    EXPECT_EQ(factor.gpu_values()[0], factor.cpu_values()[0]);
    EXPECT_EQ(factor.cpu_values()[0], 1024.0f / (weighted ? 37.5f : 64.0f));
  }
}

TEST_F(CudaVsCpu, GradientStatisticsNormNonFiniteAndDeterminism) {
  auto gradients_values = random_floats(3 * 4096 + 123, 91, -1000.0, 1000.0);
  auto gradients = array(gradients_values);
  OptimizerHyper hyper;
  hyper.max_grad_norm = 1.0f;
  auto scalars = array(std::vector<StepScalars>{scalars_with_scale(1024.0f)});
  const auto count = static_cast<std::int64_t>(gradients_values.size());
  cpu->gradient_statistics(gradients.cpu(), count, hyper, scalars.cpu());
  gpu->gradient_statistics(gradients.gpu(), count, hyper, scalars.gpu());
  StepScalars want = scalars.cpu_values()[0], got = scalars.gpu_values()[0];
  EXPECT_EQ(got.found_nonfinite, 0);
  EXPECT_NEAR(got.grad_norm, want.grad_norm, 1e-6 * want.grad_norm);
  EXPECT_NEAR(got.clip_coefficient, want.clip_coefficient, 1e-6 * want.clip_coefficient);
  gpu->gradient_statistics(gradients.gpu(), count, hyper, scalars.gpu());
  EXPECT_EQ(scalars.gpu_values()[0].grad_norm, got.grad_norm) << "two runs must agree bit for bit";

  for (const float bad : {nan_float, std::numeric_limits<float>::infinity()})
    for (const std::size_t position : {std::size_t{0}, std::size_t{5000}, gradients_values.size() - 1}) {
      auto broken = gradients_values;
      broken[position] = bad;
      gradients.set(broken);
      gpu->gradient_statistics(gradients.gpu(), count, hyper, scalars.gpu());
      EXPECT_EQ(scalars.gpu_values()[0].found_nonfinite, 1) << bad << " at " << position;
      EXPECT_EQ(scalars.gpu_values()[0].clip_coefficient, 1.0f);
    }
}

// Several optimizer steps on both backends from the same state: parameters, states and working copy agree.
void compare_optimizer(Backend& cpu, Backend& gpu, const OptimizerHyper& hyper, DType working_dtype, bool decay) {
  const std::size_t count = 5000;
  ArrayPair<float> parameters(cpu, gpu, random_floats(count, 101));
  ArrayPair<float> gradients(cpu, gpu, random_floats(count, 102, -500.0, 500.0));
  ArrayPair<float> state1(cpu, gpu, std::vector<float>(count, 0.0f));
  ArrayPair<float> state2(cpu, gpu, std::vector<float>(count, 0.0f));
  TensorPair working(cpu, gpu, working_dtype, 1, static_cast<std::int64_t>(count));
  working.poison();
  ArrayPair<StepScalars> scalars(cpu, gpu, {scalars_with_scale(256.0f)});
  LossScalerConfig scaler;
  scaler.enabled = true;
  scaler.growth_interval = 2;
  for (int step = 0; step < 4; ++step) {
    gradients.set(random_floats(count, 200 + static_cast<std::uint64_t>(step), -500.0, 500.0));
    for (Backend* backend : {&cpu, &gpu}) {
      const bool on_gpu = backend == &gpu;
      StepScalars* s = on_gpu ? scalars.gpu() : scalars.cpu();
      backend->gradient_statistics(on_gpu ? gradients.gpu() : gradients.cpu(), static_cast<std::int64_t>(count), hyper,
                                   s);
      backend->optimizer_step(hyper, decay, on_gpu ? parameters.gpu() : parameters.cpu(),
                              on_gpu ? gradients.gpu() : gradients.cpu(), on_gpu ? state1.gpu() : state1.cpu(),
                              hyper.type == OptimizerType::adamw ? (on_gpu ? state2.gpu() : state2.cpu()) : nullptr,
                              static_cast<std::int64_t>(count), on_gpu ? working.gpu() : working.cpu(), s);
      backend->finish_step(scaler, s);
    }
  }
  const std::string where = std::string(hyper.type == OptimizerType::adamw ? "adamw" : "sgd") + " working " +
                            dtype_name(working_dtype) + " decay " + std::to_string(decay);
  EXPECT_LE(parameters.difference(), 1e-5) << where;
  EXPECT_LE(state1.difference(), 1e-5) << where;
  if (hyper.type == OptimizerType::adamw) EXPECT_LE(state2.difference(), 1e-5) << where;
  EXPECT_LE(working.difference(), tolerance(working_dtype)) << where;
  EXPECT_EQ(scalars.gpu_values()[0].applied_steps, scalars.cpu_values()[0].applied_steps) << where;
}

TEST_F(CudaVsCpu, OptimizerSteps) {
  OptimizerHyper adamw;
  adamw.weight_decay = 0.1f;
  adamw.max_grad_norm = 2.0f;
  OptimizerHyper sgd;
  sgd.type = OptimizerType::sgd;
  sgd.momentum = 0.9f;
  sgd.nesterov = true;
  sgd.weight_decay = 1e-3f;
  for (const OptimizerHyper& hyper : {adamw, sgd})
    for (DType working : gpu_dtypes)
      for (bool decay : {false, true}) compare_optimizer(*cpu, *gpu, hyper, working, decay);
}

TEST_F(CudaVsCpu, OptimizerSkipsOnNonFiniteGradients) {
  auto parameters = array(random_floats(1000, 111));
  auto gradients = array(random_floats(1000, 112));
  auto state1 = array(std::vector<float>(1000, 0.0f));
  auto state2 = array(std::vector<float>(1000, 0.0f));
  StepScalars skipped = scalars_with_scale(1.0f);
  skipped.found_nonfinite = 1;
  auto scalars = array(std::vector<StepScalars>{skipped});
  const auto before = parameters.gpu_values();
  gpu->optimizer_step(OptimizerHyper{}, true, parameters.gpu(), gradients.gpu(), state1.gpu(), state2.gpu(), 1000,
                      TensorView{}, scalars.gpu());
  EXPECT_EQ(parameters.gpu_values(), before);
}

// The scaler on the device against the CPU scaler on the same pattern of non-finite steps.
TEST_F(CudaVsCpu, LossScalerTrajectoryIsIdentical) {
  LossScalerConfig config;
  config.enabled = true;
  config.growth_interval = 3;
  auto finite = random_floats(10000, 121);
  auto broken = finite;
  broken[777] = std::numeric_limits<float>::infinity();
  auto gradients = array(finite);
  auto scalars = array(std::vector<StepScalars>{scalars_with_scale(65536.0f)});
  const std::vector<int> pattern = {0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
  for (std::size_t step = 0; step < pattern.size(); ++step) {
    gradients.set(pattern[step] ? broken : finite);
    cpu->gradient_statistics(gradients.cpu(), 10000, OptimizerHyper{}, scalars.cpu());
    cpu->finish_step(config, scalars.cpu());
    gpu->gradient_statistics(gradients.gpu(), 10000, OptimizerHyper{}, scalars.gpu());
    gpu->finish_step(config, scalars.gpu());
    const StepScalars want = scalars.cpu_values()[0], got = scalars.gpu_values()[0];
    EXPECT_EQ(got.loss_scale, want.loss_scale) << "step " << step;
    EXPECT_EQ(got.growth_tracker, want.growth_tracker) << "step " << step;
    EXPECT_EQ(got.found_nonfinite, want.found_nonfinite) << "step " << step;
    EXPECT_EQ(got.applied_steps, want.applied_steps) << "step " << step;
    EXPECT_EQ(got.consecutive_skips, want.consecutive_skips) << "step " << step;
  }
}

// ---- convolutional networks ----

// Weight and bias gradients are fp32 whatever the storage; 16-bit inputs are exact in fp32, so only the summation
// order differs from the CPU.
double gradient_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-4; }

// Grouped, strided, padded, dilated (output 5 x 7); and a same-size 3x3x3.
SpatialGeometry convolution_2d() {
  return make_geometry(2, 6, 8, 2, {9, 7, 0}, {3, 2, 0}, {2, 1, 0}, {1, 1, 0}, {1, 2, 0});
}
SpatialGeometry convolution_3d() {
  return make_geometry(3, 4, 5, 1, {5, 6, 4}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1});
}

// The convolutions need cuDNN; a build without it keeps them NotSupported and the model refuses CNN decks on CUDA.
TEST_F(CudaVsCpu, HasSpatialOperationsWithCudnn) {
#if defined(HPCTRAIN_HAVE_CUDNN)
  EXPECT_TRUE(gpu->has_spatial_operations());
#else
  EXPECT_EQ(gpu->has_spatial_operations(), self_check());
#endif
}

// Both layouts (issue 15, item 11: 16-bit models run channels-last, NHWC / NDHWC descriptors and KRSC filters, the
// bias fused into the forward where cuDNN takes IMPLICIT_PRECOMP_GEMM, 16-bit inputs into fp32 weight gradients),
// poisoned outputs, against the CPU in the same layout.
TEST_F(CudaVsCpu, ConvolutionForwardAndBackward) {
  if (!gpu->has_spatial_operations()) GTEST_SKIP() << "built without cuDNN";
  for (SpatialGeometry g : {convolution_2d(), convolution_3d()})
    for (SpatialLayout layout : {SpatialLayout::channels_first, SpatialLayout::channels_last})
      for (DType dtype : gpu_dtypes)
        for (bool with_bias : {false, true})
          for (bool accumulate : {false, true}) {
            g.layout = layout;
            const std::int64_t rows = 3;
            const std::int64_t weights = g.out_channels * g.in_channels / g.groups * g.kernel_size();
            auto x = pair(dtype, rows, g.in_channels * g.input_size());
            auto y = pair(dtype, rows, g.out_channels * g.output_size());
            auto dy = pair(dtype, rows, g.out_channels * g.output_size());
            auto dx = pair(dtype, rows, g.in_channels * g.input_size());
            auto w = pair(dtype, g.out_channels, weights / g.out_channels);
            x.randomize(71);
            dy.randomize(72);
            w.randomize(73, -0.5, 0.5);
            y.poison();
            dx.poison();
            auto bias = array(random_floats(static_cast<std::size_t>(g.out_channels), 74));
            const auto count = static_cast<std::size_t>(weights);
            auto dw = array(accumulate ? random_floats(count, 75) : std::vector<float>(count, nan_float));
            auto dbias = array(accumulate ? random_floats(static_cast<std::size_t>(g.out_channels), 76)
                                          : std::vector<float>(static_cast<std::size_t>(g.out_channels), nan_float));
            const std::string where = std::to_string(g.dimensions) + "-D " + dtype_name(dtype) +
                                      (layout == SpatialLayout::channels_last ? " channels-last" : " channels-first") +
                                      " bias " + std::to_string(with_bias) + " accumulate " +
                                      std::to_string(accumulate);
            cpu->convolution_forward(g, x.cpu(), w.cpu(), with_bias ? bias.cpu() : nullptr, y.cpu());
            gpu->convolution_forward(g, x.gpu(), w.gpu(), with_bias ? bias.gpu() : nullptr, y.gpu());
            EXPECT_LE(y.difference(), tolerance(dtype)) << where;
            cpu->convolution_backward_data(g, dy.cpu(), w.cpu(), dx.cpu());
            gpu->convolution_backward_data(g, dy.gpu(), w.gpu(), dx.gpu());
            EXPECT_LE(dx.difference(), tolerance(dtype)) << where;
            const TensorView dw_cpu{dw.cpu(), DType::f32, g.out_channels, weights / g.out_channels};
            const TensorView dw_gpu{dw.gpu(), DType::f32, g.out_channels, weights / g.out_channels};
            cpu->convolution_backward_weights(g, x.cpu(), dy.cpu(), dw_cpu, with_bias ? dbias.cpu() : nullptr,
                                              accumulate);
            gpu->convolution_backward_weights(g, x.gpu(), dy.gpu(), dw_gpu, with_bias ? dbias.gpu() : nullptr,
                                              accumulate);
            EXPECT_LE(dw.difference(), gradient_tolerance(dtype)) << where;
            if (with_bias) EXPECT_LE(dbias.difference(), gradient_tolerance(dtype)) << where;
          }
}

// Weights are views at any offset of the flat parameter buffers: an element off 16-byte alignment.
TEST_F(CudaVsCpu, ConvolutionOnUnalignedWeights) {
  if (!gpu->has_spatial_operations()) GTEST_SKIP() << "built without cuDNN";
  SpatialGeometry g = convolution_2d();
  const std::int64_t rows = 2, per_out = g.in_channels / g.groups * g.kernel_size();
  for (SpatialLayout layout : {SpatialLayout::channels_first, SpatialLayout::channels_last})
    for (DType dtype : gpu_dtypes) {
      g.layout = layout;
      auto x = pair(dtype, rows, g.in_channels * g.input_size()),
           y = pair(dtype, rows, g.out_channels * g.output_size());
      auto w = pair(dtype, 1, g.out_channels * per_out + 1);
      x.randomize(81);
      w.randomize(82, -0.5, 0.5);
      y.poison();
      const auto shifted = [&](const TensorView& all) {
        return TensorView{static_cast<char*>(all.data) + dtype_size(dtype), dtype, g.out_channels, per_out};
      };
      cpu->convolution_forward(g, x.cpu(), shifted(w.cpu()), nullptr, y.cpu());
      gpu->convolution_forward(g, x.gpu(), shifted(w.gpu()), nullptr, y.gpu());
      EXPECT_LE(y.difference(), tolerance(dtype)) << dtype_name(dtype) << " layout " << static_cast<int>(layout);
      const std::size_t count = static_cast<std::size_t>(g.out_channels * per_out) + 1;
      auto dw = array(random_floats(count, 83));
      auto dy = pair(dtype, rows, g.out_channels * g.output_size());
      dy.randomize(84);
      const auto shifted_gradient = [&](float* all) {
        return TensorView{all + 1, DType::f32, g.out_channels, per_out};
      };
      cpu->convolution_backward_weights(g, x.cpu(), dy.cpu(), shifted_gradient(dw.cpu()), nullptr, true);
      gpu->convolution_backward_weights(g, x.gpu(), dy.gpu(), shifted_gradient(dw.gpu()), nullptr, true);
      EXPECT_LE(dw.difference(), gradient_tolerance(dtype))
          << dtype_name(dtype) << " layout " << static_cast<int>(layout);
    }
}

// The layout the model runs conv stacks in (channels-last for 16-bit with cuDNN), and the conversion it runs on the
// way in and at flatten, bit for bit (a permutation).
TEST_F(CudaVsCpu, SpatialLayoutChoiceAndConversion) {
  if (!self_check()) {
    const bool cudnn = gpu->has_spatial_operations();
    EXPECT_EQ(gpu->preferred_spatial_layout(DType::bf16),
              cudnn ? SpatialLayout::channels_last : SpatialLayout::channels_first);
    EXPECT_EQ(gpu->preferred_spatial_layout(DType::f16),
              cudnn ? SpatialLayout::channels_last : SpatialLayout::channels_first);
    EXPECT_EQ(gpu->preferred_spatial_layout(DType::f32), SpatialLayout::channels_first);
  }
  const std::int64_t rows = 5, channels = 6, positions = 7 * 9;
  for (DType dtype : gpu_dtypes)
    for (SpatialLayout from : {SpatialLayout::channels_first, SpatialLayout::channels_last}) {
      auto x = pair(dtype, rows, channels * positions), y = pair(dtype, rows, channels * positions);
      x.randomize(111);
      y.poison();
      cpu->convert_spatial_layout(channels, from, x.cpu(), y.cpu());
      gpu->convert_spatial_layout(channels, from, x.gpu(), y.gpu());
      EXPECT_TRUE(y.identical()) << dtype_name(dtype) << " from " << static_cast<int>(from);
    }
}

SpatialGeometry pooling(int dimensions, std::array<std::int64_t, 3> input, std::int64_t kernel, std::int64_t stride,
                        std::int64_t padding) {
  const auto same = [dimensions](std::int64_t value) {
    return std::array<std::int64_t, 3>{value, value, dimensions == 3 ? value : 0};
  };
  return make_geometry(dimensions, 3, 3, 1, input, same(kernel), same(stride), same(padding), same(1));
}

TEST_F(CudaVsCpu, PoolingForwardAndBackward) {
  SpatialGeometry global = pooling(2, {6, 5, 0}, 1, 1, 0);  // global average: the kernel is the whole plane
  global.kernel = {6, 5, 0};
  global.output = {1, 1, 0};
  const SpatialGeometry geometries[] = {pooling(2, {9, 8, 0}, 3, 2, 1), pooling(3, {4, 4, 6}, 2, 2, 0),
                                        pooling(3, {5, 4, 5}, 3, 2, 1), global};
  for (SpatialGeometry g : geometries)
    for (SpatialLayout layout : {SpatialLayout::channels_first, SpatialLayout::channels_last})
      for (PoolingKind kind : {PoolingKind::max, PoolingKind::average})
        for (DType dtype : gpu_dtypes) {
          g.layout = layout;
          const std::int64_t rows = 4;
          auto x = pair(dtype, rows, g.in_channels * g.input_size()),
               dx = pair(dtype, rows, g.in_channels * g.input_size());
          auto y = pair(dtype, rows, g.out_channels * g.output_size()),
               dy = pair(dtype, rows, g.out_channels * g.output_size());
          // Quarter steps: windows hold ties, so the first-maximum rule is exercised.
          auto values = x.randomize(91, -2.0, 2.0);
          for (double& value : values) value = std::round(value * 4.0) / 4.0;
          x.set(values);
          dy.randomize(92);
          y.poison();
          dx.poison();
          const std::string where = std::to_string(g.dimensions) + "-D kernel " + std::to_string(g.kernel[0]) +
                                    (kind == PoolingKind::max ? " max " : " average ") + dtype_name(dtype) +
                                    (layout == SpatialLayout::channels_last ? " channels-last" : "");
          cpu->pooling_forward(kind, g, x.cpu(), y.cpu());
          gpu->pooling_forward(kind, g, x.gpu(), y.gpu());
          cpu->pooling_backward(kind, g, x.cpu(), dy.cpu(), dx.cpu());
          gpu->pooling_backward(kind, g, x.gpu(), dy.gpu(), dx.gpu());
          if (kind == PoolingKind::max) {  // a choice and the same additions in the same order: bit for bit
            EXPECT_TRUE(y.identical()) << where;
            EXPECT_TRUE(dx.identical()) << where;
          } else {
            EXPECT_LE(y.difference(), tolerance(dtype)) << where;
            EXPECT_LE(dx.difference(), tolerance(dtype)) << where;
          }
        }
}

TEST_F(CudaVsCpu, GroupnormForwardAndBackward) {
  const std::int64_t rows = 5, channels = 8, spatial = 37;
  for (SpatialLayout layout : {SpatialLayout::channels_first, SpatialLayout::channels_last})
    for (DType dtype : gpu_dtypes)
      for (std::int64_t groups : {1, 4, 8})
        for (bool accumulate : {false, true}) {
          const std::int64_t cols = channels * spatial;
          auto x = pair(dtype, rows, cols), y = pair(dtype, rows, cols), dy = pair(dtype, rows, cols),
               dx = pair(dtype, rows, cols);
          x.randomize(101, -2.0, 3.0);
          dy.randomize(102);
          y.poison();
          dx.poison();
          const auto c = static_cast<std::size_t>(channels), blocks = static_cast<std::size_t>(rows * groups);
          auto gamma = array(random_floats(c, 103, 0.5, 1.5));
          auto beta = array(random_floats(c, 104));
          auto mean = array(std::vector<float>(blocks, nan_float));
          auto rstd = array(std::vector<float>(blocks, nan_float));
          auto dgamma = array(accumulate ? random_floats(c, 105) : std::vector<float>(c, nan_float));
          auto dbeta = array(accumulate ? random_floats(c, 106) : std::vector<float>(c, nan_float));
          const std::string where = std::string(dtype_name(dtype)) + " groups " + std::to_string(groups) +
                                    (layout == SpatialLayout::channels_last ? " channels-last" : "");
          cpu->groupnorm_forward(channels, groups, layout, x.cpu(), gamma.cpu(), beta.cpu(), 1e-5f, y.cpu(), mean.cpu(),
                                 rstd.cpu());
          gpu->groupnorm_forward(channels, groups, layout, x.gpu(), gamma.gpu(), beta.gpu(), 1e-5f, y.gpu(), mean.gpu(),
                                 rstd.gpu());
          EXPECT_LE(y.difference(), tolerance(dtype)) << where;
          EXPECT_LE(mean.difference(), 1e-5) << where;
          EXPECT_LE(rstd.difference(), 1e-5) << where;
          cpu->groupnorm_backward(channels, groups, layout, x.cpu(), dy.cpu(), gamma.cpu(), mean.cpu(), rstd.cpu(),
                                  dx.cpu(), dgamma.cpu(), dbeta.cpu(), accumulate);
          gpu->groupnorm_backward(channels, groups, layout, x.gpu(), dy.gpu(), gamma.gpu(), mean.gpu(), rstd.gpu(),
                                  dx.gpu(), dgamma.gpu(), dbeta.gpu(), accumulate);
          EXPECT_LE(dx.difference(), tolerance(dtype)) << where;
          EXPECT_LE(dgamma.difference(), 1e-5) << where;
          EXPECT_LE(dbeta.difference(), 1e-5) << where;
        }
}

// to_sequence (vision transformers): the same fp32 additions in the same order on both backends (the position row
// added before the one rounding; the parameter gradients summed over the rows in row order from zero), so identical
// results; both layouts, class token and position table on and off, accumulate on and off.
TEST_F(CudaVsCpu, ToSequenceForwardAndBackward) {
  const std::int64_t rows = 37, channels = 48, spatial = 7 * 9;
  for (DType dtype : gpu_dtypes)
    for (SpatialLayout layout : {SpatialLayout::channels_first, SpatialLayout::channels_last})
      for (bool class_token : {false, true})
        for (bool positions : {false, true}) {
          const std::string where = std::string(dtype_name(dtype)) +
                                    (layout == SpatialLayout::channels_last ? " channels-last" : " channels-first") +
                                    (class_token ? ", class token" : "") + (positions ? ", positions" : "");
          const std::int64_t sequence = spatial + (class_token ? 1 : 0);
          const auto c = static_cast<std::size_t>(channels), table_count = static_cast<std::size_t>(sequence) * c;
          auto x = pair(dtype, rows, channels * spatial);
          x.randomize(201);
          auto token = array(random_floats(c, 202));
          auto table = array(random_floats(table_count, 203));
          auto y = pair(dtype, rows, sequence * channels);
          y.poison();
          cpu->to_sequence_forward(channels, layout, x.cpu(), class_token ? token.cpu() : nullptr,
                                   positions ? table.cpu() : nullptr, y.cpu());
          gpu->to_sequence_forward(channels, layout, x.gpu(), class_token ? token.gpu() : nullptr,
                                   positions ? table.gpu() : nullptr, y.gpu());
          EXPECT_TRUE(y.identical()) << "forward, " << where;

          auto dy = pair(dtype, rows, sequence * channels);
          dy.randomize(204);
          auto dx = pair(dtype, rows, channels * spatial);
          for (bool accumulate : {false, true}) {
            auto dtoken = array(accumulate ? random_floats(c, 205) : std::vector<float>(c, nan_float));
            auto dtable =
                array(accumulate ? random_floats(table_count, 206) : std::vector<float>(table_count, nan_float));
            dx.poison();
            cpu->to_sequence_backward(channels, layout, dy.cpu(), dx.cpu(), class_token ? dtoken.cpu() : nullptr,
                                      positions ? dtable.cpu() : nullptr, accumulate);
            gpu->to_sequence_backward(channels, layout, dy.gpu(), dx.gpu(), class_token ? dtoken.gpu() : nullptr,
                                      positions ? dtable.gpu() : nullptr, accumulate);
            EXPECT_TRUE(dx.identical()) << "dx, " << where;
            if (class_token) {
              EXPECT_EQ(dtoken.gpu_values(), dtoken.cpu_values()) << "dclass_token, " << where;
              EXPECT_FALSE(std::isnan(dtoken.gpu_values()[0])) << where;
            }
            if (positions) {
              EXPECT_EQ(dtable.gpu_values(), dtable.cpu_values()) << "dposition, " << where;
              EXPECT_FALSE(std::isnan(dtable.gpu_values().back())) << where;
            }
          }
        }
}

TEST_F(CudaVsCpu, Fp64IsRefusedClearly) {
  if (self_check()) GTEST_SKIP() << "the CPU backend supports fp64";
  TestTensor x(*gpu, DType::f64, 2, 2), y(*gpu, DType::f64, 2, 2);
  EXPECT_THROW(gpu->activation_forward(Activation::relu, 0.0f, x.view(), y.view()), NotSupported);
  EXPECT_THROW(gpu->groupnorm_forward(1, 1, SpatialLayout::channels_first, x.view(), nullptr, nullptr, 1e-5f, y.view(),
                                      nullptr, nullptr),
               NotSupported);
}

}  // namespace
}  // namespace hpctrain
