// to_sequence: a conv feature map (C, H, W) or (C, D, H, W) as a sequence of positions (H*W or D*H*W, C), each
// spatial element one position (h * W + w: PyTorch's x.flatten(2).transpose(1, 2)), as a vision transformer turns
// the output of its patch-embedding convolution into tokens; optionally a learned class token prepended (ViT's [CLS],
// sequence T + 1) and a learned position table added. The layers after it act on the sequence (see Model).
#include <string>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/nn/layer.hpp"
#include "layer_internal.hpp"

namespace hpctrain::nn_detail {
namespace {

// Built for the layout the conv stack runs in: a channels-last map already is (S, C) position-major, a channels-first
// one is transposed; either way the sequence it gives is the same.
class ToSequence final : public Layer {
 public:
  ToSequence(std::string name, const SampleShape& input, SpatialLayout layout, bool class_token, bool positions)
      : Layer(std::move(name), input, SampleShape{shape_size(input) / input[0] + (class_token ? 1 : 0), input[0]}),
        layout_(layout),
        class_token_(class_token),
        positions_(positions) {}
  [[nodiscard]] std::string type() const override { return "to_sequence"; }
  [[nodiscard]] bool starts_sequence() const override { return true; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }
  [[nodiscard]] bool skips_input_gradient() const override { return true; }

  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    std::vector<ParameterSpec> specs;
    if (class_token_) specs.push_back({"class_token", {channels()}});
    if (positions_) specs.push_back({"position", {sequence(), channels()}});
    return specs;
  }
  // pytorch (the default): timm's VisionTransformer, the position table normal(0, 0.02) (timm's trunc_normal_ cuts
  // at +-2, 100 standard deviations away: never reached) and the class token normal(0, 1e-6). gpt2: both normal(0,
  // init.std), the rule of the embedding's tables.
  void initialize(float* host_master, std::uint64_t seed, std::uint32_t layer_index,
                  const Initialization& init) const override {
    const bool pytorch = init.scheme == InitScheme::pytorch;
    const auto specs = parameters();
    std::int64_t offset = 0;
    for (std::size_t p = 0; p < specs.size(); ++p) {
      const std::int64_t count = shape_size(specs[p].shape);
      const bool token = specs[p].name == "class_token";
      fill_normal(host_master + offset, count, seed, init_stream(layer_index, p),
                  pytorch ? (token ? 1e-6 : 0.02) : init.std);
      offset += count;
    }
  }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    context.backend->to_sequence_forward(channels(), layout_, x, class_token_ ? master(0) : nullptr,
                                         positions_ ? master(position_index()) : nullptr, y);
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView&, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool accumulate) override {
    context.backend->to_sequence_backward(channels(), layout_, dy, dx, class_token_ ? gradient(0) : nullptr,
                                          positions_ ? gradient(position_index()) : nullptr, accumulate);
  }

 private:
  [[nodiscard]] std::int64_t channels() const { return output_shape()[1]; }
  [[nodiscard]] std::int64_t sequence() const { return output_shape()[0]; }
  [[nodiscard]] std::size_t position_index() const { return class_token_ ? 1 : 0; }
  SpatialLayout layout_;
  bool class_token_, positions_;
};

}  // namespace

std::unique_ptr<Layer> make_to_sequence_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                              const std::string& deck_location, SpatialLayout layout, bool sequence) {
  HPCTRAIN_VERIFY(
      !sequence && (input_shape.size() == 3 || input_shape.size() == 4), InputError,
      deck_location << ": layer '" << spec.name << "' (to_sequence) receives samples of shape "
                    << batch_shape_text(input_shape)
                    << (sequence ? ", already a sequence (T, C)" : ", not a feature map (C, H, W) or (C, D, H, W)"),
      "put to_sequence right after the conv layers that make the patches (a vision transformer's "
      "patch embedding: conv2d with stride = kernel), on image or volume data, before any flatten");
  return std::make_unique<ToSequence>(spec.name, input_shape, layout, spec.class_token, spec.positions);
}

}  // namespace hpctrain::nn_detail
