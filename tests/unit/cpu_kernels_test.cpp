// Tests of the CPU backend's kernels other than gemm (cpu_gemm_test.cpp) and the optimizer's
// (cpu_optimizer_kernels_test.cpp): every kernel in every storage dtype on random inputs, with outputs poisoned with
// NaN, against double references written here; finite-difference checks in f64 of every backward (activations,
// layernorm, softmax cross-entropy, mean squared error, dropout); dropout's mask properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/math.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

using namespace test_support;
namespace km = kernel_math;

constexpr Activation all_activations[] = {Activation::relu, Activation::gelu, Activation::tanh, Activation::leaky_relu,
                                          Activation::gelu_tanh};
constexpr float leaky_alpha = 0.05f;

// Error of a value computed (not only stored) in the compute type: fp32 arithmetic, or fp64 for f64.
double compute_tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }

class CpuKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend();
  TestTensor tensor(DType dtype, std::int64_t rows, std::int64_t cols) { return {*backend, dtype, rows, cols}; }
};

// ---- memory ----

TEST_F(CpuKernels, MemoryIsAlignedAndCopiesRoundTrip) {
  for (std::size_t bytes : {std::size_t{1}, std::size_t{3}, std::size_t{64}, std::size_t{1000}, std::size_t{1} << 20}) {
    void* first = backend->allocate(bytes);
    void* second = backend->allocate(bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % 64, 0u);
    std::vector<unsigned char> in(bytes), out(bytes, 0);
    for (std::size_t i = 0; i < bytes; ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
    backend->copy_to_backend(first, in.data(), bytes);
    backend->copy(second, first, bytes);
    backend->synchronize();
    backend->copy_to_host(out.data(), second, bytes);
    EXPECT_EQ(in, out);
    backend->zero(second, bytes);
    backend->copy_to_host(out.data(), second, bytes);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](unsigned char c) { return c == 0; }));
    backend->deallocate(first);
    backend->deallocate(second);
  }
  EXPECT_EQ(backend->name(), "cpu");
}

// ---- cast ----

TEST_F(CpuKernels, CastBetweenEveryPairOfDtypes) {
  for (DType from : all_dtypes)
    for (DType to : all_dtypes) {
      auto source = tensor(from, 5, 7);
      auto destination = tensor(to, 5, 7);
      const auto values = source.randomize(11, -300.0, 300.0);
      destination.poison();
      backend->cast(source.view(), destination.view());
      // conversions round once to the destination (f64 -> 16 bit goes through fp32, as the helper does)
      EXPECT_EQ(destination.get(), quantized(to, values)) << dtype_name(from) << " -> " << dtype_name(to);
    }
}

// ---- bias gradient ----

TEST_F(CpuKernels, BiasGradientSumsColumns) {
  for (DType dtype : all_dtypes) {
    const std::int64_t rows = 9, cols = 150;  // more than one block of columns
    auto dy = tensor(dtype, rows, cols);
    auto dbias = tensor(master_of(dtype), 1, cols);
    const auto dy_values = dy.randomize(21);
    std::vector<double> want(cols, 0.0);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) want[j] += dy_values[i * cols + j];
    dbias.poison();
    backend->bias_gradient(dy.view(), dbias.data(), master_of(dtype), false);
    EXPECT_LE(relative_error(dbias.get(), want), compute_tolerance(dtype)) << dtype_name(dtype);
    const auto old = dbias.randomize(22);
    backend->bias_gradient(dy.view(), dbias.data(), master_of(dtype), true);
    for (std::int64_t j = 0; j < cols; ++j) want[j] += old[j];
    EXPECT_LE(relative_error(dbias.get(), want), compute_tolerance(dtype)) << dtype_name(dtype) << " accumulate";
  }
}

// ---- activations ----

TEST_F(CpuKernels, ActivationForwardAndBackwardInEveryDtype) {
  for (DType dtype : all_dtypes)
    for (Activation kind : all_activations) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " activation " << static_cast<int>(kind));
      auto x = tensor(dtype, 13, 29);
      auto y = tensor(dtype, 13, 29);
      auto dy = tensor(dtype, 13, 29);
      auto dx = tensor(dtype, 13, 29);
      const auto x_values = x.randomize(31, -4.0, 4.0);
      const auto dy_values = dy.randomize(32);
      std::vector<double> want_y(x_values.size()), want_dx(x_values.size());
      for (std::size_t i = 0; i < x_values.size(); ++i) {
        want_y[i] = km::activation_value<double>(kind, leaky_alpha, x_values[i]);
        want_dx[i] = km::activation_derivative<double>(kind, leaky_alpha, x_values[i]) * dy_values[i];
      }
      y.poison();
      dx.poison();
      backend->activation_forward(kind, leaky_alpha, x.view(), y.view());
      backend->activation_backward(kind, leaky_alpha, x.view(), dy.view(), dx.view());
      EXPECT_LE(relative_error(y.get(), want_y), tolerance(dtype));
      EXPECT_LE(relative_error(dx.get(), want_dx), tolerance(dtype));
      // in place: dx over dy
      backend->activation_backward(kind, leaky_alpha, x.view(), dy.view(), dy.view());
      EXPECT_EQ(dy.get(), dx.get());
    }
}

