// Sequential model: builds layers from the deck, lays out the flat buffers, runs forward and backward.
#include "hpctrain/nn/model.hpp"

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain {

Model::Model(const ModelSection& spec, const SampleShape& input_shape, Backend& backend, ModelBuffers buffers,
             const std::string& deck_path)
    : backend_(backend), buffers_(buffers), input_shape_(input_shape), input_width_(shape_size(input_shape)) {
  // Buffers are BackendBuffers: an allocation that fails part way through set-up frees what was allocated before.
  HPCTRAIN_ASSERT(!spec.layers.empty(), "a model needs layers");
  HPCTRAIN_ASSERT(buffers_.max_rows > 0, "max_rows must be positive");
  build_layers(spec, deck_path, SpatialLayout::channels_first);
  if (channels_last_pays_off()) {
    layout_ = SpatialLayout::channels_last;
    build_layers(spec, deck_path, layout_);
  }
  // Linear followed by an activation the backend folds into the product (CUDA: relu). Test hook: the pairing on the
  // CPU backend, whose default composes the two operations (tests/cli/device_choice.sh checks results stay identical).
  const bool fold_relu_anyway = std::getenv("HPCTRAIN_FOLD_LINEAR_RELU") != nullptr;
  folded_.assign(layers_.size(), false);
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) {
    Activation kind{};
    float alpha = 0.0f;
    if (layers_[i]->takes_activation() && layers_[i + 1]->activation(&kind, &alpha) &&
        (backend_.fuses_linear_activation(kind) || (fold_relu_anyway && kind == Activation::relu))) {
      HPCTRAIN_ASSERT(kind == Activation::relu, "only relu's backward can run on its output");
      folded_[i] = true;
      ++i;  // the activation is taken; it cannot start a pair
    }
  }

  // Lay out the parameters, in forward order. Each tensor starts at a multiple of the backend's alignment (CUDA: 256
  // bytes, so no product or convolution stages a misaligned weight); the gaps hold zeros in every flat buffer, which
  // the optimizer keeps at zero and checkpoints never see (they store tensors). No alignment (the CPU): no gaps, the
  // layout of old.
  const std::size_t master_size = dtype_size(buffers_.master_dtype);
  std::size_t alignment =
      buffers_.parameter_alignment > 0 ? buffers_.parameter_alignment : backend_.parameter_alignment();
  // Test hook: the CUDA layout on the CPU backend (tests/cli/parameter_padding.sh checks results stay identical).
  if (const char* forced = std::getenv("HPCTRAIN_PARAMETER_ALIGNMENT"); forced != nullptr && alignment == 0)
    alignment = static_cast<std::size_t>(std::strtoull(forced, nullptr, 10));
  // In elements of the smaller dtype, so that the 16-bit working copy's tensors are aligned too.
  const std::size_t smallest = std::min(master_size, dtype_size(buffers_.activation_dtype));
  HPCTRAIN_ASSERT(alignment % master_size == 0,
                  "parameter alignment " << alignment << " for " << master_size << "-byte parameters");
  const auto aligned_elements = static_cast<std::int64_t>(alignment > 0 ? alignment / smallest : 1);
  const auto align = [aligned_elements](std::int64_t offset) {
    return (offset + aligned_elements - 1) / aligned_elements * aligned_elements;
  };
  std::int64_t widest = input_width_;
  std::int64_t saved_rows_blocks = 0;
  for (const auto& layer : layers_) {
    const auto specs = layer->parameters();
    if (!specs.empty()) parameter_count_ = align(parameter_count_);
    parameter_begin_.push_back(parameter_count_);
    for (const ParameterSpec& parameter : specs) {
      std::int64_t count = 1;
      for (auto extent : parameter.shape) count *= extent;
      parameter_count_ = align(parameter_count_);
      entries_.push_back({layer->name(), layer->type(), parameter.name, parameter.shape, parameter_count_, count});
      parameter_count_ += count;
      trainable_parameters_ += count;
    }
    saved_rows_blocks += layer->saved_per_row();
    widest = std::max(widest, layer->output_width());
  }
  parameter_begin_.push_back(parameter_count_);
  padded_ = parameter_count_ != trainable_parameters_;
  parameter_alignment_ = alignment;

  // Flat buffers.
  const std::size_t parameter_bytes =
      static_cast<std::size_t>(std::max<std::int64_t>(parameter_count_, 1)) * master_size;
  master_ = BackendBuffer(backend_, parameter_bytes);
  if (buffers_.training) {
    gradients_ = BackendBuffer(backend_, parameter_bytes);
    if (padded_) backend_.zero(gradients_.data, parameter_bytes);  // layers never write the gaps
  }
  const bool keep_working_copy = buffers_.activation_dtype != buffers_.master_dtype;
  if (keep_working_copy)
    working_ = BackendBuffer(backend_, static_cast<std::size_t>(std::max<std::int64_t>(parameter_count_, 1)) *
                                           dtype_size(buffers_.activation_dtype));

  // Activations: the input of every layer and the final output, each (max_rows, width).
  const std::size_t activation_size = dtype_size(buffers_.activation_dtype);
  std::int64_t layer_width = input_width_;
  for (std::size_t i = 0; i <= layers_.size(); ++i) {
    activations_.emplace_back(backend_, static_cast<std::size_t>(buffers_.max_rows * layer_width) * activation_size);
    if (i < layers_.size()) layer_width = layers_[i]->output_width();
  }
  if (layout_ == SpatialLayout::channels_last)  // the input batch, converted once per step
    converted_input_ =
        BackendBuffer(backend_, static_cast<std::size_t>(buffers_.max_rows * input_width_) * activation_size);
  const std::size_t scratch_bytes = static_cast<std::size_t>(buffers_.max_rows * widest) * activation_size;
  if (buffers_.training)
    for (auto& scratch : scratch_) scratch = BackendBuffer(backend_, scratch_bytes);
  if (saved_rows_blocks > 0)
    saved_ = BackendBuffer(backend_, static_cast<std::size_t>(saved_rows_blocks * buffers_.max_rows) * master_size);
  const auto weights = static_cast<std::int64_t>(spec.class_weights.size());
  HPCTRAIN_VERIFY(weights == 0 || weights == output_width(), InputError,
                  deck_path << ": model.class_weights has " << weights << " values but the model has " << output_width()
                            << " outputs (classes)",
                  "give one weight per class, in class order (or widen the last layer to the number of classes)");
  // A sequence output (T, classes) is scored at every position: the loss sees rows * T rows.
  if (layers_.front()->reads_token_ids() && layers_.back()->output_shape().size() == 2)
    positions_ = layers_.back()->output_shape().front();
  if (positions_ > 1 && (!spec.class_weights.empty() || spec.label_smoothing != 0.0))
    throw NotSupported(deck_path +
                       ": model.class_weights and model.label_smoothing on a sequence model (the loss over positions) "
                       "are not supported yet; remove them");
  loss_ = std::make_unique<Loss>(spec.loss, backend_, buffers_.max_rows * positions_, output_width() / positions_,
                                 spec.class_weights, spec.label_smoothing);
  if (layers_.front()->reads_token_ids()) {
    token_ids_ =
        BackendBuffer(backend_, static_cast<std::size_t>(buffers_.max_rows * input_width_) * sizeof(std::int32_t));
    layers_.front()->bind_token_ids(token_ids_.as<std::int32_t>());
  }
  memory_.parameters = parameter_bytes;
  memory_.gradients = buffers_.training ? parameter_bytes : 0;
  memory_.working_copy =
      keep_working_copy ? static_cast<std::size_t>(parameter_count_) * dtype_size(buffers_.activation_dtype) : 0;
  std::int64_t activation_elements = 0;  // per row
  for (std::size_t i = 0; i <= layers_.size(); ++i)
    activation_elements += i == 0 ? input_width_ : layers_[i - 1]->output_width();
  if (layout_ == SpatialLayout::channels_last) activation_elements += input_width_;
  if (buffers_.training) activation_elements += 2 * widest;
  memory_.activations =
      static_cast<std::size_t>(buffers_.max_rows) * (static_cast<std::size_t>(activation_elements) * activation_size +
                                                     static_cast<std::size_t>(saved_rows_blocks) * master_size);
  if (token_ids_.data != nullptr)  // an embedding model's int32 token input
    memory_.activations += static_cast<std::size_t>(buffers_.max_rows * input_width_) * sizeof(std::int32_t);
  decoding_caches_.resize(layers_.size());
  if (buffers_.decoding)
    for (std::size_t i = 0; i < layers_.size(); ++i)
      if (const std::int64_t per_position = layers_[i]->decoding_cache_per_position(); per_position > 0) {
        const std::size_t bytes = static_cast<std::size_t>(positions_ * per_position) * activation_size;
        decoding_caches_[i] = BackendBuffer(backend_, bytes);
        memory_.activations += bytes;
      }

  // Hand each layer its views.
  std::size_t entry = 0;
  std::int64_t saved_block = 0;
  for (auto& layer : layers_) {
    ParameterBinding binding{master_.data,
                             gradients_.data,
                             keep_working_copy ? working_.data : master_.data,
                             buffers_.master_dtype,
                             keep_working_copy ? buffers_.activation_dtype : buffers_.master_dtype,
                             {}};
    for (std::size_t p = 0; p < layer->parameters().size(); ++p) binding.offsets.push_back(entries_[entry++].offset);
    layer->bind(std::move(binding));
    if (layer->saved_per_row() > 0) {
      layer->bind_saved(saved_.as<char>() + saved_block * buffers_.max_rows * static_cast<std::int64_t>(master_size),
                        buffers_.max_rows);
      saved_block += layer->saved_per_row();
    }
  }
}

