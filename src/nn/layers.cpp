// The layers of a sequential model: linear, element-wise activations, layernorm, dropout, embedding (conv_layers.cpp
// has the convolutional ones, attention_layer.cpp attention), and make_layer, which builds any of them from its deck
// entry.
#include <cmath>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/nn/layer.hpp"
#include "layer_internal.hpp"

namespace hpctrain {

namespace {

using nn_detail::last_axis;
using nn_detail::matrix;

// The output shape of a layer that maps the last axis to `out` features: (T, out) on a sequence, (out) otherwise.
SampleShape last_axis_output(const SampleShape& in, std::int64_t out, bool sequence) {
  return sequence ? SampleShape{in.front(), out} : SampleShape{out};
}

// y = x W^T + b, W: (out, in) as in PyTorch. Matrix products read the working copy of W (16-bit in bf16/fp16 runs);
// gradients are written in the master dtype (fp32).
class Linear final : public Layer {
 public:
  // A sample of any shape is read flattened: (C, H, W) images arrive as C*H*W features. A sequence (T, C) is read
  // per position: (rows * T, C) x W^T.
  // tie: an embedding whose table is the weight (the model binds it; see tied_layer).
  Linear(std::string name, const SampleShape& in, std::int64_t out, bool bias, bool sequence, std::string tie)
      : Layer(std::move(name), in, last_axis_output(in, out, sequence)),
        bias_(bias),
        sequence_(sequence),
        in_(sequence ? in.back() : shape_size(in)),
        out_(out),
        tie_(std::move(tie)) {}
  [[nodiscard]] std::string type() const override { return "linear"; }
  [[nodiscard]] const std::string& tied_layer() const override { return tie_; }
  [[nodiscard]] IncrementalDecoding incremental_decoding(const Backend&) const override {
    return sequence_ ? IncrementalDecoding::position_wise : IncrementalDecoding::unsupported;
  }

  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    std::vector<ParameterSpec> specs{{"weight", {out_, in_}}};
    if (bias_) specs.push_back({"bias", {out_}});
    return specs;
  }