TEST_F(CpuKernels, ActivationBackwardMatchesFiniteDifferences) {
  for (Activation kind : all_activations) {
    auto x = tensor(DType::f64, 4, 6), y = tensor(DType::f64, 4, 6), r = tensor(DType::f64, 4, 6);
    auto dx = tensor(DType::f64, 4, 6);
    auto x_values = away_from(random_values(24, 41, -3.0, 3.0), 0.0, 1e-2);  // no finite differences across kinks
    const auto r_values = r.randomize(42);
    const auto objective = [&]() {
      x.set(x_values);
      backend->activation_forward(kind, leaky_alpha, x.view(), y.view());
      return dot(y.get(), r_values);
    };
    const auto numeric = central_differences(x_values, 1e-5, objective);
    x.set(x_values);
    dx.poison();
    backend->activation_backward(kind, leaky_alpha, x.view(), r.view(), dx.view());
    EXPECT_LE(relative_error(dx.get(), numeric), 1e-6) << "activation " << static_cast<int>(kind);
  }
}

// ---- dropout ----

struct DropoutCase {
  float p = 0.3f;
  std::uint64_t seed = 42;
  std::uint32_t step = 3, layer = 1;
};

std::vector<double> reference_dropout(const DropoutCase& c, const std::vector<std::int64_t>& sample_ids,
                                      std::int64_t cols, const std::vector<double>& in) {
  std::vector<double> out(in.size());
  for (std::size_t row = 0; row < sample_ids.size(); ++row)
    for (std::int64_t col = 0; col < cols; ++col) {
      const std::uint64_t element = static_cast<std::uint64_t>(sample_ids[row] * cols + col);
      const bool keep = km::dropout_keep(c.seed, c.step, c.layer, element, c.p);
      out[row * cols + col] = keep ? in[row * cols + col] / (1.0 - c.p) : 0.0;
    }
  return out;
}

std::vector<std::int64_t> consecutive_ids(std::int64_t first, std::int64_t count) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(count));
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

TEST_F(CpuKernels, DropoutForwardAndBackwardInEveryDtype) {
  const DropoutCase c;
  const std::int64_t rows = 12, cols = 37;  // cols not a multiple of 4: groups of four straddle rows
  const auto ids = consecutive_ids(1000, rows);
  TestArray<std::int64_t> sample_ids(*backend, ids);
  for (DType dtype : all_dtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto x = tensor(dtype, rows, cols), y = tensor(dtype, rows, cols);
    auto dy = tensor(dtype, rows, cols), dx = tensor(dtype, rows, cols);
    const auto x_values = x.randomize(51, 0.5, 2.0);  // never zero, so zeros in y are dropped elements
    const auto dy_values = dy.randomize(52, 0.5, 2.0);
    y.poison();
    dx.poison();
    backend->dropout_forward(c.p, c.seed, c.step, c.layer, sample_ids.data(), x.view(), y.view());
    backend->dropout_backward(c.p, c.seed, c.step, c.layer, sample_ids.data(), dy.view(), dx.view());
    const auto y_values = y.get(), dx_values = dx.get();
    EXPECT_LE(relative_error(y_values, reference_dropout(c, ids, cols, x_values)), tolerance(dtype));
    EXPECT_LE(relative_error(dx_values, reference_dropout(c, ids, cols, dy_values)), tolerance(dtype));
    for (std::size_t i = 0; i < y_values.size(); ++i)
      ASSERT_EQ(y_values[i] == 0.0, dx_values[i] == 0.0) << "backward mask differs at " << i;
    // in place (y over x) gives the same result
    backend->dropout_forward(c.p, c.seed, c.step, c.layer, sample_ids.data(), x.view(), x.view());
    EXPECT_EQ(x.get(), y_values);
  }
}

