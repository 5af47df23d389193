// optimizer.no_decay: weight decay reaches weights only; biases and normalisation parameters keep their values when
// the only force is decay (zero gradients), and an empty no_decay list decays everything.
#include "hpctrain/optim/optimizer.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "hpctrain/config/run_config.hpp"
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

// One AdamW step with zero gradients: the update is decay alone, p -= lr * wd * p.
std::vector<float> step_with_zero_gradients(const std::vector<std::string>& no_decay, Model& model, Backend& backend) {
  OptimizerSection section;
  section.type = OptimizerKind::adamw;
  section.weight_decay = 0.5;
  section.no_decay = no_decay;
  Optimizer optimizer(section, model, backend);
  backend.zero(model.gradients(), static_cast<std::size_t>(model.parameter_count()) * sizeof(float));
  StepScalars scalars;
  scalars.learning_rate = 0.1f;
  optimizer.gradient_statistics(&scalars);
  optimizer.step(&scalars);
  const auto* parameters = static_cast<const float*>(model.master());
  return {parameters, parameters + model.parameter_count()};
}

TEST(OptimizerNoDecay, DecaysWeightsOnlyByDefault) {
  auto backend = make_cpu_backend();
  ModelSection spec;
  spec.layers = {layer("linear", 4), layer("layernorm"), layer("linear", 3)};
  for (const bool decay_everything : {false, true}) {
    Model model(spec, 5, *backend, {DType::f32, DType::f32, 2}, "test.toml");
    model.initialize(1);
    const auto* start = static_cast<const float*>(model.master());
    const std::vector<float> before(start, start + model.parameter_count());
    const auto after = step_with_zero_gradients(
        decay_everything ? std::vector<std::string>{} : std::vector<std::string>{"bias", "norm"}, model, *backend);
    for (const ParameterEntry& entry : model.parameter_entries()) {
      const bool decays = decay_everything || (entry.name == "weight" && entry.layer_type == "linear");
      for (std::int64_t i = entry.offset; i < entry.offset + entry.count; ++i) {
        const float expected = decays ? before[i] * (1.0f - 0.1f * 0.5f) : before[i];
        ASSERT_FLOAT_EQ(after[i], expected) << entry.layer << "/" << entry.name << " element " << i - entry.offset;
      }
    }
  }
}

}  // namespace
}  // namespace hpctrain
