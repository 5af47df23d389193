// Residual blocks in the Model: the forward pass against a host f64 reference (output = input + branch(input)), the
// names the branch's layers get (summaries and checkpoints), the one buffer an opening marker and its input share,
// and the error for a branch that changes the sample's shape. Their gradients are checked by central differences in
// model_gradient_test.cpp (feature vectors, images) and sequence_model_test.cpp (a GPT-style MLP block).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {
namespace {

LayerSpec layer(LayerType type, const std::string& name, std::int64_t out = 0) {
  LayerSpec spec;
  spec.type = type;
  spec.name = name;
  spec.out = out;
  return spec;
}

LayerSpec residual(const std::string& name, std::vector<LayerSpec> branch) {
  LayerSpec spec = layer(LayerType::residual, name);
  spec.layers = std::move(branch);
  return spec;
}

constexpr std::int64_t rows = 3, features = 4, width = 5;

// linear(4 -> 5), then x + linear(tanh(linear(x))) on width 5.
ModelSection residual_mlp() {
  return ModelSection{{layer(LayerType::linear, "linear0", width),
                       residual("block", {layer(LayerType::linear, "linear0", width), layer(LayerType::tanh, "tanh1"),
                                          layer(LayerType::linear, "linear2", width)})}};
}

TEST(ResidualModel, ForwardMatchesReference) {
  auto backend = make_cpu_backend();
  Model model(residual_mlp(), features, *backend, {DType::f64, DType::f64, rows}, "test.toml");
  model.initialize(3);
  std::mt19937 generator(4);
  std::normal_distribution<double> normal;
  auto* master = static_cast<double*>(model.master());
  for (std::int64_t i = 0; i < model.parameter_count(); ++i) master[i] = normal(generator);  // random biases too
  std::vector<double> input(rows * features);
  for (double& value : input) value = normal(generator);
  const TensorView in = model.input(rows);
  backend->copy_to_backend(in.data, input.data(), input.size() * sizeof(double));
  std::fill_n(static_cast<double*>(model.output(rows).data), rows * width, NAN);  // poisoned
  std::vector<std::int64_t> sample_ids{0, 1, 2};
  const TensorView output = model.forward({backend.get(), false, 1, 0, sample_ids.data(), rows});

  const auto& entries = model.parameter_entries();  // linear0, block.linear0, block.linear2: weight and bias each
  ASSERT_EQ(entries.size(), 6u);
  const auto tensor = [&](std::size_t entry) { return master + entries[entry].offset; };
  const auto linear = [](const double* weight, const double* bias, const std::vector<double>& x, std::int64_t in) {
    std::vector<double> y(width);
    for (std::int64_t o = 0; o < width; ++o) {
      y[o] = bias[o];
      for (std::int64_t i = 0; i < in; ++i) y[o] += weight[o * in + i] * x[i];
    }
    return y;
  };
  double worst = 0.0, norm = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::vector<double> x(input.begin() + r * features, input.begin() + (r + 1) * features);
    const std::vector<double> h = linear(tensor(0), tensor(1), x, features);
    std::vector<double> branch = linear(tensor(2), tensor(3), h, width);
    for (double& value : branch) value = std::tanh(value);
    branch = linear(tensor(4), tensor(5), branch, width);
    for (std::int64_t o = 0; o < width; ++o) {
      const double expected = h[o] + branch[o];
      const double got = static_cast<const double*>(output.data)[r * width + o];
      ASSERT_FALSE(std::isnan(got)) << "row " << r << " output " << o;
      worst = std::max(worst, std::abs(got - expected));
      norm = std::max(norm, std::abs(expected));
    }
  }
  EXPECT_LT(worst / norm, 1e-14);
}

TEST(ResidualModel, LayersAndParameterNames) {
  auto backend = make_cpu_backend();
  Model model(residual_mlp(), features, *backend, {DType::f32, DType::f32, rows}, "test.toml");
  // linear0, the opening marker, three branch layers, the closing add
  ASSERT_EQ(model.layer_count(), 6u);
  EXPECT_EQ(model.layer(1).type(), "residual");
  EXPECT_EQ(model.layer(1).name(), "block");
  EXPECT_EQ(model.layer(2).name(), "block.linear0");
  EXPECT_EQ(model.layer(4).name(), "block.linear2");
  EXPECT_EQ(model.layer(5).type(), "add");
  std::vector<std::string> names;
  for (const ParameterEntry& entry : model.parameter_entries()) names.push_back(entry.layer + "/" + entry.name);
  EXPECT_EQ(names, (std::vector<std::string>{"linear0/weight", "linear0/bias", "block.linear0/weight",
                                             "block.linear0/bias", "block.linear2/weight", "block.linear2/bias"}));
  // parameters in forward order: the branch's come after linear0's
  EXPECT_EQ(model.parameter_begin(2), model.parameter_entries()[2].offset);
  EXPECT_EQ(model.parameter_begin(1), model.parameter_begin(2));  // the marker has none
  const std::string summary = model.summary();
  EXPECT_NE(summary.find("block.linear0"), std::string::npos) << summary;
  // The opening marker's output is its input: no buffer (rows x width activation) of its own, one skip gradient. The
  // branch's last linear writes the block's sum (the add fused into its product): no buffer for its own output.
  const std::size_t f32 = sizeof(float);
  EXPECT_EQ(model.memory().activations, rows * f32 *
                                            (features + width /* linear0 -> marker */ + 2 * width /* branch */ +
                                             width /* output */ + 2 * width /* scratch */ + width /* skip gradient */));
}

TEST(ResidualModel, BranchThatChangesTheShapeIsAnInputError) {
  auto backend = make_cpu_backend();
  ModelSection spec{
      {layer(LayerType::linear, "linear0", width), residual("block", {layer(LayerType::linear, "wide", 2 * width)})}};
  spec.layers[1].position = {12, 3};
  try {
    Model model(spec, features, *backend, {DType::f32, DType::f32, rows}, "deck.toml");
    FAIL() << "no error";
  } catch (const InputError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("deck.toml:12:3: the branch of residual block 'block' turns samples (N, 5) into (N, 10)"),
              std::string::npos)
        << message;
    EXPECT_NE(error.hint().find("out = 5"), std::string::npos) << error.hint();
  }
}

}  // namespace
}  // namespace hpctrain