// The kernel draws its mask 64 elements per vectorised Philox call: every element's decision and value must be exactly
// those of math.hpp's scalar dropout_keep, for rows of odd lengths that start anywhere in a group of four, across
// several calls per row, and for element indices whose groups cross 2^32 (the counter's high word).
TEST_F(CpuKernels, DropoutMaskIsExactlyTheScalarOne) {
  const DropoutCase c{0.4f, 1234, 17, 5};
  const float scale = 1.0f / (1.0f - c.p);
  const std::int64_t near_high_word = (std::int64_t{1} << 34) - 2;  // element 4 * 2^32 - 2: group 2^32 - 1
  for (const std::int64_t cols : {1, 3, 5, 37, 63, 65, 67, 129, 131, 201}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    std::vector<std::int64_t> ids;
    for (std::int64_t i = 0; i < 9; ++i) ids.push_back(7 * i + 3);
    for (std::int64_t i = 0; i < 6; ++i) ids.push_back(near_high_word / cols - 2 + i);
    const auto rows = static_cast<std::int64_t>(ids.size());
    TestArray<std::int64_t> sample_ids(*backend, ids);
    auto x = tensor(DType::f32, rows, cols), y = tensor(DType::f32, rows, cols);
    const auto x_values = x.randomize(101, 0.5, 2.0);
    y.poison();
    backend->dropout_forward(c.p, c.seed, c.step, c.layer, sample_ids.data(), x.view(), y.view());
    const auto y_values = y.get();
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t col = 0; col < cols; ++col) {
        const std::uint64_t element = static_cast<std::uint64_t>(ids[row] * cols + col);
        const std::size_t at = static_cast<std::size_t>(row * cols + col);
        const bool keep = km::dropout_keep(c.seed, c.step, c.layer, element, c.p);
        const double expected = keep ? static_cast<double>(static_cast<float>(x_values[at]) * scale) : 0.0;
        ASSERT_EQ(y_values[at], expected) << "row " << row << " col " << col << " element " << element;
      }
  }
}

TEST_F(CpuKernels, DropoutKeepsOneMinusPAndDependsOnTheStep) {
  const std::int64_t rows = 256, cols = 512;
  TestArray<std::int64_t> sample_ids(*backend, consecutive_ids(0, rows));
  auto x = tensor(DType::f32, rows, cols), y = tensor(DType::f32, rows, cols), z = tensor(DType::f32, rows, cols);
  x.randomize(61, 1.0, 2.0);
  backend->dropout_forward(0.25f, 7, 1, 0, sample_ids.data(), x.view(), y.view());
  backend->dropout_forward(0.25f, 7, 2, 0, sample_ids.data(), x.view(), z.view());
  const auto y_values = y.get(), z_values = z.get();
  std::size_t kept = 0, same = 0;
  for (std::size_t i = 0; i < y_values.size(); ++i) {
    kept += y_values[i] != 0.0 ? 1 : 0;
    same += (y_values[i] != 0.0) == (z_values[i] != 0.0) ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(kept) / y_values.size(), 0.75, 0.005);
  // independent masks agree on 0.75^2 + 0.25^2 = 0.625 of the elements
  EXPECT_NEAR(static_cast<double>(same) / y_values.size(), 0.625, 0.01);
}

TEST_F(CpuKernels, DropoutMaskDependsOnSampleIdsNotOnRowPositions) {
  // A rank holding rows 10..39 of the batch computes the same mask for them as one rank holding all rows.
  const DropoutCase c{0.5f, 9, 4, 2};
  const std::int64_t rows = 48, cols = 21, first = 10, count = 30;
  std::vector<std::int64_t> ids(rows);
  for (std::int64_t i = 0; i < rows; ++i) ids[i] = 5000 + 3 * i;  // shuffled-looking global indices
  TestArray<std::int64_t> all_ids(*backend, ids);
  TestArray<std::int64_t> part_ids(*backend,
                                   std::vector<std::int64_t>(ids.begin() + first, ids.begin() + first + count));
  auto x = tensor(DType::bf16, rows, cols), y = tensor(DType::bf16, rows, cols);
  auto x_part = tensor(DType::bf16, count, cols), y_part = tensor(DType::bf16, count, cols);
  const auto x_values = x.randomize(71);
  x_part.set(std::vector<double>(x_values.begin() + first * cols, x_values.begin() + (first + count) * cols));
  backend->dropout_forward(c.p, c.seed, c.step, c.layer, all_ids.data(), x.view(), y.view());
  y_part.poison();
  backend->dropout_forward(c.p, c.seed, c.step, c.layer, part_ids.data(), x_part.view(), y_part.view());
  const auto y_values = y.get();
  EXPECT_EQ(y_part.get(),
            std::vector<double>(y_values.begin() + first * cols, y_values.begin() + (first + count) * cols));
}

TEST_F(CpuKernels, DropoutWithZeroOrOneProbability) {
  TestArray<std::int64_t> sample_ids(*backend, consecutive_ids(0, 6));
  for (DType dtype : all_dtypes) {
    auto x = tensor(dtype, 6, 10), y = tensor(dtype, 6, 10);
    const auto x_values = x.randomize(81);
    y.poison();
    backend->dropout_forward(0.0f, 1, 1, 1, sample_ids.data(), x.view(), y.view());
    EXPECT_EQ(y.get(), x_values) << "p = 0 is the identity, " << dtype_name(dtype);
    backend->dropout_backward(0.0f, 1, 1, 1, sample_ids.data(), x.view(), x.view());
    EXPECT_EQ(x.get(), x_values) << "in place";
    backend->dropout_forward(1.0f, 1, 1, 1, sample_ids.data(), x.view(), y.view());
    EXPECT_EQ(y.get(), std::vector<double>(60, 0.0)) << "p = 1 drops everything, " << dtype_name(dtype);
  }
}