void Model::build_layers(const ModelSection& spec, const std::string& deck_path, SpatialLayout layout) {
  layers_.clear();
  SampleShape shape = input_shape_;
  bool sequence = false;  // after an embedding: samples are (T, C)
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer_spec = spec.layers[i];
    // A layer list given by --set has no position in the deck file.
    const std::string location = layer_spec.position.line > 0
                                     ? deck_path + ":" + std::to_string(layer_spec.position.line) + ":" +
                                           std::to_string(layer_spec.position.column)
                                     : deck_path + ": model.layers[" + std::to_string(i) + "]";
    HPCTRAIN_VERIFY(layer_spec.type != LayerType::embedding || i == 0, InputError,
                    location << ": layer '" << layer_spec.name << "' (embedding) is layer " << i
                             << " of the model; it reads the token ids of the data, so it must come first",
                    "move the embedding to the top of model.layers");
    layers_.push_back(make_layer(layer_spec, shape, location, layout, sequence));
    const Layer& layer = *layers_.back();
    sequence = sequence || layer.reads_token_ids();
    if (sequence && layer.output_shape().size() != 2) sequence = false;  // flatten ends the sequence
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
  void* data = index == 0 && converted_input_.data != nullptr ? converted_input_.data : activations_[index].data;
  return {data, buffers_.activation_dtype, rows, index == 0 ? input_width_ : layers_[index - 1]->output_width()};
}

