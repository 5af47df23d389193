// model.init (issue 16): the default (PyTorch's per-layer initialisation) unchanged bit for bit, GPT-2's scheme
// (normal(0, 0.02) weights, zero biases, layernorm 1 and 0, residual output projections scaled) by the statistics of
// the generated tensors, and both independent of the buffers a rank count brings (rows per rank, tensor alignment).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {
namespace {

constexpr std::int64_t sequence = 32, vocabulary = 512, width = 64, hidden = 100;
constexpr std::uint64_t seed = 17;

LayerSpec layer(LayerType type, std::int64_t out = 0) {
  LayerSpec spec;
  spec.type = type;
  spec.name = std::string(word_of(type)) + std::to_string(out);
  spec.out = out;
  spec.vocabulary = vocabulary;
  spec.positions = true;
  return spec;
}

ModelSection language_model(InitScheme init) {
  ModelSection section{{layer(LayerType::embedding, width), layer(LayerType::layernorm),
                        layer(LayerType::linear, hidden), layer(LayerType::gelu),
                        layer(LayerType::linear, vocabulary)}};
  section.init = init;
  return section;
}

struct Initialized {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  Model model;
  Initialized(InitScheme init, std::int64_t rows, std::size_t alignment)
      : model(language_model(init), SampleShape{sequence}, *backend, {DType::f32, DType::f32, rows, true, alignment},
              "test.toml") {
    model.initialize(seed);
  }
  // Tensor `index` of the checkpoint's list (layer, name, values).
  [[nodiscard]] std::vector<float> tensor(std::size_t index) const {
    const ParameterEntry& entry = model.parameter_entries().at(index);
    const float* master = static_cast<const float*>(model.master()) + entry.offset;
    return {master, master + entry.count};
  }
};

double mean_of(const std::vector<float>& values) {
  double sum = 0.0;
  for (float value : values) sum += value;
  return sum / static_cast<double>(values.size());
}

double std_of(const std::vector<float>& values) {
  const double mean = mean_of(values);
  double sum = 0.0;
  for (float value : values) sum += (value - mean) * (value - mean);
  return std::sqrt(sum / static_cast<double>(values.size()));
}

// The default, written out: PyTorch's uniform(+-1/sqrt(fan_in)) for linear layers, normal(0, 1) (Box-Muller on pairs
// of uniforms) for the embedding's tables, each tensor from stream layer * 8 + tensor.
TEST(Initialization, DefaultIsPyTorchsBitForBit) {
  const Initialized test(InitScheme::pytorch, 4, 0);
  const auto& entries = test.model.parameter_entries();
  ASSERT_EQ(entries.size(), 8u);  // table, position, gamma, beta, weight, bias, weight, bias
  for (std::size_t index = 0; index < entries.size(); ++index) {
    const ParameterEntry& entry = entries[index];
    SCOPED_TRACE(entry.layer + "/" + entry.name);
    const std::vector<float> values = test.tensor(index);
    const std::uint32_t layer_index = entry.layer == "embedding64" ? 0 : entry.layer == "linear100" ? 2 : 4;
    const std::uint32_t stream = layer_index * 8 + (entry.name == "bias" || entry.name == "position" ? 1 : 0);
    for (std::size_t i = 0; i < values.size(); ++i) {
      float expected = 0.0f;
      if (entry.layer_type == "layernorm") {
        expected = entry.name == "weight" ? 1.0f : 0.0f;
      } else if (entry.layer_type == "embedding") {
        const double u1 = 1.0 - random_uniform(seed, RngPurpose::init, stream, 2 * i);
        const double u2 = random_uniform(seed, RngPurpose::init, stream, 2 * i + 1);
        expected = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
      } else {
        const float bound = 1.0f / std::sqrt(static_cast<float>(entry.layer == "linear100" ? width : hidden));
        expected = (2.0f * random_uniform(seed, RngPurpose::init, stream, i) - 1.0f) * bound;
      }
      ASSERT_EQ(values[i], expected) << "element " << i;
    }
  }
}

TEST(Initialization, Gpt2DrawsNormalWeightsAndZeroBiases) {
  const Initialized test(InitScheme::gpt2, 4, 0);
  const auto& entries = test.model.parameter_entries();
  for (std::size_t index = 0; index < entries.size(); ++index) {
    const ParameterEntry& entry = entries[index];
    SCOPED_TRACE(entry.layer + "/" + entry.name);
    const std::vector<float> values = test.tensor(index);
    if (entry.name == "bias" || entry.layer_type == "layernorm") {
      const float expected = entry.layer_type == "layernorm" && entry.name == "weight" ? 1.0f : 0.0f;
      for (float value : values) ASSERT_EQ(value, expected);
      continue;
    }
    // weight, table and position table: normal(0, 0.02); n >= 2048 values, so the sample mean is within 4.5
    // standard errors (0.02 / sqrt(n)) and the sample std within 5% of 0.02
    const auto n = static_cast<double>(values.size());
    EXPECT_LT(std::abs(mean_of(values)), 4.5 * 0.02 / std::sqrt(n));
    EXPECT_NEAR(std_of(values), 0.02, 0.05 * 0.02);
    EXPECT_GT(*std::max_element(values.begin(), values.end()), 2.5 * 0.02);  // a normal's tail, not a uniform's
  }
}

// A layer the model marks as a residual branch's output projection draws from normal(0, projection_std).
TEST(Initialization, Gpt2ScalesResidualOutputProjections) {
  LayerSpec spec = layer(LayerType::linear, hidden);
  const auto projection =
      make_layer(spec, SampleShape{sequence, width}, "test.toml:1:1", SpatialLayout::channels_first, true);
  std::vector<float> plain(static_cast<std::size_t>(hidden * width + hidden)), scaled(plain.size());
  const Initialization init{InitScheme::gpt2, 0.02, 0.02 / std::sqrt(24.0)};
  projection->initialize(plain.data(), seed, 3, init);
  projection->set_residual_output(true);
  projection->initialize(scaled.data(), seed, 3, init);
  const std::vector<float> weight(scaled.begin(), scaled.begin() + hidden * width);
  EXPECT_NEAR(std_of(weight), init.projection_std, 0.05 * init.projection_std);
  for (std::size_t i = 0; i < weight.size(); ++i)  // the same draws, scaled
    ASSERT_NEAR(weight[i], plain[i] / std::sqrt(24.0), 1e-6 * std::abs(plain[i])) << i;
  for (std::size_t i = weight.size(); i < scaled.size(); ++i) ASSERT_EQ(scaled[i], 0.0f);
}

// What a rank count changes in the model's buffers (rows per rank; CUDA's 256-byte tensor alignment) changes no value.
// In a model, the Model marks what ends each residual branch: two transformer_blocks are 4 branches, so the attention's
// c_proj and the MLP's c_proj draw at 0.02 / sqrt(4), everything else at 0.02.
TEST(Initialization, Gpt2MarksTheProjectionsThatEndResidualBranches) {
  ModelSection section;
  section.layers.push_back(layer(LayerType::embedding, width));
  for (const char* name : {"h0", "h1"}) {
    LayerSpec block = layer(LayerType::transformer_block);
    block.name = name;
    block.heads = 4;
    section.layers.push_back(block);
  }
  section.layers.push_back(layer(LayerType::layernorm));
  section.layers.push_back(layer(LayerType::linear, vocabulary));
  section.init = InitScheme::gpt2;
  const auto backend = make_cpu_backend();
  Model model(section, SampleShape{sequence}, *backend, {DType::f32, DType::f32, 2, true, 0}, "test.toml");
  model.initialize(seed);
  int projections = 0, others = 0;
  for (const ParameterEntry& entry : model.parameter_entries()) {
    if (entry.shape.size() != 2 || entry.layer.rfind("embedding", 0) == 0) continue;
    SCOPED_TRACE(entry.layer + "/" + entry.name);
    const float* master = static_cast<const float*>(model.master()) + entry.offset;
    const double measured = std_of({master, master + entry.count});
    const bool projection = entry.name == "c_proj.weight" || entry.layer.ends_with(".c_proj");
    EXPECT_NEAR(measured, projection ? 0.01 : 0.02, projection ? 0.001 : 0.002);
    ++(projection ? projections : others);
  }
  EXPECT_EQ(projections, 4);  // two attentions' c_proj, two MLPs' c_proj
  EXPECT_EQ(others, 5);       // two c_attn, two c_fc, the head
}

TEST(Initialization, IndependentOfRowsAndAlignment) {
  for (const InitScheme scheme : {InitScheme::pytorch, InitScheme::gpt2}) {
    SCOPED_TRACE(word_of(scheme));
    const Initialized one(scheme, 8, 0), other(scheme, 3, 256);
    ASSERT_NE(one.model.parameter_count(), other.model.parameter_count());  // the padded layout differs
    for (std::size_t index = 0; index < one.model.parameter_entries().size(); ++index)
      EXPECT_EQ(one.tensor(index), other.tensor(index)) << one.model.parameter_entries()[index].name;
  }
}

}  // namespace
}  // namespace hpctrain