TEST_F(CpuKernels, DropoutBackwardMatchesFiniteDifferences) {
  const DropoutCase c;
  TestArray<std::int64_t> sample_ids(*backend, consecutive_ids(17, 4));
  auto x = tensor(DType::f64, 4, 9), y = tensor(DType::f64, 4, 9), r = tensor(DType::f64, 4, 9);
  auto dx = tensor(DType::f64, 4, 9);
  auto x_values = random_values(36, 91);
  const auto r_values = r.randomize(92);
  const auto objective = [&]() {
    x.set(x_values);
    backend->dropout_forward(c.p, c.seed, c.step, c.layer, sample_ids.data(), x.view(), y.view());
    return dot(y.get(), r_values);
  };
  const auto numeric = central_differences(x_values, 1e-5, objective);
  dx.poison();
  backend->dropout_backward(c.p, c.seed, c.step, c.layer, sample_ids.data(), r.view(), dx.view());
  EXPECT_LE(relative_error(dx.get(), numeric), 1e-6);
}

// ---- layer normalisation ----

struct LayernormReference {
  std::vector<double> y, mean, rstd, dx, dgamma, dbeta;
};

LayernormReference reference_layernorm(const std::vector<double>& x, const std::vector<double>& gamma,
                                       const std::vector<double>& beta, const std::vector<double>& dy, double eps,
                                       std::int64_t rows, std::int64_t cols) {
  LayernormReference r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.dgamma.assign(cols, 0.0);
  r.dbeta.assign(cols, 0.0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const double* row = x.data() + i * cols;
    double mean = 0.0, variance = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) mean += row[j] / cols;
    for (std::int64_t j = 0; j < cols; ++j) variance += (row[j] - mean) * (row[j] - mean) / cols;
    const double rstd = 1.0 / std::sqrt(variance + eps);
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
    double mean_g = 0.0, mean_g_xhat = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double xhat = (row[j] - mean) * rstd;
      const double g = dy[i * cols + j] * gamma[j];
      r.y[i * cols + j] = xhat * gamma[j] + beta[j];
      r.dgamma[j] += dy[i * cols + j] * xhat;
      r.dbeta[j] += dy[i * cols + j];
      mean_g += g / cols;
      mean_g_xhat += g * xhat / cols;
    }
    for (std::int64_t j = 0; j < cols; ++j) {
      const double xhat = (row[j] - mean) * rstd;
      r.dx[i * cols + j] = rstd * (dy[i * cols + j] * gamma[j] - mean_g - xhat * mean_g_xhat);
    }
  }
  return r;
}

TEST_F(CpuKernels, LayernormForwardAndBackwardInEveryDtype) {
  const float eps = 1e-5f;
  for (DType dtype : all_dtypes)
    for (std::int64_t cols : {std::int64_t{37}, std::int64_t{130}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " cols " << cols);
      const std::int64_t rows = 7;
      const DType master = master_of(dtype);
      auto x = tensor(dtype, rows, cols), y = tensor(dtype, rows, cols), dy = tensor(dtype, rows, cols);
      auto dx = tensor(dtype, rows, cols);
      auto gamma = tensor(master, 1, cols), beta = tensor(master, 1, cols);
      auto mean = tensor(master, 1, rows), rstd = tensor(master, 1, rows);
      auto dgamma = tensor(master, 1, cols), dbeta = tensor(master, 1, cols);
      const auto x_values = x.randomize(101, -2.0, 3.0);
      const auto dy_values = dy.randomize(102);
      const auto gamma_values = gamma.randomize(103, 0.5, 1.5);
      const auto beta_values = beta.randomize(104);
      const auto want = reference_layernorm(x_values, gamma_values, beta_values, dy_values, eps, rows, cols);
      for (auto* t : {&y, &mean, &rstd, &dx, &dgamma, &dbeta}) t->poison();
      backend->layernorm_forward(x.view(), gamma.data(), beta.data(), eps, y.view(), mean.data(), rstd.data());
      EXPECT_LE(relative_error(y.get(), want.y), tolerance(dtype));
      EXPECT_LE(relative_error(mean.get(), want.mean), compute_tolerance(dtype));
      EXPECT_LE(relative_error(rstd.get(), want.rstd), compute_tolerance(dtype));
      backend->layernorm_backward(x.view(), dy.view(), gamma.data(), mean.data(), rstd.data(), dx.view(), dgamma.data(),
                                  dbeta.data(), false);
      EXPECT_LE(relative_error(dx.get(), want.dx), tolerance(dtype));
      EXPECT_LE(relative_error(dgamma.get(), want.dgamma), compute_tolerance(dtype));
      EXPECT_LE(relative_error(dbeta.get(), want.dbeta), compute_tolerance(dtype));
      // accumulate adds the parameter gradients; dx over dy in place gives the same dx
      backend->layernorm_backward(x.view(), dy.view(), gamma.data(), mean.data(), rstd.data(), dy.view(), dgamma.data(),
                                  dbeta.data(), true);
      auto twice = want.dgamma;
      for (double& value : twice) value *= 2;
      EXPECT_LE(relative_error(dgamma.get(), twice), compute_tolerance(dtype));
      twice = want.dbeta;
      for (double& value : twice) value *= 2;
      EXPECT_LE(relative_error(dbeta.get(), twice), compute_tolerance(dtype));
      EXPECT_EQ(dy.get(), dx.get());
    }
}

