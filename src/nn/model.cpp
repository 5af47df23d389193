// Sequential model: builds layers from the deck, lays out the flat buffers, runs forward and backward.
#include "hpctrain/nn/model.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "hpctrain/config/run_config.hpp"

namespace hpctrain {

Model::Model(const ModelSection& spec, const SampleShape& input_shape, Backend& backend, ModelBuffers buffers,
             const std::string& deck_path)
    : backend_(backend), buffers_(buffers), input_shape_(input_shape), input_width_(shape_size(input_shape)) {
  HPCTRAIN_ASSERT(!spec.layers.empty(), "a model needs layers");
  HPCTRAIN_ASSERT(buffers_.max_rows > 0, "max_rows must be positive");
  build_layers(spec, deck_path, SpatialLayout::channels_first);
  if (channels_last_pays_off()) {
    layout_ = SpatialLayout::channels_last;
    build_layers(spec, deck_path, layout_);
  }

  // Lay out the parameters, in forward order.
  std::int64_t widest = input_width_;
  std::int64_t saved_rows_blocks = 0;
  for (const auto& layer : layers_) {
    parameter_begin_.push_back(parameter_count_);
    for (const ParameterSpec& parameter : layer->parameters()) {
      std::int64_t count = 1;
      for (auto extent : parameter.shape) count *= extent;
      entries_.push_back({layer->name(), layer->type(), parameter.name, parameter.shape, parameter_count_, count});
      parameter_count_ += count;
    }
    saved_rows_blocks += layer->saved_per_row();
    widest = std::max(widest, layer->output_width());
  }
  parameter_begin_.push_back(parameter_count_);

  // Flat buffers.
  const std::size_t master_size = dtype_size(buffers_.master_dtype);
  const std::size_t parameter_bytes =
      static_cast<std::size_t>(std::max<std::int64_t>(parameter_count_, 1)) * master_size;
  master_ = backend_.allocate(parameter_bytes);
  if (buffers_.training) gradients_ = backend_.allocate(parameter_bytes);
  const bool keep_working_copy = buffers_.activation_dtype != buffers_.master_dtype;
  if (keep_working_copy)
    working_ = backend_.allocate(static_cast<std::size_t>(std::max<std::int64_t>(parameter_count_, 1)) *
                                 dtype_size(buffers_.activation_dtype));

  // Activations: the input of every layer and the final output, each (max_rows, width).
  const std::size_t activation_size = dtype_size(buffers_.activation_dtype);
  std::int64_t layer_width = input_width_;
  for (std::size_t i = 0; i <= layers_.size(); ++i) {
    const std::size_t bytes = static_cast<std::size_t>(buffers_.max_rows * layer_width) * activation_size;
    activations_.push_back(backend_.allocate(bytes));
    if (i < layers_.size()) layer_width = layers_[i]->output_width();
  }
  if (layout_ == SpatialLayout::channels_last) {  // the input batch, converted once per step
    converted_input_ = backend_.allocate(static_cast<std::size_t>(buffers_.max_rows * input_width_) * activation_size);
  }
  const std::size_t scratch_bytes = static_cast<std::size_t>(buffers_.max_rows * widest) * activation_size;
  if (buffers_.training)
    for (auto& scratch : scratch_) scratch = backend_.allocate(scratch_bytes);
  if (saved_rows_blocks > 0)
    saved_ = backend_.allocate(static_cast<std::size_t>(saved_rows_blocks * buffers_.max_rows) * master_size);

  // Hand each layer its views.
  std::size_t entry = 0;
  std::int64_t saved_block = 0;
  for (auto& layer : layers_) {
    ParameterBinding binding{master_,
                             gradients_,
                             keep_working_copy ? working_ : master_,
                             buffers_.master_dtype,
                             keep_working_copy ? buffers_.activation_dtype : buffers_.master_dtype,
                             {}};
    for (std::size_t p = 0; p < layer->parameters().size(); ++p) binding.offsets.push_back(entries_[entry++].offset);
    layer->bind(std::move(binding));
    if (layer->saved_per_row() > 0) {
      layer->bind_saved(
          static_cast<char*>(saved_) + saved_block * buffers_.max_rows * static_cast<std::int64_t>(master_size),
          buffers_.max_rows);
      saved_block += layer->saved_per_row();
    }
  }
}

void Model::build_layers(const ModelSection& spec, const std::string& deck_path, SpatialLayout layout) {
  layers_.clear();
  SampleShape shape = input_shape_;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer_spec = spec.layers[i];
    // A layer list given by --set has no position in the deck file.
    const std::string location = layer_spec.position.line > 0
                                     ? deck_path + ":" + std::to_string(layer_spec.position.line) + ":" +
                                           std::to_string(layer_spec.position.column)
                                     : deck_path + ": model.layers[" + std::to_string(i) + "]";
    layers_.push_back(make_layer(layer_spec, shape, location, layout));
    const Layer& layer = *layers_.back();
    if (layer.uses_spatial_operations() && !backend_.has_spatial_operations())
      throw NotSupported(location + ": layer '" + layer.name() + "' (" + layer.type() + ") on the " + backend_.name() +
                         " backend, which has no convolution, pooling and groupnorm operations (a CUDA build without "
                         "cuDNN: rebuild with cuDNN, CUDNN_ROOT); run this model with run.device = \"cpu\"");
    shape = layer.output_shape();
  }
}

