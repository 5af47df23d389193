// The layers of a sequential model: linear, element-wise activations, layernorm, dropout (conv_layers.cpp has the
// convolutional ones), and make_layer, which builds any of them from its deck entry.
#include <cmath>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/nn/layer.hpp"
#include "layer_internal.hpp"

namespace hpctrain {

namespace {

TensorView matrix(void* data, DType dtype, std::int64_t rows, std::int64_t cols) { return {data, dtype, rows, cols}; }

// y = x W^T + b, W: (out, in) as in PyTorch. Matrix products read the working copy of W (16-bit in bf16/fp16 runs);
// gradients are written in the master dtype (fp32).
class Linear final : public Layer {
 public:
  // A sample of any shape is read flattened: (C, H, W) images arrive as C*H*W features.
  Linear(std::string name, const SampleShape& in, std::int64_t out, bool bias)
      : Layer(std::move(name), in, SampleShape{out}), bias_(bias) {}
  [[nodiscard]] std::string type() const override { return "linear"; }

  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    std::vector<ParameterSpec> specs{{"weight", {output_width(), input_width()}}};
    if (bias_) specs.push_back({"bias", {output_width()}});
    return specs;
  }

  void initialize(float* host_master, std::uint64_t seed, std::uint32_t layer_index) const override {
    nn_detail::fill_uniform(host_master, parameters(), seed, layer_index, input_width());
  }
  [[nodiscard]] bool skips_input_gradient() const override { return true; }
  [[nodiscard]] bool takes_activation() const override { return true; }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    // (rows, out) = (rows, in) x (out, in)^T + bias
    const TensorView weight = matrix(working(0), working_dtype(), output_width(), input_width());
    context.backend->gemm(x, false, weight, true, y, bias_ ? master(1) : nullptr, false);
  }
  bool forward_activated(const StepContext& context, const TensorView& x, const TensorView& pre, const TensorView& y,
                         Activation kind, float alpha) override {
    const TensorView weight = matrix(working(0), working_dtype(), output_width(), input_width());
    context.backend->linear_activation_forward(x, weight, bias_ ? master(1) : nullptr, kind, alpha, pre, y);
    return true;
  }

  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool accumulate) override {
    Backend& backend = *context.backend;
    // dW (out, in) (+)= dy^T (out, rows) x (rows, in), db (+)= column sums of dy (one product on CUDA)
    const TensorView weight_gradient = matrix(gradient(0), master_dtype(), output_width(), input_width());
    backend.linear_weight_gradient(dy, x, weight_gradient, bias_ ? gradient(1) : nullptr, accumulate);
    // dx (rows, in) = dy (rows, out) x W (out, in); the first layer's input needs no gradient
    if (dx.data != nullptr) {
      const TensorView weight = matrix(working(0), working_dtype(), output_width(), input_width());
      backend.gemm(dy, false, weight, false, dx, nullptr, false);
    }
  }

 private:
  bool bias_;
};

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(std::string name, const SampleShape& shape, Activation kind, float alpha, std::string type)
      : Layer(std::move(name), shape, shape), kind_(kind), alpha_(alpha), type_(std::move(type)) {}
  [[nodiscard]] std::string type() const override { return type_; }
  [[nodiscard]] bool in_place_backward() const override { return true; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }
  bool activation(Activation* kind, float* alpha) const override {
    *kind = kind_;
    *alpha = alpha_;
    return true;
  }
  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    context.backend->activation_forward(kind_, alpha_, x, y);
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool) override {
    if (dx.data != nullptr) context.backend->activation_backward(kind_, alpha_, x, dy, dx);
  }

 private:
  Activation kind_;
  float alpha_;
  std::string type_;
};

// Not layout-agnostic on purpose: its mask is keyed by the channels-first position, so the same deck drops the same
// elements on every backend (a model with dropout inside its conv stack stays channels-first).
class Dropout final : public Layer {
 public:
  Dropout(std::string name, const SampleShape& shape, float p) : Layer(std::move(name), shape, shape), p_(p) {}
  [[nodiscard]] std::string type() const override { return "dropout"; }
  [[nodiscard]] bool in_place_backward() const override { return true; }
  void forward(const StepContext& context, std::uint32_t layer_index, const TensorView& x,
               const TensorView& y) override {
    if (context.training && p_ > 0.0f)
      context.backend->dropout_forward(p_, context.seed, context.step, layer_index, context.sample_ids, x, y);
    else
      context.backend->copy(y.data, x.data, x.bytes());
  }
  void backward(const StepContext& context, std::uint32_t layer_index, const TensorView&, const TensorView&,
                const TensorView& dy, const TensorView& dx, bool) override {
    if (dx.data == nullptr) return;
    if (p_ > 0.0f)
      context.backend->dropout_backward(p_, context.seed, context.step, layer_index, context.sample_ids, dy, dx);
    else if (dx.data != dy.data)
      context.backend->copy(dx.data, dy.data, dy.bytes());
  }

