// Parameter tensors padded to 256-byte offsets in the flat buffers (the CUDA backend's layout, issue 15 item 12),
// checked on the CPU backend: every tensor (and the 16-bit working copy's) starts aligned, and the padded model
// trains exactly as the unpadded one, tensor by tensor, with the gaps staying zero in every buffer. The checkpoint
// side (identical datasets, resume across layouts) is tests/cli/parameter_padding.sh.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/optim/optimizer.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

LayerSpec layer(LayerType type, const std::string& name, std::int64_t out = 0) {
  LayerSpec spec;
  spec.type = type;
  spec.name = name + std::to_string(out);
  spec.out = out;
  return spec;
}

// Odd widths, so that unpadded tensors start at odd offsets.
ModelSection mlp() {
  ModelSection spec;
  spec.layers = {layer(LayerType::linear, "linear", 7), layer(LayerType::layernorm, "layernorm"),
                 layer(LayerType::gelu, "gelu"),        layer(LayerType::linear, "linear", 13),
                 layer(LayerType::relu, "relu"),        layer(LayerType::linear, "linear", 3)};
  return spec;
}

ModelBuffers buffers(DType activations, std::size_t alignment) {
  ModelBuffers result{activations, DType::f32, 8};
  result.parameter_alignment = alignment;
  return result;
}

TEST(ParameterLayout, TensorsStartAt256ByteOffsetsInEveryBuffer) {
  auto backend = make_cpu_backend();
  for (const DType activations : {DType::f32, DType::bf16}) {
    Model padded(mlp(), 5, *backend, buffers(activations, 256), "test.toml");
    Model plain(mlp(), 5, *backend, buffers(activations, 0), "test.toml");
    EXPECT_EQ(padded.trainable_parameters(), plain.parameter_count());
    EXPECT_EQ(plain.trainable_parameters(), plain.parameter_count());
    EXPECT_GT(padded.parameter_count(), plain.parameter_count());
    for (const ParameterEntry& entry : padded.parameter_entries()) {
      EXPECT_EQ(entry.offset * 4 % 256, 0) << entry.layer << "/" << entry.name << " in the f32 buffers";
      if (activations == DType::bf16)
        EXPECT_EQ(entry.offset * 2 % 256, 0) << entry.layer << "/" << entry.name << " in the 16-bit working copy";
    }
    for (std::size_t i = 0; i < padded.layer_count(); ++i)  // where the gradient buckets are cut
      if (!padded.layer(i).parameters().empty()) EXPECT_EQ(padded.parameter_begin(i) * 4 % 256, 0);
    // Unpadded, some tensor starts at an offset no product could read aligned.
    bool misaligned = false;
    for (const ParameterEntry& entry : plain.parameter_entries()) misaligned |= entry.offset * 4 % 16 != 0;
    EXPECT_TRUE(misaligned);
    EXPECT_NE(padded.summary().find("256-byte offsets"), std::string::npos) << padded.summary();
    EXPECT_EQ(plain.summary().find("offsets"), std::string::npos);
  }
}

// The tensors of a flat buffer, in entry order, and whether everything between them is zero.
std::vector<std::vector<float>> tensors(const Model& model, const float* flat, bool* gaps_zero) {
  std::vector<std::vector<float>> result;
  std::vector<bool> covered(static_cast<std::size_t>(model.parameter_count()), false);
  for (const ParameterEntry& entry : model.parameter_entries()) {
    result.emplace_back(flat + entry.offset, flat + entry.offset + entry.count);
    for (std::int64_t i = entry.offset; i < entry.offset + entry.count; ++i)
      covered[static_cast<std::size_t>(i)] = true;
  }
  *gaps_zero = true;
  for (std::size_t i = 0; i < covered.size(); ++i) *gaps_zero = *gaps_zero && (covered[i] || flat[i] == 0.0f);
  return result;
}

struct Trained {
  std::vector<std::vector<float>> parameters, gradients, first_moment, second_moment;
  std::vector<float> norms;
  bool gaps_zero = true;
};

// Steps of AdamW with clipping on random batches; everything the step touches, tensor by tensor.
Trained train(std::size_t alignment, DType activations) {
  auto backend = make_cpu_backend();
  Model model(mlp(), 5, *backend, buffers(activations, alignment), "test.toml");
  model.initialize(11);
  OptimizerSection section;
  section.type = OptimizerKind::adamw;
  section.lr = 0.01;
  section.weight_decay = 0.1;
  section.grad_clip = 0.5;
  section.no_decay = {"bias", "norm"};
  Optimizer optimizer(section, model, *backend);
  StepScalars scalars;
  scalars.learning_rate = 0.01f;
  Trained result;
  const std::vector<std::int64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
  for (std::uint32_t step = 0; step < 4; ++step) {
    const auto features = test_support::random_values(8 * 5, 100 + step, -2.0, 2.0);
    backend->cast({const_cast<double*>(features.data()), DType::f64, 8, 5}, model.input(8));
    std::vector<std::int32_t> labels(8);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>((i * 7 + step) % 3);
    const StepContext context{backend.get(), true, 3, step, ids.data(), 8};
    const TensorView output = model.forward(context);
    const float scale = 1.0f / 8;
    LossSums sums;
    backend->softmax_cross_entropy(output, labels.data(), &scale, output, &sums);
    model.backward(context, false, nullptr);
    optimizer.gradient_statistics(&scalars);
    optimizer.step(&scalars);
    scalars.applied_steps += 1;
    result.norms.push_back(scalars.grad_norm);
  }
  bool zero[4];
  result.parameters = tensors(model, static_cast<const float*>(model.master()), &zero[0]);
  result.gradients = tensors(model, static_cast<const float*>(model.gradients()), &zero[1]);
  result.first_moment = tensors(model, optimizer.state(0), &zero[2]);
  result.second_moment = tensors(model, optimizer.state(1), &zero[3]);
  result.gaps_zero = zero[0] && zero[1] && zero[2] && zero[3];
  return result;
}

TEST(ParameterLayout, PaddingChangesNoResultOnTheCpu) {
  for (const DType activations : {DType::f32, DType::bf16}) {
    const Trained plain = train(0, activations), padded = train(256, activations);
    EXPECT_TRUE(padded.gaps_zero) << "a gap between tensors is not zero in some buffer";
    EXPECT_EQ(padded.parameters, plain.parameters) << dtype_name(activations);
    EXPECT_EQ(padded.gradients, plain.gradients);
    EXPECT_EQ(padded.first_moment, plain.first_moment);
    EXPECT_EQ(padded.second_moment, plain.second_moment);
    EXPECT_EQ(padded.norms, plain.norms);  // the clip coefficient saw the same norm
    EXPECT_GT(plain.norms.front(), 0.0f);
  }
}

}  // namespace
}  // namespace hpctrain
