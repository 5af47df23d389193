// Tests of kernels/math.hpp, the arithmetic shared by the CPU and CUDA backends: activations against independent
// double-precision formulas and their derivatives against central finite differences; dropout's keep decision; one
// element of AdamW and SGD against references written out here; the loss-scaler update against a trajectory worked out
// by hand; the clip coefficient.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "hpctrain/kernels/math.hpp"

namespace hpctrain {
namespace {

namespace km = kernel_math;

constexpr double nan_value = std::numeric_limits<double>::quiet_NaN();
constexpr double inf_value = std::numeric_limits<double>::infinity();
constexpr double leaky_alpha = 0.03;

// Points in [-6, 6] that avoid the kinks of relu and leaky_relu at 0.
std::vector<double> sample_points() {
  std::vector<double> points;
  for (double x = -6.0; x <= 6.0; x += 0.0137)
    if (std::abs(x) > 1e-3) points.push_back(x);
  return points;
}

// ---- activations ----

// Independent references: GELU through erfc (Phi(x) = erfc(-x / sqrt 2) / 2), its tanh form through the logistic
// function (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)), the rest as defined.
double reference_value(Activation kind, double x) {
  switch (kind) {
    case Activation::relu:
      return x > 0 ? x : 0.0;
    case Activation::gelu:
      return x * 0.5 * std::erfc(-x / std::sqrt(2.0));
    case Activation::gelu_tanh:
      return x / (1.0 + std::exp(-2.0 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::tanh:
      return std::tanh(x);
    case Activation::leaky_relu:
      return x > 0 ? x : leaky_alpha * x;
  }
  return nan_value;
}

const Activation all_activations[] = {Activation::relu, Activation::gelu, Activation::tanh, Activation::leaky_relu,
                                      Activation::gelu_tanh};

// The float tanh is kernel_math's own (vectorisable) approximation: within 1.5 ulp of tanh in double, rounded, over
// random floats in [-12, 12], in [-0.6, 0.6] (the polynomial), around its switch at 0.55, and over tiny magnitudes;
// odd (the sign of -0 kept), +-1 at +-inf and from |x| = 10, NaN stays NaN.
TEST(KernelMath, FloatTanhWithinOneAndAHalfUlp) {
  std::mt19937 generator(7);
  std::vector<float> points;
  std::uniform_real_distribution<float> wide(-12.0f, 12.0f), narrow(-0.6f, 0.6f), switch_zone(0.54f, 0.56f),
      exponent(-30.0f, 0.0f);
  for (int i = 0; i < 200000; ++i) {
    points.push_back(wide(generator));
    points.push_back(narrow(generator));
    points.push_back(switch_zone(generator));
    points.push_back(-std::pow(10.0f, exponent(generator)));
  }
  double worst = 0.0;
  for (float x : points) {
    const double exact = std::tanh(static_cast<double>(x));
    const float rounded = static_cast<float>(exact);
    const double ulp = std::nextafter(std::abs(rounded), std::numeric_limits<float>::infinity()) - std::abs(rounded);
    const double error = std::abs(static_cast<double>(km::fast_tanh(x)) - exact) / ulp;
    ASSERT_LE(error, 1.5) << "x " << x << ": " << km::fast_tanh(x) << " against " << exact;
    worst = std::max(worst, error);
  }
  EXPECT_GT(worst, 0.0);  // the sweep reached inexact results: it measured something
  EXPECT_EQ(km::fast_tanh(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(km::fast_tanh(-0.0f)));
  EXPECT_EQ(km::fast_tanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(km::fast_tanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(km::fast_tanh(10.0f), 1.0f);
  EXPECT_EQ(km::fast_tanh(-30.0f), -1.0f);
  EXPECT_TRUE(std::isnan(km::fast_tanh(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(km::fast_tanh(1e-30f), 1e-30f);
}

TEST(KernelMath, ActivationsMatchDoubleReferences) {
  for (Activation kind : all_activations) {
    for (double x : sample_points()) {
      const double want = reference_value(kind, x);
      const double in_double = km::activation_value<double>(kind, leaky_alpha, x);
      EXPECT_NEAR(in_double, want, 1e-14 * (1.0 + std::abs(want))) << "kind " << int(kind) << " x " << x;
      // fp32 arithmetic on the same (fp32) input
      const float xf = static_cast<float>(x);
      const double want_f = reference_value(kind, static_cast<double>(xf));
      const float in_float = km::activation_value<float>(kind, static_cast<float>(leaky_alpha), xf);
      EXPECT_NEAR(in_float, want_f, 1e-6 * (1.0 + std::abs(want_f))) << "kind " << int(kind) << " x " << x;
    }
  }
}

TEST(KernelMath, GeluKnownValues) {
  // Phi(1) = 0.841344746068542948..., Phi(-1) = 0.158655253931457051...
  EXPECT_NEAR(km::gelu(1.0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(km::gelu(-1.0), -0.15865525393145705, 1e-15);
  EXPECT_EQ(km::gelu(0.0), 0.0);
  EXPECT_NEAR(km::gelu_derivative(0.0), 0.5, 1e-15);
}

TEST(KernelMath, GeluTanhKnownValues) {
  // torch.nn.functional.gelu(torch.tensor(x, dtype=torch.float64), approximate="tanh")
  EXPECT_NEAR(km::gelu_tanh(-0.5), -0.15428599017485606, 1e-15);
  EXPECT_NEAR(km::gelu_tanh(1.0), 0.8411919906082768, 1e-15);
  EXPECT_EQ(km::gelu_tanh(0.0), 0.0);
  EXPECT_NEAR(km::gelu_tanh_derivative(0.0), 0.5, 1e-15);
  // the approximation differs from the exact form (by up to 4.7e-4, near x = 2.7): not the same function by mistake
  EXPECT_GT(std::abs(km::gelu_tanh(2.7) - km::gelu(2.7)), 4e-4);
}

TEST(KernelMath, ActivationDerivativesMatchFiniteDifferences) {
  const double step = 1e-6;
  for (Activation kind : all_activations) {
    for (double x : sample_points()) {
      const double numeric = (km::activation_value<double>(kind, leaky_alpha, x + step) -
                              km::activation_value<double>(kind, leaky_alpha, x - step)) /
                             (2 * step);
      const double analytic = km::activation_derivative<double>(kind, leaky_alpha, x);
      EXPECT_NEAR(analytic, numeric, 1e-8 * (1.0 + std::abs(numeric))) << "kind " << int(kind) << " x " << x;
      const float analytic_f =
          km::activation_derivative<float>(kind, static_cast<float>(leaky_alpha), static_cast<float>(x));
      EXPECT_NEAR(analytic_f, analytic, 1e-6 * (1.0 + std::abs(analytic))) << "kind " << int(kind) << " x " << x;
    }
  }
}

TEST(KernelMath, ActivationKindDispatchMatchesDirectFunctions) {
  for (double x : {-2.5, -0.1, 0.3, 4.0}) {
    EXPECT_EQ(km::activation_value(Activation::relu, 0.0, x), km::relu(x));
    EXPECT_EQ(km::activation_value(Activation::gelu, 0.0, x), km::gelu(x));
    EXPECT_EQ(km::activation_value(Activation::gelu_tanh, 0.0, x), km::gelu_tanh(x));
    EXPECT_EQ(km::activation_value(Activation::tanh, 0.0, x), km::tanh_activation(x));
    EXPECT_EQ(km::activation_value(Activation::leaky_relu, 0.2, x), km::leaky_relu(x, 0.2));
    EXPECT_EQ(km::activation_derivative(Activation::relu, 0.0, x), km::relu_derivative(x));
    EXPECT_EQ(km::activation_derivative(Activation::gelu, 0.0, x), km::gelu_derivative(x));
    EXPECT_EQ(km::activation_derivative(Activation::gelu_tanh, 0.0, x), km::gelu_tanh_derivative(x));
    EXPECT_EQ(km::activation_derivative(Activation::tanh, 0.0, x), km::tanh_derivative(x));
    EXPECT_EQ(km::activation_derivative(Activation::leaky_relu, 0.2, x), km::leaky_relu_derivative(x, 0.2));
  }
}

TEST(KernelMath, ActivationsPropagateNan) {
  for (Activation kind : all_activations) {
    EXPECT_TRUE(std::isnan(km::activation_value<float>(kind, 0.1f, std::nanf("")))) << int(kind);
    EXPECT_TRUE(std::isnan(km::activation_value<double>(kind, 0.1, nan_value))) << int(kind);
  }
}

TEST(KernelMath, IsFinite) {
  EXPECT_TRUE(km::is_finite(1.5f));
  EXPECT_TRUE(km::is_finite(-std::numeric_limits<float>::max()));
  EXPECT_TRUE(km::is_finite(std::numeric_limits<float>::denorm_min()));
  EXPECT_FALSE(km::is_finite(std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(km::is_finite(-std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(km::is_finite(std::nanf("")));
  EXPECT_TRUE(km::is_finite(1e300));
  EXPECT_FALSE(km::is_finite(inf_value));
  EXPECT_FALSE(km::is_finite(nan_value));
}

// ---- dropout ----

TEST(KernelMath, DropoutKeepsTheExpectedFraction) {
  for (float p : {0.1f, 0.3f, 0.5f, 0.9f}) {
    const std::uint64_t count = 200000;
    std::uint64_t kept = 0;
    for (std::uint64_t i = 0; i < count; ++i) kept += km::dropout_keep(1234, 7, 2, i, p) ? 1 : 0;
    // standard deviation sqrt(p (1 - p) / n) <= 0.0012
    EXPECT_NEAR(static_cast<double>(kept) / count, 1.0 - p, 0.006) << "p " << p;
  }
}

TEST(KernelMath, DropoutIsAPureFunctionOfItsArguments) {
  const std::uint64_t key = km::dropout_key(99, 5);
  double sum = 0.0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    const float u = km::dropout_uniform(key, 3, i);
    EXPECT_GE(u, 0.0f);
    EXPECT_LT(u, 1.0f);
    sum += u;
    EXPECT_EQ(km::dropout_keep(99, 5, 3, i, 0.4f), km::dropout_keep_with_key(key, 3, i, 0.4f));
    EXPECT_EQ(km::dropout_keep(99, 5, 3, i, 0.4f), u >= 0.4f);
    // the four lanes of a group are the four outputs of one Philox call
    EXPECT_EQ(u, uniform_from_bits(km::dropout_group_bits(key, 3, i / 4).v[i % 4]));
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
  // large element indices use the high counter word
  const std::uint64_t far = (std::uint64_t{5} << 40) + 3;
  EXPECT_NE(km::dropout_uniform(key, 3, far), km::dropout_uniform(key, 3, 3));
}

TEST(KernelMath, DropoutMasksDifferAcrossSeedStepAndLayer) {
  // Two independent masks with p = 0.5 agree on about half the elements; identical ones on all.
  const auto agreement = [](auto first, auto second) {
    int same = 0;
    for (std::uint64_t i = 0; i < 20000; ++i) same += first(i) == second(i) ? 1 : 0;
    return same / 20000.0;
  };
  const auto mask = [](std::uint64_t seed, std::uint32_t step, std::uint32_t layer) {
    return [=](std::uint64_t i) { return km::dropout_keep(seed, step, layer, i, 0.5f); };
  };
  EXPECT_EQ(agreement(mask(1, 2, 3), mask(1, 2, 3)), 1.0);
  EXPECT_NEAR(agreement(mask(1, 2, 3), mask(2, 2, 3)), 0.5, 0.03);
  EXPECT_NEAR(agreement(mask(1, 2, 3), mask(1, 3, 3)), 0.5, 0.03);
  EXPECT_NEAR(agreement(mask(1, 2, 3), mask(1, 2, 4)), 0.5, 0.03);
}

TEST(KernelMath, DropoutScale) {
  EXPECT_FLOAT_EQ(km::dropout_scale<float>(0.25f), 4.0f / 3.0f);
  EXPECT_DOUBLE_EQ(km::dropout_scale<double>(0.5f), 2.0);
  EXPECT_EQ(km::dropout_scale<float>(1.0f), 0.0f);
}

// ---- optimizers ----

// PyTorch's AdamW written out in double, independently of math.hpp.
struct AdamWReference {
  double parameter, m = 0.0, v = 0.0;
  void step(double gradient, int t, double lr, double beta1, double beta2, double eps, double weight_decay) {
    parameter -= lr * weight_decay * parameter;
    m = beta1 * m + (1 - beta1) * gradient;
    v = beta2 * v + (1 - beta2) * gradient * gradient;
    const double m_hat = m / (1 - std::pow(beta1, t));
    const double v_hat = v / (1 - std::pow(beta2, t));
    parameter -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

TEST(KernelMath, AdamWFirstStepMovesByLearningRate) {
  // t = 1: m_hat = g and v_hat = g^2, so the step is lr * g / (|g| + eps).
  float parameter = 2.0f, m = 0.0f, v = 0.0f;
  const auto k = km::adamw_constants(0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
  km::adamw_update(parameter, m, v, -3.0f, k);
  EXPECT_NEAR(parameter, 2.01f, 1e-6);
  EXPECT_NEAR(m, -0.3f, 1e-7);
  EXPECT_NEAR(v, (1.0f - 0.999f) * 9.0f, 1e-9);  // 1 - beta2 as formed from the fp32 beta2
}

TEST(KernelMath, AdamWMatchesReferenceOverSteps) {
  const std::vector<double> gradients = {0.5, -1.25, 0.75, 2.0, -0.1, 0.3, -0.7, 1.1};
  for (double weight_decay : {0.0, 0.1}) {
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-6f;
    AdamWReference reference{1.5};
    double p_double = 1.5, m_double = 0.0, v_double = 0.0;
    float p_float = 1.5f, m_float = 0.0f, v_float = 0.0f;
    for (int t = 1; t <= static_cast<int>(gradients.size()); ++t) {
      const double lr = 0.01 * t;  // changes every step, as a schedule does
      reference.step(gradients[t - 1], t, lr, beta1, beta2, eps, weight_decay);
      km::adamw_update(p_double, m_double, v_double, gradients[t - 1],
                       km::adamw_constants<double>(lr, beta1, beta2, eps, weight_decay, t));
      km::adamw_update(
          p_float, m_float, v_float, static_cast<float>(gradients[t - 1]),
          km::adamw_constants<float>(static_cast<float>(lr), beta1, beta2, eps, static_cast<float>(weight_decay), t));
      EXPECT_NEAR(p_double, reference.parameter, 1e-13) << "t " << t;
      EXPECT_NEAR(m_double, reference.m, 1e-14) << "t " << t;
      EXPECT_NEAR(v_double, reference.v, 1e-14) << "t " << t;
      EXPECT_NEAR(p_float, reference.parameter, 1e-5 * std::abs(reference.parameter)) << "t " << t;
    }
  }
}

// PyTorch's SGD (dampening 0) written out in double.
struct SgdReference {
  double parameter, buffer = 0.0;
  int steps = 0;
  void step(double gradient, double lr, double momentum, double weight_decay, bool nesterov) {
    double d = gradient + weight_decay * parameter;
    if (momentum != 0.0) {
      buffer = steps == 0 ? d : momentum * buffer + d;
      d = nesterov ? d + momentum * buffer : buffer;
    }
    parameter -= lr * d;
    ++steps;
  }
};

TEST(KernelMath, SgdHandComputedSteps) {
  // p = 1, g = 0.5, lr = 0.1, momentum 0.9, weight decay 0.01:
  // step 1: d = 0.51, buffer = 0.51, p = 0.949
  // step 2: d = 0.5 + 0.00949 = 0.50949, buffer = 0.459 + 0.50949 = 0.96849, p = 0.949 - 0.096849 = 0.852151
  double p = 1.0, buffer = 0.0;
  km::sgd_update(p, buffer, 0.5, 0.1, 0.9, 0.01, false, true);
  EXPECT_NEAR(p, 0.949, 1e-15);
  EXPECT_NEAR(buffer, 0.51, 1e-15);
  km::sgd_update(p, buffer, 0.5, 0.1, 0.9, 0.01, false, false);
  EXPECT_NEAR(buffer, 0.96849, 1e-15);
  EXPECT_NEAR(p, 0.852151, 1e-15);
  // Nesterov, step 1: buffer = 0.51, d = 0.51 + 0.9 * 0.51 = 0.969, p = 0.9031
  p = 1.0;
  km::sgd_update(p, buffer, 0.5, 0.1, 0.9, 0.01, true, true);
  EXPECT_NEAR(p, 0.9031, 1e-15);
  // no momentum: the buffer is not touched
  p = 1.0;
  buffer = 123.0;
  km::sgd_update(p, buffer, 0.5, 0.1, 0.0, 0.0, false, true);
  EXPECT_NEAR(p, 0.95, 1e-15);
  EXPECT_EQ(buffer, 123.0);
}

TEST(KernelMath, SgdMatchesReferenceOverSteps) {
  const std::vector<double> gradients = {0.5, -1.25, 0.75, 2.0, -0.1, 0.3};
  struct Case {
    double momentum, weight_decay;
    bool nesterov;
  };
  for (const Case c : {Case{0.0, 0.0, false}, Case{0.9, 0.0, false}, Case{0.9, 0.05, false}, Case{0.8, 0.05, true}}) {
    SgdReference reference{-0.75};
    double p_double = -0.75, b_double = 0.0;
    float p_float = -0.75f, b_float = 0.0f;
    for (std::size_t t = 0; t < gradients.size(); ++t) {
      const double lr = 0.05 / (1.0 + t);
      reference.step(gradients[t], lr, c.momentum, c.weight_decay, c.nesterov);
      km::sgd_update(p_double, b_double, gradients[t], lr, c.momentum, c.weight_decay, c.nesterov, t == 0);
      km::sgd_update(p_float, b_float, static_cast<float>(gradients[t]), static_cast<float>(lr),
                     static_cast<float>(c.momentum), static_cast<float>(c.weight_decay), c.nesterov, t == 0);
      EXPECT_NEAR(p_double, reference.parameter, 1e-14) << "momentum " << c.momentum << " t " << t;
      EXPECT_NEAR(p_float, reference.parameter, 1e-6) << "momentum " << c.momentum << " t " << t;
    }
  }
}

TEST(KernelMath, ClipCoefficient) {
  EXPECT_EQ(km::clip_coefficient(10.0f, 0.0f), 1.0f);  // no clipping
  EXPECT_EQ(km::clip_coefficient(0.5f, 1.0f), 1.0f);   // below the limit
  EXPECT_DOUBLE_EQ(km::clip_coefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_FLOAT_EQ(km::clip_coefficient(4.0f, 2.0f), 0.5f);
  EXPECT_EQ(km::clip_coefficient(std::nanf(""), 1.0f), 1.0f);
  EXPECT_EQ(km::clip_coefficient(std::numeric_limits<float>::infinity(), 1.0f), 0.0f);
}

// ---- loss scaler ----

struct ScalerState {
  float scale;
  int tracker, applied, skips;
};

void expect_state(const StepScalars& s, const ScalerState& want, int step) {
  EXPECT_EQ(s.loss_scale, want.scale) << "after step " << step;
  EXPECT_EQ(s.growth_tracker, want.tracker) << "after step " << step;
  EXPECT_EQ(s.applied_steps, want.applied) << "after step " << step;
  EXPECT_EQ(s.consecutive_skips, want.skips) << "after step " << step;
}

TEST(KernelMath, LossScalerFollowsHandWrittenTrajectory) {
  LossScalerConfig config;
  config.enabled = true;
  config.growth_interval = 3;
  StepScalars s;
  s.loss_scale = 1024.0f;
  const int nonfinite[] = {0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0};
  const ScalerState want[] = {
      {1024, 1, 1, 0},  // finite
      {1024, 2, 2, 0},  // finite
      {2048, 0, 3, 0},  // third finite in a row: grow
      {2048, 1, 4, 0},  // finite
      {1024, 0, 4, 1},  // skip: back off, tracker reset, not applied
      {1024, 1, 5, 0},  // finite
      {1024, 2, 6, 0},  // finite
      {512, 0, 6, 1},   // skip
      {256, 0, 6, 2},   // skip again
      {256, 1, 7, 0},   // finite
      {256, 2, 8, 0},   // finite
      {512, 0, 9, 0},   // grow
  };
  for (int step = 0; step < 12; ++step) {
    s.found_nonfinite = nonfinite[step];
    km::update_loss_scale(config, s);
    expect_state(s, want[step], step + 1);
  }
}

TEST(KernelMath, LossScalerDoesNotGrowIntoInfinity) {
  LossScalerConfig config;
  config.enabled = true;
  config.growth_interval = 1;
  StepScalars s;
  s.loss_scale = 3e38f;
  km::update_loss_scale(config, s);
  expect_state(s, {3e38f, 0, 1, 0}, 1);
}

TEST(KernelMath, FixedOrDisabledScalerOnlyCounts) {
  for (const bool enabled : {false, true}) {
    LossScalerConfig config;
    config.enabled = enabled;
    config.dynamic = false;
    config.growth_interval = 1;
    const float initial = enabled ? 128.0f : 1.0f;
    StepScalars s;
    s.loss_scale = initial;
    s.found_nonfinite = 1;
    km::update_loss_scale(config, s);
    expect_state(s, {initial, 0, 0, 1}, 1);
    s.found_nonfinite = 0;
    km::update_loss_scale(config, s);
    km::update_loss_scale(config, s);
    expect_state(s, {initial, 0, 2, 0}, 3);
  }
  // enabled with dynamic on but disabled overall: also fixed
  LossScalerConfig off;
  off.enabled = false;
  off.growth_interval = 1;
  StepScalars s;
  km::update_loss_scale(off, s);
  expect_state(s, {1.0f, 0, 1, 0}, 1);
}

// ---- rows, in double against direct formulas ----

TEST(KernelMath, SoftmaxCrossEntropyRow) {
  const double logits[] = {0.5, -1.0, 2.0, 2.0, 0.25};
  double log_sum = 0.0;
  for (double x : logits) log_sum += std::exp(x);
  log_sum = std::log(log_sum);
  for (int label : {0, 2, 3}) {
    double loss = 0.0, gradient[5];
    bool correct = false;
    km::softmax_cross_entropy_row(logits, 5, label, 0.5, gradient, &loss, &correct);
    EXPECT_NEAR(loss, log_sum - logits[label], 1e-14);
    EXPECT_EQ(correct, label == 2) << "ties go to the lowest index";
    for (int j = 0; j < 5; ++j)
      EXPECT_NEAR(gradient[j], 0.5 * (std::exp(logits[j] - log_sum) - (j == label ? 1.0 : 0.0)), 1e-15);
  }
  // stable for huge logits
  const float big[] = {1000.0f, 999.0f, -1000.0f};
  float loss = 0.0f;
  bool correct = false;
  km::softmax_cross_entropy_row(big, 3, 1, 1.0f, static_cast<float*>(nullptr), &loss, &correct);
  EXPECT_NEAR(loss, 1.0 + std::log1p(std::exp(-1.0)), 1e-5);
  EXPECT_FALSE(correct);
}

TEST(KernelMath, LayernormRows) {
  const double x[] = {1.0, -2.0, 0.5, 3.0};
  const double gamma[] = {1.5, 0.5, -1.0, 2.0}, beta[] = {0.1, 0.2, 0.3, 0.4};
  const double mean = 0.625;
  double variance = 0.0;
  for (double v : x) variance += (v - mean) * (v - mean) / 4.0;
  const double rstd = 1.0 / std::sqrt(variance + 1e-5);
  double y[4], got_mean = 0.0, got_rstd = 0.0;
  km::layernorm_forward_row(x, 4, gamma, beta, 1e-5, y, &got_mean, &got_rstd);
  EXPECT_NEAR(got_mean, mean, 1e-15);
  EXPECT_NEAR(got_rstd, rstd, 1e-13);
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(y[j], (x[j] - mean) * rstd * gamma[j] + beta[j], 1e-14);
}

}  // namespace
}  // namespace hpctrain
