// Gradients of a model run in bf16 and fp16 (16-bit activations and working weights, fp32 master weights, fp32 loss)
// against the same model in fp32, on the same parameters and inputs: an MLP with layernorm, and a CNN (conv2d,
// groupnorm, max and average pooling, conv3d is the same code path) on (3, 8, 8) images. Tolerances (relative L2 norm
// over all parameter gradients), documented in docs/mixed-precision.md: bf16 3e-2 (8-bit mantissa), fp16 5e-3 (11-bit
// mantissa).
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
  spec.name = type + std::to_string(out);
  spec.out = out;
  return spec;
}

LayerSpec spatial(const std::string& type, std::int64_t out, std::int64_t kernel, std::int64_t padding = 0) {
  LayerSpec spec = layer(type, out);
  spec.name += std::to_string(kernel) + std::to_string(padding);
  spec.kernel = {kernel};
  spec.padding = {padding};
  spec.groups = type == "groupnorm" ? 4 : 1;
  return spec;
}

struct Network {
  std::vector<LayerSpec> layers;
  SampleShape input;
};

Network mlp() {
  return {
      {layer("linear", 64), layer("gelu"), layer("linear", 64), layer("layernorm"), layer("relu"), layer("linear", 10)},
      {48}};
}

Network cnn() {
  return {
      {spatial("conv2d", 16, 3, 1), spatial("groupnorm", 0, 0), layer("relu"), spatial("maxpool2d", 0, 2),
       spatial("conv2d", 16, 3, 1), layer("gelu"), spatial("avgpool2d", 0, 2), layer("flatten"), layer("linear", 10)},
      {3, 8, 8}};
}

// Parameter gradients of one forward/backward in the given activation dtype.
std::vector<float> gradients(const Network& network, DType activation, const std::vector<float>& input,
                             const std::vector<std::int32_t>& labels, std::int64_t rows, double* loss) {
  auto backend = make_cpu_backend();
  ModelSection spec;
  spec.layers = network.layers;
  const std::int64_t features = shape_size(network.input);
  Model model(spec, network.input, *backend, {activation, DType::f32, rows}, "test.toml");
  model.initialize(17);
  std::vector<std::int64_t> ids(rows);
  for (std::int64_t i = 0; i < rows; ++i) ids[i] = i;
  StepContext context{backend.get(), true, 1, 0, ids.data(), rows};
  const TensorView in = model.input(rows);
  backend->cast({const_cast<float*>(input.data()), DType::f32, rows, features}, in);
  const TensorView out = model.forward(context);
  const float scale = 1.0f / static_cast<float>(rows);
  LossSums sums;
  backend->softmax_cross_entropy(out, labels.data(), &scale, out, &sums);
  *loss = sums.loss_sum / static_cast<double>(rows);
  model.backward(context, false, nullptr);
  const auto* g = static_cast<const float*>(model.gradients());
  return {g, g + model.parameter_count()};
}

double relative_error(const std::vector<float>& value, const std::vector<float>& reference) {
  double difference = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (!std::isfinite(value[i])) return INFINITY;
    difference += std::pow(double(value[i]) - reference[i], 2);
    norm += std::pow(double(reference[i]), 2);
  }
  return std::sqrt(difference / norm);
}

class MixedPrecisionGradients : public testing::TestWithParam<Network> {};

TEST_P(MixedPrecisionGradients, AgreeWithFp32WithinDocumentedTolerances) {
  const std::int64_t rows = 32, features = shape_size(GetParam().input);
  std::mt19937 generator(5);
  std::normal_distribution<float> normal;
  std::vector<float> input(rows * features);
  for (auto& value : input) value = normal(generator);
  std::vector<std::int32_t> labels(rows);
  for (auto& label : labels) label = static_cast<std::int32_t>(generator() % 10);

  double loss32 = 0, loss_bf16 = 0, loss_fp16 = 0;
  const auto reference = gradients(GetParam(), DType::f32, input, labels, rows, &loss32);
  const auto bf16 = gradients(GetParam(), DType::bf16, input, labels, rows, &loss_bf16);
  const auto fp16 = gradients(GetParam(), DType::f16, input, labels, rows, &loss_fp16);
  const double error_bf16 = relative_error(bf16, reference), error_fp16 = relative_error(fp16, reference);
  std::printf("relative gradient error: bf16 %.2e, fp16 %.2e; loss fp32 %.6f bf16 %.6f fp16 %.6f\n", error_bf16,
              error_fp16, loss32, loss_bf16, loss_fp16);
  EXPECT_LT(error_bf16, 3e-2);
  EXPECT_LT(error_fp16, 5e-3);
  // 16-bit runs must differ from fp32 at all: otherwise the test is not exercising 16-bit storage.
  EXPECT_GT(error_bf16, 1e-5);
  EXPECT_GT(error_fp16, 1e-6);
  EXPECT_NEAR(loss_bf16, loss32, 2e-2 * loss32);
  EXPECT_NEAR(loss_fp16, loss32, 2e-3 * loss32);
}

INSTANTIATE_TEST_SUITE_P(Models, MixedPrecisionGradients, testing::Values(mlp(), cnn()),
                         [](const testing::TestParamInfo<Network>& info) { return info.index == 0 ? "mlp" : "cnn"; });

}  // namespace
}  // namespace hpctrain