Model::~Model() = default;

TensorView Model::working_copy() const {
  return {working_.data, buffers_.activation_dtype, working_.data != nullptr ? parameter_count_ : 0, 1};
}

void Model::initialize(std::uint64_t seed) {
  // Initialise in fp32 on the host (the generator's output is fp32), then convert to the master dtype.
  std::vector<float> host(static_cast<std::size_t>(parameter_count_));
  if (!padded_) {
    for (std::size_t i = 0; i < layers_.size(); ++i)
      layers_[i]->initialize(host.data() + parameter_begin_[i], seed, static_cast<std::uint32_t>(i));
  } else {
    // A layer initialises its tensors back to back: into a contiguous block, then into their padded places.
    std::size_t entry = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const std::size_t tensors = layers_[i]->parameters().size();
      std::int64_t total = 0;
      for (std::size_t t = 0; t < tensors; ++t) total += entries_[entry + t].count;
      std::vector<float> block(static_cast<std::size_t>(total));
      layers_[i]->initialize(block.data(), seed, static_cast<std::uint32_t>(i));
      std::int64_t from = 0;
      for (std::size_t t = 0; t < tensors; ++t, ++entry) {
        const ParameterEntry& tensor = entries_[entry];
        std::copy_n(block.begin() + from, tensor.count, host.begin() + tensor.offset);
        from += tensor.count;
      }
    }
  }
  if (buffers_.master_dtype == DType::f32) {
    backend_.copy_to_backend(master_.data, host.data(), host.size() * sizeof(float));
  } else {
    std::vector<double> widened(host.begin(), host.end());
    backend_.copy_to_backend(master_.data, widened.data(), widened.size() * sizeof(double));
  }
  refresh_working_copy();
}

void Model::refresh_working_copy() {
  if (working_.data == nullptr) return;
  backend_.cast({master_.data, buffers_.master_dtype, parameter_count_, 1}, working_copy());
}

TensorView Model::input(std::int64_t rows) const {
  return {activations_[0].data, buffers_.activation_dtype, rows, input_width_};
}

TensorView Model::forward(const StepContext& context) {
  const DType dtype = buffers_.activation_dtype;
  if (converted_input_.data != nullptr)
    backend_.convert_spatial_layout(input_shape_[0], SpatialLayout::channels_first, input(context.rows),
                                    layer_input(0, context.rows));
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const TensorView y{activations_[i + 1].data, dtype, context.rows, layers_[i]->output_width()};
    if (folded_[i]) {
      Activation kind{};
      float alpha = 0.0f;
      layers_[i + 1]->activation(&kind, &alpha);
      const TensorView activated{activations_[i + 2].data, dtype, context.rows, layers_[i + 1]->output_width()};
      if (layers_[i]->forward_activated(context, layer_input(i, context.rows), y, activated, kind, alpha)) {
        ++i;
        continue;
      }
    }
    layers_[i]->forward(context, static_cast<std::uint32_t>(i), layer_input(i, context.rows), y);
  }
  return output(context.rows);
}