TEST_F(CpuKernels, LayernormBackwardMatchesFiniteDifferences) {
  const std::int64_t rows = 3, cols = 6;
  const float eps = 1e-3f;  // large enough to matter in the derivative
  auto x = tensor(DType::f64, rows, cols), y = tensor(DType::f64, rows, cols), r = tensor(DType::f64, rows, cols);
  auto dx = tensor(DType::f64, rows, cols);
  auto gamma = tensor(DType::f64, 1, cols), beta = tensor(DType::f64, 1, cols);
  auto mean = tensor(DType::f64, 1, rows), rstd = tensor(DType::f64, 1, rows);
  auto dgamma = tensor(DType::f64, 1, cols), dbeta = tensor(DType::f64, 1, cols);
  auto x_values = random_values(rows * cols, 111, -2.0, 2.0);
  auto gamma_values = random_values(cols, 112, 0.5, 1.5);
  auto beta_values = random_values(cols, 113);
  const auto r_values = r.randomize(114);
  const auto objective = [&]() {
    x.set(x_values);
    gamma.set(gamma_values);
    beta.set(beta_values);
    backend->layernorm_forward(x.view(), gamma.data(), beta.data(), eps, y.view(), mean.data(), rstd.data());
    return dot(y.get(), r_values);
  };
  const auto numeric_dx = central_differences(x_values, 1e-5, objective);
  const auto numeric_dgamma = central_differences(gamma_values, 1e-5, objective);
  const auto numeric_dbeta = central_differences(beta_values, 1e-5, objective);
  objective();  // mean and rstd of the unperturbed input
  for (auto* t : {&dx, &dgamma, &dbeta}) t->poison();
  backend->layernorm_backward(x.view(), r.view(), gamma.data(), mean.data(), rstd.data(), dx.view(), dgamma.data(),
                              dbeta.data(), false);
  EXPECT_LE(relative_error(dx.get(), numeric_dx), 1e-6);
  EXPECT_LE(relative_error(dgamma.get(), numeric_dgamma), 1e-6);
  EXPECT_LE(relative_error(dbeta.get(), numeric_dbeta), 1e-6);
}

// ---- losses ----

struct LossReference {
  double loss_sum = 0.0, correct = 0.0;
  std::vector<double> gradient;
};

LossReference reference_softmax_cross_entropy(const std::vector<double>& logits,
                                              const std::vector<std::int32_t>& labels, std::int64_t cols,
                                              double grad_scale) {
  LossReference r;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const double* row = logits.data() + i * cols;
    const auto max_at = std::max_element(row, row + cols);  // first maximum: ties -> lowest index
    double sum = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) sum += std::exp(row[j] - *max_at);
    r.loss_sum += std::log(sum) - (row[labels[i]] - *max_at);
    r.correct += (max_at - row) == labels[i] ? 1.0 : 0.0;
    for (std::int64_t j = 0; j < cols; ++j)
      r.gradient.push_back((std::exp(row[j] - *max_at) / sum - (j == labels[i] ? 1.0 : 0.0)) * grad_scale);
  }
  return r;
}

std::vector<std::int32_t> random_labels(std::size_t count, std::int32_t classes, std::uint64_t seed) {
  std::vector<std::int32_t> labels;
  for (double value : random_values(count, seed, 0.0, classes)) labels.push_back(static_cast<std::int32_t>(value));
  return labels;
}

