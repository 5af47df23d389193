// Finite-difference gradient checks in double precision through the real layer code: a Model built with f64
// activations and parameters on the CPU backend, every layer type and both losses. Central differences of the loss with
// respect to every parameter are compared with the gradients backward() produced.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {
namespace {

LayerSpec layer(const std::string& type, std::int64_t out = 0) {
  LayerSpec spec;
  spec.type = type;
  spec.name = type + std::to_string(out) + std::to_string(std::rand());
  spec.out = out;
  spec.p = 0.3;
  spec.negative_slope = 0.1;
  return spec;
}

struct Case {
  std::string name;
  std::vector<LayerSpec> layers;
  std::string loss;
};

class ModelGradient : public testing::TestWithParam<Case> {};

// loss(parameters) over a fixed batch: mean over rows of the per-sample loss.
double evaluate(Backend& backend, Model& model, const StepContext& context, const std::vector<double>& input,
                const std::string& loss, const std::int32_t* labels, const double* targets, float* grad_scale,
                LossSums* sums, bool with_gradient) {
  const TensorView in = model.input(context.rows);
  backend.copy_to_backend(in.data, input.data(), input.size() * sizeof(double));
  const TensorView output = model.forward(context);
  backend.zero(sums, sizeof(LossSums));
  TensorView gradient = output;
  if (!with_gradient) gradient.data = nullptr;
  if (loss == "mse")
    backend.mean_squared_error(output, targets, grad_scale, gradient, sums);
  else
    backend.softmax_cross_entropy(output, labels, grad_scale, gradient, sums);
  return sums->loss_sum / static_cast<double>(context.rows);
}

TEST_P(ModelGradient, MatchesCentralDifferences) {
  const Case& test = GetParam();
  auto backend = make_cpu_backend();
  const std::int64_t rows = 6, features = 5;
  ModelSection spec;
  spec.layers = test.layers;
  spec.loss = test.loss;
  Model model(spec, features, *backend, {DType::f64, DType::f64, rows}, "test.toml");
  model.initialize(3);

  std::mt19937 generator(11);
  std::normal_distribution<double> normal;
  std::vector<double> input(static_cast<std::size_t>(rows * features));
  for (auto& value : input) value = normal(generator);
  std::vector<std::int32_t> labels(rows);
  for (auto& label : labels) label = static_cast<std::int32_t>(generator() % model.output_width());
  std::vector<double> targets(static_cast<std::size_t>(rows * model.output_width()));
  for (auto& value : targets) value = normal(generator);
  std::vector<std::int64_t> sample_ids(rows);
  for (std::int64_t i = 0; i < rows; ++i) sample_ids[i] = 100 + 3 * i;

  float grad_scale = 1.0f / static_cast<float>(rows);
  LossSums sums;
  StepContext context{backend.get(), true, 5, 2, sample_ids.data(), rows};
  evaluate(*backend, model, context, input, test.loss, labels.data(), targets.data(), &grad_scale, &sums, true);
  model.backward(context, false, nullptr);
  const auto* analytic = static_cast<const double*>(model.gradients());
  std::vector<double> expected(analytic, analytic + model.parameter_count());

  auto* parameters = static_cast<double*>(model.master());
  double worst = 0.0;
  const double step = 1e-6;
  for (std::int64_t i = 0; i < model.parameter_count(); ++i) {
    const double saved = parameters[i];
    parameters[i] = saved + step;
    const double plus =
        evaluate(*backend, model, context, input, test.loss, labels.data(), targets.data(), &grad_scale, &sums, false);
    parameters[i] = saved - step;
    const double minus =
        evaluate(*backend, model, context, input, test.loss, labels.data(), targets.data(), &grad_scale, &sums, false);
    parameters[i] = saved;
    const double numeric = (plus - minus) / (2 * step);
    const double error = std::abs(numeric - expected[static_cast<std::size_t>(i)]) / std::max(1e-3, std::abs(numeric));
    ASSERT_FALSE(std::isnan(expected[static_cast<std::size_t>(i)])) << "parameter " << i;
    worst = std::max(worst, error);
    EXPECT_LT(error, 1e-5) << test.name << ": parameter " << i << " analytic " << expected[static_cast<std::size_t>(i)]
                           << " numeric " << numeric;
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(
    Layers, ModelGradient,
    testing::Values(Case{"linear_relu_ce", {layer("linear", 7), layer("relu"), layer("linear", 4)}, "cross_entropy"},
                    Case{"gelu_tanh_ce",
                         {layer("linear", 6), layer("gelu"), layer("linear", 6), layer("tanh"), layer("linear", 3)},
                         "cross_entropy"},
                    Case{"leaky_layernorm_mse",
                         {layer("linear", 6), layer("layernorm"), layer("leaky_relu"), layer("linear", 2)},
                         "mse"},
                    Case{"dropout_ce", {layer("linear", 8), layer("dropout"), layer("linear", 3)}, "cross_entropy"},
                    Case{"layernorm_first_mse", {layer("layernorm"), layer("linear", 3)}, "mse"}),
    [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace hpctrain