// Channels-last when the backend prefers it, the model has a conv stack on image/volume input, every layer that sees a
// spatial sample can take that layout, and the output is flat (so losses, targets and predictions never see it).
bool Model::channels_last_pays_off() const {
  if (backend_.preferred_spatial_layout() != SpatialLayout::channels_last || input_shape_.size() < 3 ||
      layers_.back()->output_shape().size() != 1)
    return false;
  bool spatial_operations = false;
  for (const auto& layer : layers_) {
    if (layer->input_shape().size() > 1 && !layer->takes_any_layout()) return false;
    spatial_operations = spatial_operations || layer->uses_spatial_operations();
  }
  return spatial_operations;
}

TensorView Model::layer_input(std::size_t index, std::int64_t rows) const {
  void* data = index == 0 && converted_input_ != nullptr ? converted_input_ : activations_[index];
  return {data, buffers_.activation_dtype, rows, index == 0 ? input_width_ : layers_[index - 1]->output_width()};
}

Model::~Model() {
  for (void* pointer : {master_, gradients_, working_, saved_, converted_input_, scratch_[0], scratch_[1]})
    if (pointer != nullptr) backend_.deallocate(pointer);
  for (void* pointer : activations_) backend_.deallocate(pointer);
}

TensorView Model::working_copy() const {
  return {working_, buffers_.activation_dtype, working_ != nullptr ? parameter_count_ : 0, 1};
}

void Model::initialize(std::uint64_t seed) {
  // Initialise in fp32 on the host (the generator's output is fp32), then convert to the master dtype.
  std::vector<float> host(static_cast<std::size_t>(parameter_count_));
  for (std::size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->initialize(host.data() + parameter_begin_[i], seed, static_cast<std::uint32_t>(i));
  if (buffers_.master_dtype == DType::f32) {
    backend_.copy_to_backend(master_, host.data(), host.size() * sizeof(float));
  } else {
    std::vector<double> widened(host.begin(), host.end());
    backend_.copy_to_backend(master_, widened.data(), widened.size() * sizeof(double));
  }
  refresh_working_copy();
}

void Model::refresh_working_copy() {
  if (working_ == nullptr) return;
  backend_.cast({master_, buffers_.master_dtype, parameter_count_, 1}, working_copy());
}

TensorView Model::input(std::int64_t rows) const {
  return {activations_[0], buffers_.activation_dtype, rows, input_width_};
}

TensorView Model::forward(const StepContext& context) {
  const DType dtype = buffers_.activation_dtype;
  if (converted_input_ != nullptr)
    backend_.convert_spatial_layout(input_shape_[0], SpatialLayout::channels_first, input(context.rows),
                                    layer_input(0, context.rows));
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const TensorView y{activations_[i + 1], dtype, context.rows, layers_[i]->output_width()};
    layers_[i]->forward(context, static_cast<std::uint32_t>(i), layer_input(i, context.rows), y);
  }
  return {activations_.back(), dtype, context.rows, output_width()};
}

void Model::backward(const StepContext& context, bool accumulate,
                     const std::function<void(std::int64_t)>& after_layer) {
  HPCTRAIN_ASSERT(buffers_.training, "backward on a model built for inference");
  const DType dtype = buffers_.activation_dtype;
  TensorView dy{activations_.back(), dtype, context.rows, output_width()};
  for (std::size_t i = layers_.size(); i-- > 0;) {
    Layer& layer = *layers_[i];
    const TensorView x = layer_input(i, context.rows);
    const TensorView y{activations_[i + 1], dtype, context.rows, layer.output_width()};
    TensorView dx{nullptr, dtype, context.rows, layer.input_width()};
    if (layer.in_place_backward()) {
      dx.data = dy.data;
    } else if (!(i == 0 && layer.skips_input_gradient())) {  // the model's input needs no gradient
      dx.data = dy.data == scratch_[0] ? scratch_[1] : scratch_[0];
    }
    layer.backward(context, static_cast<std::uint32_t>(i), x, y, dy, dx, accumulate);
    if (after_layer && parameter_begin_[i + 1] > parameter_begin_[i]) after_layer(parameter_begin_[i]);
    dy = dx;
  }
}

std::string Model::summary() const {
  std::ostringstream os;
  os << "  " << std::left << std::setw(16) << "layer" << std::setw(16) << "type" << std::setw(24) << "output"
     << "parameters\n";
  os << "  " << std::setw(16) << "input" << std::setw(16) << "" << std::setw(24) << batch_shape_text(input_shape_)
     << "\n";
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    os << "  " << std::setw(16) << layer.name() << std::setw(16) << layer.type() << std::setw(24)
       << batch_shape_text(layer.output_shape()) << (parameter_begin_[i + 1] - parameter_begin_[i]) << "\n";
  }
  os << "  total parameters: " << parameter_count_;
  if (layout_ == SpatialLayout::channels_last)
    os << "\n  conv layers run channels-last (the " << backend_.name()
       << " backend's fastest layout): each batch is converted on the way in and at flatten";
  return os.str();
}

}  // namespace hpctrain
