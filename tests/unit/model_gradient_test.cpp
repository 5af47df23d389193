// Finite-difference gradient checks in double precision through the real layer code: a Model built with f64
// activations and parameters on the CPU backend, every layer type (the convolutional ones on small images and volumes
// with stride, padding, dilation and groups; vision transformers: patch conv, to_sequence, encoder) and both losses.
// Central differences of the loss with respect to every parameter are compared with the gradients backward()
// produced.
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
  spec.type = *choice_named<LayerType>(type);
  spec.name = type + std::to_string(out) + std::to_string(std::rand());
  spec.out = out;
  spec.p = 0.3;
  spec.negative_slope = 0.1;
  return spec;
}

// A conv or pooling layer: kernel, stride, padding, dilation (one value per axis or one for all), groups.
LayerSpec spatial(const std::string& type, std::int64_t out, std::vector<std::int64_t> kernel,
                  std::vector<std::int64_t> stride = {}, std::vector<std::int64_t> padding = {0},
                  std::vector<std::int64_t> dilation = {1}, std::int64_t groups = 1) {
  LayerSpec spec = layer(type, out);
  spec.kernel = std::move(kernel);
  spec.stride = std::move(stride);
  spec.padding = std::move(padding);
  spec.dilation = std::move(dilation);
  spec.groups = groups;
  return spec;
}

LayerSpec gelu_tanh() {
  LayerSpec spec = layer("gelu");
  spec.approximate = GeluApproximation::tanh;
  return spec;
}

LayerSpec groupnorm(std::int64_t groups) {
  LayerSpec spec = layer("groupnorm");
  spec.groups = groups;
  return spec;
}

// A residual block: output = input + branch(input).
LayerSpec residual(std::vector<LayerSpec> branch) {
  LayerSpec spec = layer("residual");
  spec.layers = std::move(branch);
  for (auto& inner : spec.layers) inner.name = "inner" + std::to_string(std::rand());
  return spec;
}

struct Case {
  std::string name;
  std::vector<LayerSpec> layers;
  std::string loss;
  SampleShape input = {5};  // one sample
};

class ModelGradient : public testing::TestWithParam<Case> {};

void check_gradients(const Case& test, SpatialLayout layout);

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
  // Both activation layouts a conv stack can run in (models with only flat layers ignore the preference).
  for (SpatialLayout layout : {SpatialLayout::channels_last, SpatialLayout::channels_first}) {
    SCOPED_TRACE(layout == SpatialLayout::channels_last ? "channels-last backend" : "channels-first backend");
    check_gradients(GetParam(), layout);
  }
}