  void initialize(float* host_master, std::uint64_t seed, std::uint32_t layer_index,
                  const Initialization& init) const override {
    if (init.scheme == InitScheme::pytorch)
      return nn_detail::fill_uniform(host_master, parameters(), seed, layer_index, in_);
    nn_detail::fill_normal(host_master, out_ * in_, seed, nn_detail::init_stream(layer_index, 0),
                           residual_output() ? init.projection_std : init.std);
    if (bias_) std::fill_n(host_master + out_ * in_, out_, 0.0f);
  }
  [[nodiscard]] bool skips_input_gradient() const override { return true; }
  [[nodiscard]] bool takes_activation() const override { return true; }
  [[nodiscard]] bool ends_with_projection() const override { return true; }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    // (rows, out) = (rows, in) x (out, in)^T + bias
    context.backend->gemm(last_axis(x, in_), false, weight(), true, last_axis(y, out_), bias_ ? master(1) : nullptr,
                          false);
  }
  bool forward_residual(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& skip,
                        const TensorView& y) override {
    context.backend->linear_residual_forward(last_axis(x, in_), weight(), bias_ ? master(1) : nullptr,
                                             last_axis(skip, out_), last_axis(y, out_));
    return true;
  }
  bool forward_activated(const StepContext& context, const TensorView& x, const TensorView& pre, const TensorView& y,
                         Activation kind, float alpha) override {
    context.backend->linear_activation_forward(last_axis(x, in_), weight(), bias_ ? master(1) : nullptr, kind, alpha,
                                               last_axis(pre, out_), last_axis(y, out_));
    return true;
  }

  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool accumulate) override {
    parameter_gradients(context, x, dy, accumulate);
    // dx (rows, in) = dy (rows, out) x W (out, in); the first layer's input needs no gradient
    if (dx.data != nullptr)
      context.backend->gemm(last_axis(dy, out_), false, weight(), false, last_axis(dx, in_), nullptr, false);
  }
  bool backward_activated(const StepContext& context, const TensorView& x, const TensorView& dy, const TensorView& dx,
                          bool accumulate, Activation kind, float alpha, const TensorView& pre,
                          const TensorView& activated) override {
    if (dx.data == nullptr) return false;
    parameter_gradients(context, x, dy, accumulate);
    context.backend->linear_activation_backward(last_axis(dy, out_), weight(), kind, alpha, last_axis(pre, in_),
                                                last_axis(activated, in_), last_axis(dx, in_));
    return true;
  }

 private:
  [[nodiscard]] TensorView weight() const { return matrix(working(0), working_dtype(), out_, in_); }
  // dW (out, in) (+)= dy^T (out, rows) x (rows, in), db (+)= column sums of dy (one product on CUDA)
  void parameter_gradients(const StepContext& context, const TensorView& x, const TensorView& dy, bool accumulate) {
    const TensorView weight_gradient = matrix(gradient(0), master_dtype(), out_, in_);
    context.backend->linear_weight_gradient(last_axis(dy, out_), last_axis(x, in_), weight_gradient,
                                            bias_ ? gradient(1) : nullptr, accumulate);
  }
  bool bias_;
  bool sequence_;          // acting on the last axis of a sequence (T, in)
  std::int64_t in_, out_;  // features of a row (of a position, on a sequence)
  std::string tie_;
};

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(std::string name, const SampleShape& shape, Activation kind, float alpha, std::string type)
      : Layer(std::move(name), shape, shape), kind_(kind), alpha_(alpha), type_(std::move(type)) {}
  [[nodiscard]] std::string type() const override { return type_; }
  [[nodiscard]] bool in_place_backward() const override { return true; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }
  [[nodiscard]] IncrementalDecoding incremental_decoding(const Backend&) const override {
    return IncrementalDecoding::position_wise;
  }
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
  // Decoding runs at inference, where dropout is the identity.
  [[nodiscard]] IncrementalDecoding incremental_decoding(const Backend&) const override {
    return IncrementalDecoding::position_wise;
  }
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

// Normalises each row (the whole sample, whatever its shape; each position of a sequence) in fp32; gamma and beta
// are read from the fp32 master parameters (no 16-bit copy).
class LayerNorm final : public Layer {
 public:
  LayerNorm(std::string name, const SampleShape& shape, float eps, bool sequence)
      : Layer(std::move(name), shape, shape), eps_(eps), width_(sequence ? shape.back() : shape_size(shape)) {}
  [[nodiscard]] std::string type() const override { return "layernorm"; }
  // On a sequence each position is normalised alone (its statistics land in the first rows of the saved blocks).
  [[nodiscard]] IncrementalDecoding incremental_decoding(const Backend&) const override {
    return positions() > 1 ? IncrementalDecoding::position_wise : IncrementalDecoding::unsupported;
  }
  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    return {{"weight", {width_}}, {"bias", {width_}}};
  }
  void initialize(float* host_master, std::uint64_t, std::uint32_t, const Initialization&) const override {
    for (std::int64_t i = 0; i < width_; ++i) {  // both schemes
      host_master[i] = 1.0f;                     // gamma
      host_master[width_ + i] = 0.0f;            // beta
    }
  }
  // mean and rstd of each normalised row: positions() blocks of each
  [[nodiscard]] std::int64_t saved_per_row() const override { return 2 * positions(); }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    context.backend->layernorm_forward(last_axis(x, width_), master(0), master(1), eps_, last_axis(y, width_), saved(0),
                                       saved(positions()));
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool accumulate) override {
    context.backend->layernorm_backward(last_axis(x, width_), last_axis(dy, width_), master(0), saved(0),
                                        saved(positions()), last_axis(dx, width_), gradient(0), gradient(1),
                                        accumulate);
  }

 private:
  [[nodiscard]] std::int64_t positions() const { return input_width() / width_; }
  float eps_;           // saved(0): row means, saved(positions()): reciprocal standard deviations
  std::int64_t width_;  // values normalised together
};

