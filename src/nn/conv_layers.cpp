// The layers of convolutional networks: conv2d/conv3d, max/average pooling, global average pooling, flatten and group
// normalisation. Samples stay activation rows (one sample per row, in the layout the model chose: NCHW / NCDHW, or
// channels-last on a backend that prefers it), so these layers fit the flat buffers like any other; their shapes come
// from the sample shape that flows in (always given channels-first), checked here when the model is built. Flatten
// turns channels-last samples back into PyTorch's flattening order, so the layers after it never see the layout.
//
// Batch normalisation is left out on purpose: its statistics are per batch, so with the batch split over ranks they
// would need an all-reduce inside every forward pass to keep results independent of the rank count. Group
// normalisation has per-sample statistics and needs no communication.
#include <string>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/nn/layer.hpp"
#include "layer_internal.hpp"

namespace hpctrain::nn_detail {
namespace {

const char* const axis_names[2][3] = {{"H", "W", ""}, {"D", "H", "W"}};

std::int64_t at_axis(const std::vector<std::int64_t>& values, int axis) {
  return values.size() == 1 ? values[0] : values[static_cast<std::size_t>(axis)];
}

// The geometry of a conv or pooling layer on `input` = (C, H, W) or (C, D, H, W), with InputErrors that say which
// layer, what arrived and what to change.
SpatialGeometry spatial_geometry(const LayerSpec& spec, const SampleShape& input, int dimensions,
                                 std::int64_t out_channels, const std::string& where, SpatialLayout layout) {
  const std::string layer = where + ": layer '" + spec.name + "' (" + std::string(word_of(spec.type)) + ")";
  HPCTRAIN_VERIFY(input.size() == static_cast<std::size_t>(dimensions + 1), InputError,
                  layer << " needs samples of shape " << (dimensions == 2 ? "(C, H, W)" : "(C, D, H, W)") << ", but "
                        << batch_shape_text(input) << " arrives from the data or the previous layer",
                  input.size() == 1
                      ? "store the features as (N, C, " + std::string(dimensions == 2 ? "H, W" : "D, H, W") +
                            ") in the HDF5 file (hpctrain data generate images|volumes does); "
                            "conv and pooling layers cannot follow flatten, global_avgpool or linear"
                      : "use conv" + std::to_string(input.size() - 1) +
                            "d/pooling layers of the "
                            "data's dimensionality");
  SpatialGeometry g;
  g.layout = layout;
  g.dimensions = dimensions;
  g.in_channels = input[0];
  g.out_channels = out_channels == 0 ? input[0] : out_channels;
  const bool convolution = is_convolution(spec.type);
  g.groups = convolution ? spec.groups : 1;
  for (int axis = 0; axis < dimensions; ++axis) {
    const auto a = static_cast<std::size_t>(axis);
    g.input[a] = input[a + 1];
    g.kernel[a] = at_axis(spec.kernel, axis);
    // An empty stride (a LayerSpec not read from a deck) takes the deck's default: 1 for conv, the kernel for pooling.
    g.stride[a] = spec.stride.empty() ? (convolution ? 1 : g.kernel[a]) : at_axis(spec.stride, axis);
    g.padding[a] = at_axis(spec.padding, axis);
    g.dilation[a] = convolution ? at_axis(spec.dilation, axis) : 1;
    const std::int64_t span = g.dilation[a] * (g.kernel[a] - 1) + 1;
    const std::int64_t room = g.input[a] + 2 * g.padding[a] - span;
    HPCTRAIN_VERIFY(room >= 0, InputError,
                    layer << ": its input " << batch_shape_text(input) << " is too small on axis "
                          << axis_names[dimensions - 2][axis] << ": " << g.input[a] << " + 2 x padding " << g.padding[a]
                          << " < the kernel's span " << span << " (kernel " << g.kernel[a] << ", dilation "
                          << g.dilation[a] << "), so the output would be empty",
                    "use a smaller kernel, more padding, fewer pooling layers before it, or larger samples");
    g.output[a] = room / g.stride[a] + 1;
  }
  HPCTRAIN_VERIFY(g.in_channels % g.groups == 0 && g.out_channels % g.groups == 0, InputError,
                  layer << ": groups = " << g.groups << " must divide both the " << g.in_channels
                        << " input channels and the " << g.out_channels << " output channels",
                  "use a groups value that divides both (1 = an ordinary convolution)");
  return g;
}

SampleShape shape_after(const SpatialGeometry& g) {
  SampleShape shape{g.out_channels};
  for (int axis = 0; axis < g.dimensions; ++axis) shape.push_back(g.output[static_cast<std::size_t>(axis)]);
  return shape;
}

// y = conv(x, W) + b with W: (out, in/groups, k...) as in PyTorch. Reads the working copy of W (16-bit in bf16/fp16
// runs) and the fp32 bias; gradients are written in the master dtype.
class Convolution final : public Layer {
 public:
  Convolution(std::string name, std::string type, const SampleShape& input, const SpatialGeometry& geometry, bool bias)
      : Layer(std::move(name), input, shape_after(geometry)),
        type_(std::move(type)),
        geometry_(geometry),
        bias_(bias) {}
  [[nodiscard]] std::string type() const override { return type_; }
  [[nodiscard]] bool uses_spatial_operations() const override { return true; }
  [[nodiscard]] bool skips_input_gradient() const override { return true; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }

  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    std::vector<std::int64_t> weight{geometry_.out_channels, geometry_.in_channels / geometry_.groups};
    for (int axis = 0; axis < geometry_.dimensions; ++axis)
      weight.push_back(geometry_.kernel[static_cast<std::size_t>(axis)]);
    std::vector<ParameterSpec> specs{{"weight", weight}};
    if (bias_) specs.push_back({"bias", {geometry_.out_channels}});
    return specs;
  }
  // PyTorch's default under both schemes (GPT-2 has no convolutions).
  void initialize(float* host_master, std::uint64_t seed, std::uint32_t layer_index,
                  const Initialization&) const override {
    fill_uniform(host_master, parameters(), seed, layer_index, weight_cols());
  }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    context.backend->convolution_forward(geometry_, x, weight(), bias_ ? master(1) : nullptr, y);
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool accumulate) override {
    const TensorView weight_gradient{gradient(0), master_dtype(), geometry_.out_channels, weight_cols()};
    context.backend->convolution_backward_weights(geometry_, x, dy, weight_gradient, bias_ ? gradient(1) : nullptr,
                                                  accumulate);
    if (dx.data != nullptr) context.backend->convolution_backward_data(geometry_, dy, weight(), dx);
  }