TEST_F(CpuKernels, SoftmaxCrossEntropyInEveryDtype) {
  const std::int64_t rows = 33, cols = 10;
  const float grad_scale_value = 0.125f;
  TestArray<float> grad_scale(*backend, std::vector<float>{grad_scale_value});
  for (DType dtype : all_dtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto logits = tensor(dtype, rows, cols), dlogits = tensor(dtype, rows, cols);
    // scale 3: many rows predicted correctly and many not
    const auto logit_values = logits.randomize(121, -3.0, 3.0);
    const auto label_values = random_labels(rows, cols, 122);
    TestArray<std::int32_t> labels(*backend, label_values);
    TestArray<LossSums> sums(*backend, std::vector<LossSums>{LossSums{}});
    const auto want = reference_softmax_cross_entropy(logit_values, label_values, cols, grad_scale_value);
    dlogits.poison();
    backend->softmax_cross_entropy(logits.view(), labels.data(), grad_scale.data(), dlogits.view(), sums.data());
    auto got = sums.get()[0];
    EXPECT_NEAR(got.loss_sum, want.loss_sum, compute_tolerance(dtype) * want.loss_sum);
    EXPECT_EQ(got.correct, want.correct);
    EXPECT_LE(relative_error(dlogits.get(), want.gradient), tolerance(dtype));
    // the sums accumulate; without dlogits only the sums are computed; dlogits over logits in place
    backend->softmax_cross_entropy(logits.view(), labels.data(), nullptr, TensorView{}, sums.data());
    got = sums.get()[0];
    EXPECT_NEAR(got.loss_sum, 2 * want.loss_sum, 2 * compute_tolerance(dtype) * want.loss_sum);
    EXPECT_EQ(got.correct, 2 * want.correct);
    backend->softmax_cross_entropy(logits.view(), labels.data(), grad_scale.data(), logits.view(), nullptr);
    EXPECT_EQ(logits.get(), dlogits.get());
  }
}

TEST_F(CpuKernels, SoftmaxCrossEntropyTiesAndLargeLogits) {
  // row 0: tie between classes 1 and 2 -> argmax 1; row 1: logits in the thousands must not overflow
  auto logits = tensor(DType::f32, 2, 4), dlogits = tensor(DType::f32, 2, 4);
  const std::vector<double> values = {1.0, 3.0, 3.0, 0.0, 1000.0, 2000.0, 1999.0, -3000.0};
  logits.set(values);
  TestArray<float> grad_scale(*backend, std::vector<float>{1.0f});
  for (std::int32_t tied_label : {1, 2}) {
    TestArray<std::int32_t> labels(*backend, std::vector<std::int32_t>{tied_label, 2});
    TestArray<LossSums> sums(*backend, std::vector<LossSums>{LossSums{}});
    dlogits.poison();
    backend->softmax_cross_entropy(logits.view(), labels.data(), grad_scale.data(), dlogits.view(), sums.data());
    const auto want = reference_softmax_cross_entropy(values, {tied_label, 2}, 4, 1.0);
    EXPECT_EQ(sums.get()[0].correct, tied_label == 1 ? 1.0 : 0.0);
    EXPECT_NEAR(sums.get()[0].loss_sum, want.loss_sum, 1e-5 * want.loss_sum);
    EXPECT_LE(relative_error(dlogits.get(), want.gradient), 1e-6);
  }
}

TEST_F(CpuKernels, SoftmaxCrossEntropyRejectsBadLabels) {
  auto logits = tensor(DType::f32, 2, 3);
  logits.randomize(1);
  TestArray<std::int32_t> labels(*backend, std::vector<std::int32_t>{0, 3});
  TestArray<LossSums> sums(*backend, std::vector<LossSums>{LossSums{}});
  EXPECT_THROW(backend->softmax_cross_entropy(logits.view(), labels.data(), nullptr, TensorView{}, sums.data()),
               InputError);
  // Only the rank holding the batch sees the label: the error is that rank's (it reports, the job is aborted at once).
  try {
    backend->softmax_cross_entropy(logits.view(), labels.data(), nullptr, TensorView{}, sums.data());
    ADD_FAILURE() << "no error";
  } catch (const InputError& error) {
    EXPECT_EQ(error.scope(), ErrorScope::this_rank);
  }
}

TEST_F(CpuKernels, SoftmaxCrossEntropyGradientMatchesFiniteDifferences) {
  const std::int64_t rows = 4, cols = 5;
  const float scale = 0.25f;  // dlogits carries the gradient scale
  auto logits = tensor(DType::f64, rows, cols), dlogits = tensor(DType::f64, rows, cols);
  auto logit_values = random_values(rows * cols, 131, -2.0, 2.0);
  TestArray<std::int32_t> labels(*backend, random_labels(rows, cols, 132));
  TestArray<float> grad_scale(*backend, std::vector<float>{scale});
  TestArray<LossSums> sums(*backend, 1);
  const auto objective = [&]() {
    logits.set(logit_values);
    sums.set({LossSums{}});
    backend->softmax_cross_entropy(logits.view(), labels.data(), nullptr, TensorView{}, sums.data());
    return scale * sums.get()[0].loss_sum;
  };
  const auto numeric = central_differences(logit_values, 1e-5, objective);
  logits.set(logit_values);
  dlogits.poison();
  backend->softmax_cross_entropy(logits.view(), labels.data(), grad_scale.data(), dlogits.view(), nullptr);
  EXPECT_LE(relative_error(dlogits.get(), numeric), 1e-6);
}