// y[r, t] = weight[ids[r, t]] (+ position[t]): the batch's token ids (rows, T) -> (rows, T, C). The first layer of a
// language model; PyTorch's nn.Embedding initialisation, normal(0, 1), for both tables.
class Embedding final : public Layer {
 public:
  Embedding(std::string name, std::int64_t sequence, std::int64_t vocabulary, std::int64_t width, bool positions)
      : Layer(std::move(name), SampleShape{sequence}, SampleShape{sequence, width}),
        vocabulary_(vocabulary),
        width_(width),
        positions_(positions) {}
  [[nodiscard]] std::string type() const override { return "embedding"; }
  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    std::vector<ParameterSpec> specs{{"weight", {vocabulary_, width_}}};
    if (positions_) specs.push_back({"position", {sequence(), width_}});
    return specs;
  }
  void initialize(float* host_master, std::uint64_t seed, std::uint32_t layer_index,
                  const Initialization& init) const override {
    std::int64_t position = 0;
    const auto specs = parameters();
    for (std::size_t p = 0; p < specs.size(); ++p) {  // normal(0, 1) (PyTorch) or normal(0, 0.02) (GPT-2)
      const std::int64_t count = shape_size(specs[p].shape);
      nn_detail::fill_normal(host_master + position, count, seed, nn_detail::init_stream(layer_index, p),
                             init.scheme == InitScheme::pytorch ? 1.0 : init.std);
      position += count;
    }
  }
  [[nodiscard]] bool skips_input_gradient() const override { return true; }
  [[nodiscard]] bool reads_token_ids() const override { return true; }
  [[nodiscard]] bool starts_sequence() const override { return true; }
  void bind_token_ids(const std::int32_t* ids) override { ids_ = ids; }
  [[nodiscard]] IncrementalDecoding incremental_decoding(const Backend&) const override {
    return IncrementalDecoding::own;
  }
  // Positions [first, first + count) of sample 0: their ids, and the position table's rows from `first` on.
  void forward_positions(const StepContext& context, std::uint32_t, std::int64_t first, const TensorView&,
                         const TensorView& y, void*) override {
    const void* position_rows = positions_ ? static_cast<const char*>(master(1)) +
                                                 first * width_ * static_cast<std::int64_t>(dtype_size(master_dtype()))
                                           : nullptr;
    context.backend->embedding_forward(ids_ + first, master(0), vocabulary_, y, position_rows, y.rows);
  }

  void forward(const StepContext& context, std::uint32_t, const TensorView&, const TensorView& y) override {
    context.backend->embedding_forward(ids_, master(0), vocabulary_, last_axis(y, width_),
                                       positions_ ? master(1) : nullptr, sequence());
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView&, const TensorView&, const TensorView& dy,
                const TensorView&, bool accumulate) override {
    context.backend->embedding_backward(ids_, last_axis(dy, width_), vocabulary_, gradient(0),
                                        accumulates(0, accumulate));
    // d position (T * C) = the column sums of dy seen as (rows, T * C)
    if (positions_) context.backend->bias_gradient(dy, gradient(1), master_dtype(), accumulate);
  }

 private:
  [[nodiscard]] std::int64_t sequence() const { return input_width(); }
  std::int64_t vocabulary_, width_;
  bool positions_;                     // a learned position embedding, (T, C)
  const std::int32_t* ids_ = nullptr;  // (rows, T) backend memory, the model's token input
};

// (T, C) -> (C): the mean over the positions, or the first position (a class token), for an encoder's classifier.
class SequencePool final : public Layer {
 public:
  SequencePool(std::string name, const SampleShape& in, SequencePooling mode)
      : Layer(std::move(name), in, SampleShape{in.back()}), mode_(mode) {}
  [[nodiscard]] std::string type() const override { return "sequence_pool"; }
  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    context.backend->sequence_pool_forward(mode_, sequence(), x, y);
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView&, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool) override {
    if (dx.data != nullptr) context.backend->sequence_pool_backward(mode_, sequence(), dy, dx);
  }

 private:
  [[nodiscard]] std::int64_t sequence() const { return input_shape().front(); }
  SequencePooling mode_;
};

}  // namespace

