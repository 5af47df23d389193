// The residual add folded into the product that ends a branch (Backend::linear_residual_forward, issue 16) on the CPU
// backend: the fused product against the composed one (gemm, then add) and a host f64 reference, per dtype; and a GPT
// model (embedding, two transformer_blocks) trained one step with the fusion on and off (HPCTRAIN_FUSE_RESIDUAL=0):
// fp32 results are bit-identical (the fp32 sum (x W^T + b) + skip is the same operations in the same order), bf16
// ones differ by the one rounding of the branch output the fused path skips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {
namespace {

// Host buffer holding `values` in `dtype` (the CPU backend's memory is host memory).
std::vector<char> stored(Backend& backend, const std::vector<double>& values, DType dtype) {
  std::vector<char> bytes(values.size() * dtype_size(dtype));
  const auto count = static_cast<std::int64_t>(values.size());
  backend.cast({const_cast<double*>(values.data()), DType::f64, count, 1}, {bytes.data(), dtype, count, 1});
  return bytes;
}

std::vector<double> widened(Backend& backend, const void* data, DType dtype, std::int64_t count) {
  std::vector<double> values(static_cast<std::size_t>(count));
  backend.cast({const_cast<void*>(data), dtype, count, 1}, {values.data(), DType::f64, count, 1});
  return values;
}

double relative_norm(const std::vector<double>& got, const std::vector<double>& expected) {
  double difference = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;  // NaN never passes
    difference += (got[i] - expected[i]) * (got[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  return std::sqrt(difference / norm);
}

struct ProductCase {
  DType dtype;
  double tolerance;  // relative norm against f64
};

TEST(ResidualFusion, ProductMatchesComposedAndReference) {
  auto backend = make_cpu_backend();
  ASSERT_TRUE(backend->fuses_residual_add(DType::f32));
  constexpr std::int64_t rows = 37, in = 48, out = 40;
  std::mt19937 generator(11);
  std::normal_distribution<double> normal;
  const auto random = [&](std::int64_t count) {
    std::vector<double> values(static_cast<std::size_t>(count));
    for (double& value : values) value = normal(generator);
    return values;
  };
  const std::vector<double> x = random(rows * in), weight = random(out * in), bias = random(out),
                            skip = random(rows * out);
  for (const ProductCase test : {ProductCase{DType::f64, 1e-14}, ProductCase{DType::f32, 1e-6},
                                 ProductCase{DType::bf16, 1e-2}, ProductCase{DType::f16, 2e-3}}) {
    const DType dtype = test.dtype;
    SCOPED_TRACE(dtype_name(dtype));
    const DType master = dtype == DType::f64 ? DType::f64 : DType::f32;
    auto x_data = stored(*backend, x, dtype), weight_data = stored(*backend, weight, dtype),
         bias_data = stored(*backend, bias, master), skip_data = stored(*backend, skip, dtype);
    // The reference from the inputs as stored (rounded to dtype).
    const auto x_in = widened(*backend, x_data.data(), dtype, rows * in);
    const auto weight_in = widened(*backend, weight_data.data(), dtype, out * in);
    const auto skip_in = widened(*backend, skip_data.data(), dtype, rows * out);
    std::vector<double> expected(static_cast<std::size_t>(rows * out));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        double sum = bias[o];
        for (std::int64_t i = 0; i < in; ++i) sum += x_in[r * in + i] * weight_in[o * in + i];
        expected[r * out + o] = sum + skip_in[r * out + o];
      }
    const std::vector<double> nan(static_cast<std::size_t>(rows * out), NAN);
    auto fused = stored(*backend, nan, dtype), composed = stored(*backend, nan, dtype);  // poisoned
    const TensorView x_view{x_data.data(), dtype, rows, in}, weight_view{weight_data.data(), dtype, out, in},
        skip_view{skip_data.data(), dtype, rows, out};
    backend->linear_residual_forward(x_view, weight_view, bias_data.data(), skip_view,
                                     {fused.data(), dtype, rows, out});
    backend->Backend::linear_residual_forward(x_view, weight_view, bias_data.data(), skip_view,
                                              {composed.data(), dtype, rows, out});
    const auto fused_values = widened(*backend, fused.data(), dtype, rows * out);
    const auto composed_values = widened(*backend, composed.data(), dtype, rows * out);
    const double fused_error = relative_norm(fused_values, expected);
    EXPECT_LT(fused_error, test.tolerance);
    EXPECT_LT(relative_norm(composed_values, expected), test.tolerance);
    testing::Test::RecordProperty(std::string("fused_error_") + dtype_name(dtype), std::to_string(fused_error));
    // f32 and f64: one rounding of the same sum in the same order (oneDNN's post-op follows the bias in fp32).
    if (dtype == DType::f32 || dtype == DType::f64)
      EXPECT_EQ(std::memcmp(fused.data(), composed.data(), fused.size()), 0) << "not bit-identical";
    else
      EXPECT_LT(relative_norm(fused_values, composed_values), test.tolerance);
  }
}

// One training step's output and gradients of a GPT model: embedding, two transformer_blocks, layernorm, head.
struct GptStep {
  std::vector<double> logits, gradients;
  std::size_t activation_bytes = 0;
};

GptStep gpt_step(DType activations, bool fuse) {
  if (fuse)
    unsetenv("HPCTRAIN_FUSE_RESIDUAL");
  else
    setenv("HPCTRAIN_FUSE_RESIDUAL", "0", 1);
  constexpr std::int64_t rows = 3, positions = 8, width = 16, vocabulary = 11;
  const auto spec = [](LayerType type, const std::string& name, std::int64_t out = 0) {
    LayerSpec layer;
    layer.type = type;
    layer.name = name;
    layer.out = out;
    layer.vocabulary = vocabulary;
    layer.positions = true;
    layer.heads = 2;
    layer.causal = true;
    layer.mlp_ratio = 2;
    return layer;
  };
  auto backend = make_cpu_backend();
  Model model(ModelSection{{spec(LayerType::embedding, "wte", width), spec(LayerType::transformer_block, "h0"),
                            spec(LayerType::transformer_block, "h1"), spec(LayerType::layernorm, "ln_f"),
                            spec(LayerType::linear, "lm_head", vocabulary)}},
              SampleShape{positions}, *backend, {activations, DType::f32, rows}, "test.toml");
  unsetenv("HPCTRAIN_FUSE_RESIDUAL");
  model.initialize(7);
  std::mt19937 generator(5);
  std::vector<std::int32_t> ids(rows * positions), targets(rows * positions);
  for (auto& id : ids) id = static_cast<std::int32_t>(generator() % vocabulary);
  for (auto& target : targets) target = static_cast<std::int32_t>(generator() % vocabulary);
  backend->copy_to_backend(model.token_ids(), ids.data(), ids.size() * sizeof(std::int32_t));
  backend->copy_to_backend(model.loss().answers(), targets.data(), targets.size() * sizeof(std::int32_t));
  std::vector<std::int64_t> sample_ids{0, 1, 2};
  const StepContext context{backend.get(), true, 5, 1, sample_ids.data(), rows};
  GptStep step;
  const TensorView output = model.forward(context);
  step.logits = widened(*backend, output.data, output.dtype, output.size());
  LossSums sums;
  float scale = 1.0f / static_cast<float>(rows * positions);
  model.apply_loss(rows, &scale, &sums);
  model.backward(context, false, nullptr);
  step.gradients = widened(*backend, model.gradients(), DType::f32, model.parameter_count());
  step.activation_bytes = model.memory().activations;
  return step;
}

TEST(ResidualFusion, GptStepFp32IsBitIdentical) {
  const GptStep fused = gpt_step(DType::f32, true), separate = gpt_step(DType::f32, false);
  // The fused model keeps no buffer for the branches' outputs: the fusion ran (4 branches, (3 rows, 8 x 16) floats).
  EXPECT_EQ(separate.activation_bytes - fused.activation_bytes, 4u * 3 * 8 * 16 * sizeof(float));
  EXPECT_EQ(fused.logits, separate.logits);
  EXPECT_EQ(fused.gradients, separate.gradients);
}

TEST(ResidualFusion, GptStepBf16AgreesWithinItsPrecision) {
  const GptStep fused = gpt_step(DType::bf16, true), separate = gpt_step(DType::bf16, false);
  const GptStep reference = gpt_step(DType::f32, false);
  EXPECT_LT(fused.activation_bytes, separate.activation_bytes);
  const double logits_apart = relative_norm(fused.logits, separate.logits);
  const double gradients_apart = relative_norm(fused.gradients, separate.gradients);
  EXPECT_GT(logits_apart, 0.0);  // one rounding fewer: not the same numbers
  EXPECT_LT(logits_apart, 2e-2);
  EXPECT_LT(gradients_apart, 5e-2);
  // Both as close to the fp32 step as bf16 allows.
  EXPECT_LT(relative_norm(fused.logits, reference.logits), 2e-2);
  EXPECT_LT(relative_norm(separate.logits, reference.logits), 2e-2);
  EXPECT_LT(relative_norm(fused.gradients, reference.gradients), 5e-2);
  testing::Test::RecordProperty("logits_apart", std::to_string(logits_apart));
  testing::Test::RecordProperty("gradients_apart", std::to_string(gradients_apart));
}

}  // namespace
}  // namespace hpctrain