 private:
  float p_;
};

// Normalises each row (the whole sample, whatever its shape) in fp32; gamma and beta are read from the fp32 master
// parameters (no 16-bit copy).
class LayerNorm final : public Layer {
 public:
  LayerNorm(std::string name, const SampleShape& shape, float eps) : Layer(std::move(name), shape, shape), eps_(eps) {}
  [[nodiscard]] std::string type() const override { return "layernorm"; }
  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    return {{"weight", {input_width()}}, {"bias", {input_width()}}};
  }
  void initialize(float* host_master, std::uint64_t, std::uint32_t) const override {
    for (std::int64_t i = 0; i < input_width(); ++i) {
      host_master[i] = 1.0f;                  // gamma
      host_master[input_width() + i] = 0.0f;  // beta
    }
  }
  [[nodiscard]] std::int64_t saved_per_row() const override { return 2; }  // mean, rstd

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    context.backend->layernorm_forward(x, master(0), master(1), eps_, y, saved(0), saved(1));
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool accumulate) override {
    context.backend->layernorm_backward(x, dy, master(0), saved(0), saved(1), dx, gradient(0), gradient(1), accumulate);
  }

 private:
  float eps_;  // saved(0): row means, saved(1): reciprocal standard deviations
};

}  // namespace

std::int64_t shape_size(const SampleShape& shape) {
  std::int64_t size = 1;
  for (auto extent : shape) size *= extent;
  return size;
}

std::string batch_shape_text(const SampleShape& shape) {
  std::string text = "(N";
  for (auto extent : shape) text += ", " + std::to_string(extent);
  return text + ")";
}

namespace nn_detail {
void fill_uniform(float* host_master, const std::vector<ParameterSpec>& parameters, std::uint64_t seed,
                  std::uint32_t layer_index, std::int64_t fan_in) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  std::int64_t position = 0;
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    std::int64_t count = 1;
    for (auto extent : parameters[p].shape) count *= extent;
    const std::uint32_t stream = layer_index * 8 + static_cast<std::uint32_t>(p);
    for (std::int64_t i = 0; i < count; ++i)
      host_master[position + i] =
          (2.0f * random_uniform(seed, RngPurpose::init, stream, static_cast<std::uint64_t>(i)) - 1.0f) * bound;
    position += count;
  }
}
}  // namespace nn_detail

std::unique_ptr<Layer> make_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                  const std::string& deck_location, SpatialLayout layout) {
  const std::int64_t input_width = shape_size(input_shape);
  switch (spec.type) {
    case LayerType::linear:
      HPCTRAIN_VERIFY(spec.in == 0 || spec.in == input_width, InputError,
                      deck_location << ": layer '" << spec.name << "' expects " << spec.in << " input features, but "
                                    << input_width << " arrive"
                                    << (spec.in != 0 ? " (from the data or the previous layer)" : ""),
                      "set 'in' to " + std::to_string(input_width) + " or remove it (it is inferred)");
      return std::make_unique<Linear>(spec.name, input_shape, spec.out, spec.bias);
    case LayerType::relu:
      return std::make_unique<ActivationLayer>(spec.name, input_shape, Activation::relu, 0.0f, "relu");
    case LayerType::gelu:
      return std::make_unique<ActivationLayer>(
          spec.name, input_shape,
          spec.approximate == GeluApproximation::tanh ? Activation::gelu_tanh : Activation::gelu, 0.0f, "gelu");
    case LayerType::tanh:
      return std::make_unique<ActivationLayer>(spec.name, input_shape, Activation::tanh, 0.0f, "tanh");
    case LayerType::leaky_relu:
      return std::make_unique<ActivationLayer>(spec.name, input_shape, Activation::leaky_relu,
                                               static_cast<float>(spec.negative_slope), "leaky_relu");
    case LayerType::dropout:
      return std::make_unique<Dropout>(spec.name, input_shape, static_cast<float>(spec.p));
    case LayerType::layernorm:
      return std::make_unique<LayerNorm>(spec.name, input_shape, static_cast<float>(spec.eps));
    default:  // the spatial layers
      return nn_detail::make_spatial_layer(spec, input_shape, deck_location, layout);
  }
}

}  // namespace hpctrain