// PyTorch's CrossEntropyLoss(weight=w, label_smoothing=eps, reduction='sum') written out: per row,
// (1 - eps) w[y] (-log p_y) + (eps / C) sum_k w[k] (-log p_k); the gradient as sum_k c_k (p_j - [j == k]) with
// c_k = (1 - eps) w[y] [k == y] + (eps / C) w[k]. weights empty: 1.
LossReference reference_smoothed_cross_entropy(const std::vector<double>& logits,
                                               const std::vector<std::int32_t>& labels, std::int64_t cols,
                                               const std::vector<double>& weights, double smoothing,
                                               double grad_scale) {
  LossReference r;
  const auto weight = [&](std::int64_t k) { return weights.empty() ? 1.0 : weights[static_cast<std::size_t>(k)]; };
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const double* row = logits.data() + i * cols;
    const auto max_at = std::max_element(row, row + cols);
    double sum = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) sum += std::exp(row[j] - *max_at);
    const double log_sum = std::log(sum) + *max_at;
    std::vector<double> coefficient(static_cast<std::size_t>(cols));
    for (std::int64_t k = 0; k < cols; ++k) {
      coefficient[k] =
          smoothing / static_cast<double>(cols) * weight(k) + (k == labels[i] ? (1.0 - smoothing) * weight(k) : 0.0);
      r.loss_sum += coefficient[k] * (log_sum - row[k]);  // -log p_k
    }
    r.correct += (max_at - row) == labels[i] ? 1.0 : 0.0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double probability = std::exp(row[j] - log_sum);
      double gradient = 0.0;
      for (std::int64_t k = 0; k < cols; ++k) gradient += coefficient[k] * (probability - (j == k ? 1.0 : 0.0));
      r.gradient.push_back(gradient * grad_scale);
    }
  }
  return r;
}

TEST_F(CpuKernels, SmoothedCrossEntropyInEveryDtype) {
  const std::int64_t rows = 33, cols = 10;
  const float grad_scale_value = 0.0625f;
  TestArray<float> grad_scale(*backend, std::vector<float>{grad_scale_value});
  std::vector<float> weight_values;
  for (double value : random_values(cols, 150, 0.2, 3.0)) weight_values.push_back(static_cast<float>(value));
  TestArray<float> class_weights(*backend, weight_values);
  const std::vector<double> reference_weights(weight_values.begin(), weight_values.end());
  for (const bool weighted : {true, false})
    for (const double smoothing : {0.0, 0.1})
      for (DType dtype : all_dtypes) {
        if (!weighted && smoothing == 0.0) continue;  // the plain kernel's case (the loss never picks this one then)
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (weighted ? " weighted" : "") + " smoothing " +
                     std::to_string(smoothing));
        auto logits = tensor(dtype, rows, cols), dlogits = tensor(dtype, rows, cols);
        const auto logit_values = logits.randomize(151, -3.0, 3.0);
        const auto label_values = random_labels(rows, cols, 152);
        TestArray<std::int32_t> labels(*backend, label_values);
        TestArray<LossSums> sums(*backend, std::vector<LossSums>{LossSums{}});
        const CrossEntropyOptions options{weighted ? class_weights.data() : nullptr, static_cast<float>(smoothing)};
        const auto want = reference_smoothed_cross_entropy(
            logit_values, label_values, cols, weighted ? reference_weights : std::vector<double>{},
            static_cast<double>(options.label_smoothing), grad_scale_value);
        dlogits.poison();
        backend->smoothed_softmax_cross_entropy(logits.view(), labels.data(), options, grad_scale.data(),
                                                dlogits.view(), sums.data());
        const LossSums got = sums.get()[0];
        EXPECT_TRUE(std::isfinite(got.loss_sum));
        EXPECT_NEAR(got.loss_sum, want.loss_sum, compute_tolerance(dtype) * want.loss_sum);
        EXPECT_EQ(got.correct, want.correct);
        EXPECT_LE(relative_error(dlogits.get(), want.gradient), tolerance(dtype));
        // without dlogits only the sums; in place over the logits the same gradient
        backend->smoothed_softmax_cross_entropy(logits.view(), labels.data(), options, nullptr, TensorView{},
                                                sums.data());
        EXPECT_NEAR(sums.get()[0].loss_sum, 2 * want.loss_sum, 2 * compute_tolerance(dtype) * want.loss_sum);
        backend->smoothed_softmax_cross_entropy(logits.view(), labels.data(), options, grad_scale.data(), logits.view(),
                                                nullptr);
        EXPECT_EQ(logits.get(), dlogits.get());
      }
}