 private:
  [[nodiscard]] std::int64_t weight_cols() const {  // in/groups * kernel elements: the fan-in of one output
    return geometry_.in_channels / geometry_.groups * geometry_.kernel_size();
  }
  [[nodiscard]] TensorView weight() const {
    return {working(0), working_dtype(), geometry_.out_channels, weight_cols()};
  }
  std::string type_;
  SpatialGeometry geometry_;
  bool bias_;
};

// Max or average pooling per channel; global average pooling is average pooling over the whole input, with a flat
// (N, C) output.
class Pooling final : public Layer {
 public:
  Pooling(std::string name, std::string type, PoolingKind kind, const SampleShape& input,
          const SpatialGeometry& geometry, SampleShape output)
      : Layer(std::move(name), input, std::move(output)), type_(std::move(type)), kind_(kind), geometry_(geometry) {}
  [[nodiscard]] std::string type() const override { return type_; }
  [[nodiscard]] bool uses_spatial_operations() const override { return true; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }
  // Max pooling keeps each output's first maximum (int32, in the saved rows) for its backward.
  [[nodiscard]] std::int64_t saved_per_row() const override { return kind_ == PoolingKind::max ? output_width() : 0; }
  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    if (kind_ == PoolingKind::max)
      context.backend->max_pooling_forward(geometry_, x, y, static_cast<std::int32_t*>(saved(0)));
    else
      context.backend->pooling_forward(kind_, geometry_, x, y);
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool) override {
    if (dx.data == nullptr) return;
    if (kind_ == PoolingKind::max)
      context.backend->max_pooling_backward(geometry_, x, dy, static_cast<const std::int32_t*>(saved(0)), dx);
    else
      context.backend->pooling_backward(kind_, geometry_, x, dy, dx);
  }

 private:
  std::string type_;
  PoolingKind kind_;
  SpatialGeometry geometry_;
};

// (C, H, W) -> (C*H*W) in PyTorch's order. A channels-first row already is the flattened sample, so only the shape
// changes (forward copies); a channels-last row is transposed back (and its gradient forward again).
class Flatten final : public Layer {
 public:
  Flatten(std::string name, const SampleShape& input, SpatialLayout layout)
      : Layer(std::move(name), input, SampleShape{shape_size(input)}),
        transpose_(layout == SpatialLayout::channels_last && input.size() > 1) {}
  [[nodiscard]] std::string type() const override { return "flatten"; }
  [[nodiscard]] bool in_place_backward() const override { return !transpose_; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }
  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    if (transpose_)
      context.backend->convert_spatial_layout(input_shape()[0], SpatialLayout::channels_last, x, y);
    else
      context.backend->copy(y.data, x.data, x.bytes());
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView&, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool) override {
    if (dx.data == nullptr || dx.data == dy.data) return;
    if (transpose_)
      context.backend->convert_spatial_layout(input_shape()[0], SpatialLayout::channels_first, dy, dx);
    else
      context.backend->copy(dx.data, dy.data, dy.bytes());
  }

 private:
  bool transpose_;
};