void check_gradients(const Case& test, SpatialLayout layout) {
  auto backend = make_cpu_backend(layout);
  const std::int64_t rows = test.input.size() > 1 ? 3 : 6;
  const std::int64_t features = shape_size(test.input);
  ModelSection spec;
  spec.layers = test.layers;
  spec.loss = *choice_named<LossKind>(test.loss);
  Model model(spec, test.input, *backend, {DType::f64, DType::f64, rows}, "test.toml");
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
  testing::Test::RecordProperty("worst_relative_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(
    Layers, ModelGradient,
    testing::Values(
        Case{"linear_relu_ce", {layer("linear", 7), layer("relu"), layer("linear", 4)}, "cross_entropy"},
        Case{"gelu_tanh_ce",
             {layer("linear", 6), layer("gelu"), layer("linear", 6), layer("tanh"), layer("linear", 3)},
             "cross_entropy"},
        Case{"gelu_approximate_tanh_mse", {layer("linear", 6), gelu_tanh(), layer("linear", 2)}, "mse"},
        Case{"leaky_layernorm_mse",
             {layer("linear", 6), layer("layernorm"), layer("leaky_relu"), layer("linear", 2)},
             "mse"},
        Case{"dropout_ce", {layer("linear", 8), layer("dropout"), layer("linear", 3)}, "cross_entropy"},
        Case{"layernorm_first_mse", {layer("layernorm"), layer("linear", 3)}, "mse"},
        Case{"conv2d_maxpool_ce",
             {spatial("conv2d", 3, {3}, {1}, {1}), layer("tanh"), spatial("maxpool2d", 0, {2}), layer("flatten"),
              layer("linear", 3)},
             "cross_entropy",
             {2, 5, 5}},
        Case{"conv2d_stride_dilation_groups_mse",
             {spatial("conv2d", 4, {3, 2}, {2, 1}, {1, 0}, {2, 1}, 2), layer("leaky_relu"),
              spatial("avgpool2d", 0, {2}, {1}, {1}), spatial("conv2d", 2, {1}, {1}, {0}, {1}, 2),
              layer("global_avgpool"), layer("linear", 2)},
             "mse",
             {4, 7, 6}},
        Case{"conv2d_groupnorm_maxpool_padding_ce",
             {spatial("conv2d", 4, {2}), groupnorm(2), layer("gelu"), spatial("maxpool2d", 0, {3}, {2}, {1}),
              layer("flatten"), layer("linear", 3)},
             "cross_entropy",
             {1, 6, 5}},
        Case{"conv3d_groupnorm_pool_mse",
             {spatial("conv3d", 4, {3}, {1, 2, 1}, {1}, {1, 1, 2}), groupnorm(2), layer("leaky_relu"),
              spatial("maxpool3d", 0, {2}), spatial("avgpool3d", 0, {1, 1, 2}), layer("flatten"), layer("linear", 2)},
             "mse",
             {2, 4, 5, 6}},
        Case{"residual_mlp_ce",
             {layer("linear", 6), residual({layer("linear", 6), layer("relu"), layer("linear", 6)}),
              residual({layer("layernorm"), layer("linear", 8), gelu_tanh(), layer("dropout"), layer("linear", 6)}),
              layer("linear", 3)},
             "cross_entropy"},
        // A block on the model's input and one whose closing add is the model's output.
        Case{"residual_first_and_last_mse",
             {residual({layer("linear", 5), layer("tanh")}), layer("linear", 4),
              residual({layer("layernorm"), layer("linear", 4)})},
             "mse"},
        // Inside a conv stack (channels-last: the block's input is the converted input batch).
        Case{"residual_conv2d_ce",
             {residual({spatial("conv2d", 2, {3}, {1}, {1}), layer("tanh"), spatial("conv2d", 2, {3}, {1}, {1})}),
              spatial("maxpool2d", 0, {2}), layer("flatten"), layer("linear", 3)},
             "cross_entropy",
             {2, 5, 5}},
        // Vision transformers: patches by a strided conv, to_sequence, a non-causal encoder, pooled to classes.
        Case{"vision_transformer_ce",
             [] {
               LayerSpec tokens = layer("to_sequence");
               tokens.class_token = true;
               tokens.positions = true;
               LayerSpec block = layer("transformer_block");
               block.heads = 2;
               block.causal = false;
               block.mlp_ratio = 2;
               LayerSpec pool = layer("sequence_pool");
               pool.mode = SequencePoolMode::first;
               return std::vector<LayerSpec>{spatial("conv2d", 4, {2}, {2}), tokens, block, layer("layernorm"), pool,
                                             layer("linear", 3)};
             }(),
             "cross_entropy",
             {3, 4, 6}},
        Case{"vision_transformer_3d_mse",
             [] {
               LayerSpec tokens = layer("to_sequence");
               tokens.positions = true;
               LayerSpec attention = layer("attention");
               attention.heads = 2;
               attention.causal = false;
               return std::vector<LayerSpec>{spatial("conv3d", 4, {2}, {2}), tokens, attention, layer("sequence_pool"),
                                             layer("linear", 2)};
             }(),
             "mse",
             {2, 4, 4, 4}},
        Case{"conv3d_groups_no_bias_ce",
             [] {
               LayerSpec conv = spatial("conv3d", 2, {2, 1, 2}, {1}, {0, 1, 0}, {1}, 2);
               conv.bias = false;
               return std::vector<LayerSpec>{conv, layer("tanh"), layer("global_avgpool"), layer("linear", 3)};
             }(),
             "cross_entropy",
             {2, 3, 3, 4}}),
    [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace hpctrain