TensorView Model::output(std::int64_t rows) const {
  return {activations_.back().data, buffers_.activation_dtype, rows, output_width()};
}

void Model::apply_loss(std::int64_t rows, const float* gradient_scale, LossSums* sums) {
  const TensorView logits = output(rows);
  loss_->apply({logits.data, logits.dtype, rows * positions_, logits.cols / positions_}, gradient_scale, sums);
}

void Model::backward(const StepContext& context, bool accumulate,
                     const std::function<void(std::int64_t)>& after_layer) {
  HPCTRAIN_ASSERT(buffers_.training, "backward on a model built for inference");
  const DType dtype = buffers_.activation_dtype;
  TensorView dy = output(context.rows);
  for (std::size_t i = layers_.size(); i-- > 0;) {
    Layer& layer = *layers_[i];
    const TensorView y{activations_[i + 1].data, dtype, context.rows, layer.output_width()};
    // A folded relu's input (the pre-activation) may be unwritten: its derivative is read from its output instead.
    const TensorView x = i > 0 && folded_[i - 1] ? y : layer_input(i, context.rows);
    TensorView dx{nullptr, dtype, context.rows, layer.input_width()};
    if (layer.in_place_backward()) {
      dx.data = dy.data;
    } else if (!(i == 0 && layer.skips_input_gradient())) {  // the model's input needs no gradient
      dx.data = dy.data == scratch_[0].data ? scratch_[1].data : scratch_[0].data;
    }
    layer.backward(context, static_cast<std::uint32_t>(i), x, y, dy, dx, accumulate);
    if (after_layer && parameter_begin_[i + 1] > parameter_begin_[i]) after_layer(parameter_begin_[i]);
    dy = dx;
  }
}

const Layer* Model::layer_without_incremental_decoding() const {
  for (const auto& layer : layers_)
    if (layer->incremental_decoding(backend_) == IncrementalDecoding::unsupported) return layer.get();
  return nullptr;
}

TensorView Model::forward_positions(const StepContext& context, std::int64_t first, std::int64_t count) {
  HPCTRAIN_ASSERT(buffers_.decoding && token_ids_.data != nullptr && positions_ > 1,
                  "forward_positions on a model not built for decoding");
  HPCTRAIN_ASSERT(first >= 0 && count > 0 && first + count <= positions_,
                  "positions [" << first << ", " << first + count << ") of a sequence of " << positions_);
  const DType dtype = buffers_.activation_dtype;
  // Every activation buffer holds at least T positions of one sample: the new positions' rows go to its start.
  auto per_position = [](const SampleShape& shape) { return shape.size() == 2 ? shape.back() : std::int64_t{1}; };
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = *layers_[i];
    const auto index = static_cast<std::uint32_t>(i);
    const std::int64_t in = i == 0 ? 1 : per_position(layer.input_shape()), out = per_position(layer.output_shape());
    const TensorView x{activations_[i].data, dtype, count, in}, y{activations_[i + 1].data, dtype, count, out};
    switch (layer.incremental_decoding(backend_)) {
      case IncrementalDecoding::position_wise:  // the new positions as one sample of `count` positions
        layer.forward(context, index, {x.data, dtype, 1, count * in}, {y.data, dtype, 1, count * out});
        break;
      case IncrementalDecoding::own:
        layer.forward_positions(context, index, first, x, y, decoding_caches_[i].data);
        break;
      case IncrementalDecoding::unsupported:
        throw NotSupported("layer '" + layer.name() + "' (" + layer.type() + ") has no incremental decoding on the " +
                           backend_.name() + " backend");
    }
  }
  return {activations_.back().data, dtype, count, classes()};
}

std::int64_t Model::layer_parameters(std::size_t index) const {
  std::int64_t count = 0;
  for (const ParameterEntry& entry : entries_)
    if (entry.offset >= parameter_begin_[index] && entry.offset < parameter_begin_[index + 1]) count += entry.count;
  return count;
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
       << batch_shape_text(layer.output_shape()) << layer_parameters(i) << "\n";
  }
  os << "  total parameters: " << trainable_parameters_;
  if (padded_)
    os << " (tensors at " << parameter_alignment_ << "-byte offsets: flat buffers of " << parameter_count_
       << " elements)";
  if (const auto pairs = std::count(folded_.begin(), folded_.end(), true); pairs > 0)
    os << "\n  " << pairs << " linear + relu pair(s) run as one product each (relu in the product's epilogue)";
  if (const std::string loss = loss_->options_text(); !loss.empty()) os << "\n  loss: " << loss;
  if (layout_ == SpatialLayout::channels_last)
    os << "\n  conv layers run channels-last (the " << backend_.name()
       << " backend's fastest layout): each batch is converted on the way in and at flatten";
  return os.str();
}

}  // namespace hpctrain