// Normalises each (sample, group of channels) block in fp32, then scales and shifts per channel (PyTorch GroupNorm).
// gamma and beta are read from the fp32 master parameters.
class GroupNorm final : public Layer {
 public:
  GroupNorm(std::string name, const SampleShape& input, std::int64_t groups, float eps, SpatialLayout layout)
      : Layer(std::move(name), input, input), groups_(groups), eps_(eps), layout_(layout) {}
  [[nodiscard]] std::string type() const override { return "groupnorm"; }
  [[nodiscard]] bool uses_spatial_operations() const override { return true; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }
  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    return {{"weight", {channels()}}, {"bias", {channels()}}};
  }
  void initialize(float* host_master, std::uint64_t, std::uint32_t, const Initialization&) const override {
    for (std::int64_t c = 0; c < channels(); ++c) {  // both schemes
      host_master[c] = 1.0f;                         // gamma
      host_master[channels() + c] = 0.0f;            // beta
    }
  }
  // saved(0): (rows, groups) means, saved(groups): (rows, groups) reciprocal standard deviations.
  [[nodiscard]] std::int64_t saved_per_row() const override { return 2 * groups_; }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    context.backend->groupnorm_forward(channels(), groups_, layout_, x, master(0), master(1), eps_, y, saved(0),
                                       saved(groups_));
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool accumulate) override {
    context.backend->groupnorm_backward(channels(), groups_, layout_, x, dy, master(0), saved(0), saved(groups_), dx,
                                        gradient(0), gradient(1), accumulate);
  }

 private:
  [[nodiscard]] std::int64_t channels() const { return input_shape()[0]; }
  std::int64_t groups_;
  float eps_;
  SpatialLayout layout_;
};

}  // namespace

std::unique_ptr<Layer> make_spatial_layer(const LayerSpec& spec, const SampleShape& input, const std::string& where,
                                          SpatialLayout layout) {
  const std::string type(word_of(spec.type));  // the layer's name for its type, in summaries
  const int dimensions = window_axes(spec.type);
  if (is_convolution(spec.type)) {
    const SpatialGeometry geometry = spatial_geometry(spec, input, dimensions, spec.out, where, layout);
    return std::make_unique<Convolution>(spec.name, type, input, geometry, spec.bias);
  }
  if (is_window_pooling(spec.type)) {
    const SpatialGeometry geometry = spatial_geometry(spec, input, dimensions, 0, where, layout);
    const PoolingKind kind = is_max_pooling(spec.type) ? PoolingKind::max : PoolingKind::average;
    return std::make_unique<Pooling>(spec.name, type, kind, input, geometry, shape_after(geometry));
  }
  if (spec.type == LayerType::global_avgpool) {
    HPCTRAIN_VERIFY(input.size() == 3 || input.size() == 4, InputError,
                    where << ": layer '" << spec.name << "' (global_avgpool) needs samples of shape (C, H, W) or (C, "
                          << "D, H, W), but " << batch_shape_text(input)
                          << " arrives from the data or the previous layer",
                    "use it after conv or pooling layers, on image or volume data");
    LayerSpec whole = spec;
    whole.kernel.assign(input.begin() + 1, input.end());
    whole.stride = {1};
    whole.padding = {0};
    const SpatialGeometry geometry =
        spatial_geometry(whole, input, static_cast<int>(input.size()) - 1, 0, where, layout);
    return std::make_unique<Pooling>(spec.name, type, PoolingKind::average, input, geometry, SampleShape{input[0]});
  }
  if (spec.type == LayerType::flatten) return std::make_unique<Flatten>(spec.name, input, layout);
  if (spec.type == LayerType::groupnorm) {
    HPCTRAIN_VERIFY(input.size() >= 2 && input[0] % spec.groups == 0, InputError,
                    where << ": layer '" << spec.name << "' (groupnorm) with groups = " << spec.groups
                          << " needs samples of shape (C, ...) with C divisible by groups, but "
                          << batch_shape_text(input) << " arrives",
                    "use it after a conv layer and choose groups dividing its channel count");
    return std::make_unique<GroupNorm>(spec.name, input, spec.groups, static_cast<float>(spec.eps), layout);
  }
  HPCTRAIN_ASSERT(false, "no layer is made for type " << type);
}

}  // namespace hpctrain::nn_detail