TEST_F(CpuKernels, SmoothedCrossEntropyDiffersFromPlainAndRejectsBadLabels) {
  // Weights and smoothing change the loss (a test of the reference itself: it is not the plain one).
  const std::vector<double> logits{0.5, -1.0, 2.0, 0.25};
  const std::vector<std::int32_t> labels{1};
  const double plain = reference_softmax_cross_entropy(logits, labels, 4, 1.0).loss_sum;
  EXPECT_NEAR(reference_smoothed_cross_entropy(logits, labels, 4, {}, 0.0, 1.0).loss_sum, plain, 1e-14);
  EXPECT_GT(std::abs(reference_smoothed_cross_entropy(logits, labels, 4, {}, 0.1, 1.0).loss_sum - plain), 1e-3);
  EXPECT_NEAR(reference_smoothed_cross_entropy(logits, labels, 4, {1, 3, 1, 1}, 0.0, 1.0).loss_sum, 3 * plain, 1e-12);
  auto bad = tensor(DType::f32, 2, 3);
  bad.randomize(1);
  TestArray<std::int32_t> bad_labels(*backend, std::vector<std::int32_t>{0, -1});
  TestArray<LossSums> sums(*backend, std::vector<LossSums>{LossSums{}});
  EXPECT_THROW(backend->smoothed_softmax_cross_entropy(bad.view(), bad_labels.data(), {nullptr, 0.1f}, nullptr,
                                                       TensorView{}, sums.data()),
               InputError);
}

TEST_F(CpuKernels, SmoothedCrossEntropyGradientMatchesFiniteDifferences) {
  const std::int64_t rows = 4, cols = 5;
  const float scale = 0.25f;
  auto logits = tensor(DType::f64, rows, cols), dlogits = tensor(DType::f64, rows, cols);
  auto logit_values = random_values(rows * cols, 161, -2.0, 2.0);
  TestArray<std::int32_t> labels(*backend, random_labels(rows, cols, 162));
  TestArray<float> grad_scale(*backend, std::vector<float>{scale});
  TestArray<float> class_weights(*backend, std::vector<float>{0.5f, 2.0f, 1.25f, 3.0f, 0.75f});
  TestArray<LossSums> sums(*backend, 1);
  for (const double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE(smoothing);
    const CrossEntropyOptions options{class_weights.data(), static_cast<float>(smoothing)};
    const auto objective = [&]() {
      logits.set(logit_values);
      sums.set({LossSums{}});
      backend->smoothed_softmax_cross_entropy(logits.view(), labels.data(), options, nullptr, TensorView{},
                                              sums.data());
      return scale * sums.get()[0].loss_sum;
    };
    const auto numeric = central_differences(logit_values, 1e-5, objective);
    logits.set(logit_values);
    dlogits.poison();
    backend->smoothed_softmax_cross_entropy(logits.view(), labels.data(), options, grad_scale.data(), dlogits.view(),
                                            nullptr);
    EXPECT_LE(relative_error(dlogits.get(), numeric), 1e-6);
  }
}

TEST_F(CpuKernels, MeanSquaredErrorInEveryDtype) {
  const std::int64_t rows = 9, cols = 6;
  const float grad_scale_value = 0.5f;
  TestArray<float> grad_scale(*backend, std::vector<float>{grad_scale_value});
  for (DType dtype : all_dtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto pred = tensor(dtype, rows, cols), dpred = tensor(dtype, rows, cols);
    auto targets = tensor(master_of(dtype), rows, cols);
    const auto pred_values = pred.randomize(141);
    const auto target_values = targets.randomize(142);
    double want_loss = 0.0;
    std::vector<double> want_gradient;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        const double d = pred_values[i * cols + j] - target_values[i * cols + j];
        want_loss += d * d / cols;
        want_gradient.push_back(2.0 * d / cols * grad_scale_value);
      }
    TestArray<LossSums> sums(*backend, std::vector<LossSums>{LossSums{0.5, 3.0}});
    dpred.poison();
    backend->mean_squared_error(pred.view(), targets.data(), grad_scale.data(), dpred.view(), sums.data());
    const auto got = sums.get()[0];
    EXPECT_NEAR(got.loss_sum, 0.5 + want_loss, compute_tolerance(dtype) * want_loss);
    EXPECT_EQ(got.correct, 3.0) << "regression leaves the correct count alone";
    EXPECT_LE(relative_error(dpred.get(), want_gradient), tolerance(dtype));
  }
}

TEST_F(CpuKernels, MeanSquaredErrorGradientMatchesFiniteDifferences) {
  const std::int64_t rows = 3, cols = 4;
  auto pred = tensor(DType::f64, rows, cols), dpred = tensor(DType::f64, rows, cols);
  auto targets = tensor(DType::f64, rows, cols);
  targets.randomize(151);
  auto pred_values = random_values(rows * cols, 152);
  TestArray<float> grad_scale(*backend, std::vector<float>{1.0f});
  TestArray<LossSums> sums(*backend, 1);
  const auto objective = [&]() {
    pred.set(pred_values);
    sums.set({LossSums{}});
    backend->mean_squared_error(pred.view(), targets.data(), nullptr, TensorView{}, sums.data());
    return sums.get()[0].loss_sum;
  };
  const auto numeric = central_differences(pred_values, 1e-5, objective);
  pred.set(pred_values);
  dpred.poison();
  backend->mean_squared_error(pred.view(), targets.data(), grad_scale.data(), dpred.view(), nullptr);
  EXPECT_LE(relative_error(dpred.get(), numeric), 1e-6);
}

}  // namespace
}  // namespace hpctrain