void Layer::forward_positions(const StepContext&, std::uint32_t, std::int64_t, const TensorView&, const TensorView&,
                              void*) {
  throw NotSupported("layer '" + name_ + "' (" + type() + ") has no incremental decoding");
}

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
    const std::uint32_t stream = init_stream(layer_index, p);
    for (std::int64_t i = 0; i < count; ++i)
      host_master[position + i] =
          (2.0f * random_uniform(seed, RngPurpose::init, stream, static_cast<std::uint64_t>(i)) - 1.0f) * bound;
    position += count;
  }
}

void fill_normal(float* values, std::int64_t count, std::uint64_t seed, std::uint32_t stream, double std) {
  // Each value is a function of its index alone (counter-based), so the threads change nothing but the time: GPT-2's
  // 124M values take seconds on one core (a log and a cos each).
#pragma omp parallel for schedule(static) if (count > 65536)
  for (std::int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<std::uint64_t>(i);
    const double u1 = 1.0 - random_uniform(seed, RngPurpose::init, stream, 2 * index);  // (0, 1]
    const double u2 = random_uniform(seed, RngPurpose::init, stream, 2 * index + 1);
    values[i] = static_cast<float>(std * (std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2)));
  }
}
}  // namespace nn_detail

std::unique_ptr<Layer> make_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                  const std::string& deck_location, SpatialLayout layout, bool sequence) {
  const std::int64_t input_width = sequence ? input_shape.back() : shape_size(input_shape);
  switch (spec.type) {
    case LayerType::linear:
      HPCTRAIN_VERIFY(spec.in == 0 || spec.in == input_width, InputError,
                      deck_location << ": layer '" << spec.name << "' expects " << spec.in << " input features, but "
                                    << input_width << " arrive"
                                    << (spec.in != 0 ? " (from the data or the previous layer)" : ""),
                      "set 'in' to " + std::to_string(input_width) + " or remove it (it is inferred)");
      return std::make_unique<Linear>(spec.name, input_shape, spec.out, spec.bias, sequence, spec.tie);
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
      return std::make_unique<LayerNorm>(spec.name, input_shape, static_cast<float>(spec.eps), sequence);
    case LayerType::embedding:
      HPCTRAIN_VERIFY(!sequence && input_shape.size() == 1, InputError,
                      deck_location << ": layer '" << spec.name << "' (embedding) receives samples of shape "
                                    << batch_shape_text(input_shape) << ", not token ids",
                      "an embedding must be the first layer of a model trained on token data");
      return std::make_unique<Embedding>(spec.name, input_shape.front(), spec.vocabulary, spec.out, spec.positions);
    case LayerType::attention:
      return nn_detail::make_attention_layer(spec, input_shape, deck_location, sequence);
    case LayerType::sequence_pool:
      HPCTRAIN_VERIFY(
          sequence && input_shape.size() == 2, InputError,
          deck_location << ": layer '" << spec.name << "' (sequence_pool) receives samples of shape "
                        << batch_shape_text(input_shape) << ", not a sequence (T, C)",
          "put sequence_pool after the layers that act on a sequence (after an embedding or a to_sequence)");
      return std::make_unique<SequencePool>(
          spec.name, input_shape, spec.mode == SequencePoolMode::mean ? SequencePooling::mean : SequencePooling::first);
    case LayerType::to_sequence:
      return nn_detail::make_to_sequence_layer(spec, input_shape, deck_location, layout, sequence);
    default:  // the spatial layers
      return nn_detail::make_spatial_layer(spec, input_shape, deck_location, layout);
  }
}

}  // namespace hpctrain
