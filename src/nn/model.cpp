// Sequential model: builds layers from the deck, lays out the flat buffers, runs forward and backward.
#include "hpctrain/nn/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "residual_markers.hpp"

namespace hpctrain {

Model::Model(const ModelSection& spec, const SampleShape& input_shape, Backend& backend, ModelBuffers buffers,
             const std::string& deck_path)
    : backend_(backend),
      buffers_(buffers),
      input_shape_(input_shape),
      input_width_(shape_size(input_shape)),
      init_scheme_(spec.init) {
  // Buffers are BackendBuffers: an allocation that fails part way through set-up frees what was allocated before.
  HPCTRAIN_ASSERT(!spec.layers.empty(), "a model needs layers");
  HPCTRAIN_ASSERT(buffers_.max_rows > 0, "max_rows must be positive");
  build_layers(spec, deck_path, SpatialLayout::channels_first);
  if (channels_last_pays_off()) {
    layout_ = SpatialLayout::channels_last;
    build_layers(spec, deck_path, layout_);
  }
  // Linear followed by an activation the backend folds into the product (CUDA: relu, gelu tanh). Test hook: the
  // pairing on the CPU backend, whose defaults compose the operations (tests/cli/device_choice.sh checks results
  // stay identical).
  const bool fold_anyway = std::getenv("HPCTRAIN_FOLD_LINEAR_RELU") != nullptr;
  folded_.assign(layers_.size(), false);
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) {
    Activation kind{};
    float alpha = 0.0f;
    if (layers_[i]->takes_activation() && layers_[i + 1]->activation(&kind, &alpha) &&
        (backend_.fuses_linear_activation(kind) ||
         (fold_anyway && (kind == Activation::relu || kind == Activation::gelu_tanh)))) {
      folded_[i] = true;
      ++i;  // the activation is taken; it cannot start a pair
    }
  }
  // A branch ending with a linear or attention layer writes the block's sum itself when the backend folds the add
  // into the product (Backend::fuses_residual_add); the closing marker's forward then does nothing. Test and
  // benchmark hook: HPCTRAIN_FUSE_RESIDUAL=0 keeps the separate add.
  const char* fuse_setting = std::getenv("HPCTRAIN_FUSE_RESIDUAL");
  const bool fuse_residual = (fuse_setting == nullptr || std::string(fuse_setting) != "0") &&
                             backend_.fuses_residual_add(buffers_.activation_dtype);
  adds_residual_.assign(layers_.size(), false);
  for (const ResidualBlock& block : blocks_) {
    const std::size_t last = block.close - 1;
    if (fuse_residual && last > block.open && !(last > 0 && folded_[last - 1]) && layers_[last]->ends_with_projection())
      adds_residual_[last] = true;
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
  std::int64_t saved_activation_elements = 0, workspace_elements = 0;  // per row, activation dtype
  // A tied weight (linear's tie) is the earlier embedding's table: no tensor of its own, the table's slot bound twice.
  std::vector<bool> shares_first(layers_.size(), false);  // layer i's first tensor is also a later layer's
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    const auto specs = layer.parameters();
    const std::size_t tied = tied_owner(i);
    if (specs.size() > (tied < i ? 1 : 0)) parameter_count_ = align(parameter_count_);
    parameter_begin_.push_back(parameter_count_);
    slots_.emplace_back();
    for (std::size_t p = 0; p < specs.size(); ++p) {
      const ParameterSpec& parameter = specs[p];
      const std::int64_t count = shape_size(parameter.shape);
      if (p == 0 && tied < i) {
        slots_.back().push_back({slots_[tied].front().offset, count, true});
        shares_first[tied] = true;
        continue;
      }
      parameter_count_ = align(parameter_count_);
      entries_.push_back({layer.name(), layer.type(), parameter.name, parameter.shape, parameter_count_, count});
      slots_.back().push_back({parameter_count_, count, false});
      parameter_count_ += count;
      trainable_parameters_ += count;
    }
    saved_rows_blocks += layer.saved_per_row();
    saved_activation_elements += layer.saved_activations_per_row();
    workspace_elements = std::max(workspace_elements, layer.backward_workspace_per_row());
    widest = std::max(widest, layer.output_width());
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

  // Activations: the input of every layer and the final output, each (max_rows, width); none for an opening marker's
  // output (its input).
  const std::size_t activation_size = dtype_size(buffers_.activation_dtype);
  std::int64_t layer_width = input_width_;
  for (std::size_t i = 0; i <= layers_.size(); ++i) {
    // A fused branch end writes the closing marker's output, not its input (decoding runs the add separately).
    const bool unused_branch_output = i > 0 && adds_residual_[i - 1] && !buffers_.decoding;
    if ((i > 0 && opens_block(i - 1)) || unused_branch_output)
      activations_.emplace_back();
    else
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
  if (!buffers_.training) workspace_elements = 0;
  if (saved_activation_elements > 0)
    saved_activations_ = BackendBuffer(
        backend_, static_cast<std::size_t>(saved_activation_elements * buffers_.max_rows) * activation_size);
  if (workspace_elements > 0)
    backward_workspace_ =
        BackendBuffer(backend_, static_cast<std::size_t>(workspace_elements * buffers_.max_rows) * activation_size);
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
    if (i == 0 || !(opens_block(i - 1) || (adds_residual_[i - 1] && !buffers_.decoding)))
      activation_elements += i == 0 ? input_width_ : layers_[i - 1]->output_width();
  if (layout_ == SpatialLayout::channels_last) activation_elements += input_width_;
  if (buffers_.training) activation_elements += 2 * widest;
  activation_elements += saved_activation_elements + workspace_elements;
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
  std::int64_t saved_block = 0, saved_activation_block = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    auto& layer = layers_[i];
    ParameterBinding binding{master_.data,
                             gradients_.data,
                             keep_working_copy ? working_.data : master_.data,
                             buffers_.master_dtype,
                             keep_working_copy ? buffers_.activation_dtype : buffers_.master_dtype,
                             {},
                             {shares_first[i]}};
    for (const TensorSlot& slot : slots_[i]) binding.offsets.push_back(slot.offset);
    layer->bind(std::move(binding));
    if (layer->saved_per_row() > 0) {
      layer->bind_saved(saved_.as<char>() + saved_block * buffers_.max_rows * static_cast<std::int64_t>(master_size),
                        buffers_.max_rows);
      saved_block += layer->saved_per_row();
    }
    if (layer->saved_activations_per_row() > 0) {
      layer->bind_activation_storage(saved_activations_.as<char>() + saved_activation_block * buffers_.max_rows *
                                                                         static_cast<std::int64_t>(activation_size),
                                     backward_workspace_.data, buffers_.max_rows);
      saved_activation_block += layer->saved_activations_per_row();
    }
  }
  bind_residual_blocks();
}

void Model::build_layers(const ModelSection& spec, const std::string& deck_path, SpatialLayout layout) {
  layers_.clear();
  blocks_.clear();
  SampleShape shape = input_shape_;
  bool sequence = false;  // after an embedding or a to_sequence: samples are (T, C)
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer_spec = spec.layers[i];
    // A layer list given by --set has no position in the deck file.
    const std::string location = layer_spec.position.line > 0
                                     ? deck_path + ":" + std::to_string(layer_spec.position.line) + ":" +
                                           std::to_string(layer_spec.position.column)
                                     : deck_path + ": model.layers[" + std::to_string(i) + "]";
    if (layer_spec.type == LayerType::residual) {
      add_residual_block(layer_spec, location, deck_path, layout, shape, sequence);
    } else if (layer_spec.type == LayerType::transformer_block) {
      HPCTRAIN_VERIFY(sequence, InputError,
                      location << ": layer '" << layer_spec.name << "' (transformer_block) receives samples "
                               << batch_shape_text(shape) << ", not a sequence (T, C)",
                      "a transformer_block acts on the (T, C) sequences an embedding or a to_sequence gives: put "
                      "it after one");
      for (const LayerSpec& block : expand_transformer_block(layer_spec, shape.back()))
        add_residual_block(block, location, deck_path, layout, shape, sequence);
    } else
      add_layer(layer_spec, location, layout, shape, sequence);
  }
  // GPT-2's initialisation scales the projection that ends each residual branch (a linear or attention layer whose
  // output is added back) by 1 / sqrt(the number of branches).
  residual_branches_ = blocks_.size();
  for (const ResidualBlock& block : blocks_)
    for (std::size_t j = block.close; j-- > block.open + 1;) {
      if (layers_[j]->parameters().empty()) continue;
      if (layers_[j]->ends_with_projection()) layers_[j]->set_residual_output(true);
      break;
    }
}

void Model::add_layer(const LayerSpec& spec, const std::string& location, SpatialLayout layout, SampleShape& shape,
                      bool& sequence) {
  HPCTRAIN_VERIFY(spec.type != LayerType::embedding || layers_.empty(), InputError,
                  location << ": layer '" << spec.name << "' (embedding) is layer " << layers_.size()
                           << " of the model; it reads the token ids of the data, so it must come first",
                  "move the embedding to the top of model.layers");
  layers_.push_back(make_layer(spec, shape, location, layout, sequence));
  check_tie(layers_.size() - 1, location);
  const Layer& layer = *layers_.back();
  sequence = sequence || layer.starts_sequence();
  if (sequence && layer.output_shape().size() != 2) sequence = false;  // sequence_pool and flatten end the sequence
  if (layer.uses_spatial_operations() && !backend_.has_spatial_operations())
    throw NotSupported(location + ": layer '" + layer.name() + "' (" + layer.type() + ") on the " + backend_.name() +
                       " backend, which has no convolution, pooling and groupnorm operations (a CUDA build without "
                       "cuDNN: rebuild with cuDNN, CUDNN_ROOT); run this model with run.device = \"cpu\"");
  shape = layer.output_shape();
}

void Model::add_residual_block(const LayerSpec& spec, const std::string& location, const std::string& deck_path,
                               SpatialLayout layout, SampleShape& shape, bool& sequence) {
  HPCTRAIN_ASSERT(!spec.layers.empty(), "residual block '" << spec.name << "' without layers");  // the deck checks
  const SampleShape block_input = shape;
  const std::size_t open = layers_.size();
  layers_.push_back(std::make_unique<nn_detail::ResidualOpen>(spec.name, shape));
  for (std::size_t j = 0; j < spec.layers.size(); ++j) {
    LayerSpec inner = spec.layers[j];
    HPCTRAIN_ASSERT(inner.type != LayerType::residual, "nested residual block '" << inner.name << "'");
    inner.name = spec.name + "." + inner.name;
    const std::string inner_location = inner.position.line > 0 ? deck_path + ":" + std::to_string(inner.position.line) +
                                                                     ":" + std::to_string(inner.position.column)
                                                               : location + " (layers[" + std::to_string(j) + "])";
    add_layer(inner, inner_location, layout, shape, sequence);
  }
  HPCTRAIN_VERIFY(shape == block_input, InputError,
                  location << ": the branch of residual block '" << spec.name << "' turns samples "
                           << batch_shape_text(block_input) << " into " << batch_shape_text(shape)
                           << ", but a residual block adds its branch's output to its input, so the two must have "
                              "one shape",
                  "make the branch give back " + batch_shape_text(block_input) +
                      " (e.g. end it with a linear layer of out = " + std::to_string(block_input.back()) +
                      "), or move the layers that change the shape out of the block");
  layers_.push_back(std::make_unique<nn_detail::ResidualClose>(spec.name, shape));
  blocks_.push_back({open, layers_.size() - 1});
}

std::size_t Model::tied_owner(std::size_t index) const {
  const std::string& owner = layers_[index]->tied_layer();
  if (owner.empty()) return layers_.size();
  for (std::size_t i = 0; i < index; ++i)
    if (layers_[i]->name() == owner) return i;
  return layers_.size();
}

// The deck checks that tie names an embedding and that out is its vocabulary (config/deck_validation.cpp); here: that
// the embedding comes first (it always does) and that the layer's input is as wide as the table.
void Model::check_tie(std::size_t index, const std::string& location) const {
  const Layer& layer = *layers_[index];
  if (layer.tied_layer().empty()) return;
  const std::size_t owner = tied_owner(index);
  HPCTRAIN_VERIFY(owner < index && layers_[owner]->reads_token_ids(), InputError,
                  location << ": layer '" << layer.name() << "' ties its weight to '" << layer.tied_layer()
                           << "', which is not an embedding layer before it",
                  "name the model's embedding layer in tie, or remove tie");
  const auto table = layers_[owner]->parameters().front().shape;
  const auto weight = layer.parameters().front().shape;
  HPCTRAIN_VERIFY(table == weight, InputError,
                  location << ": layer '" << layer.name() << "' ties its weight to the table of embedding '"
                           << layer.tied_layer() << "', of shape (" << table[0] << ", " << table[1]
                           << "), but its weight is (" << weight[0] << ", " << weight[1] << "): " << weight[1]
                           << " input features arrive and the table rows have " << table[1],
                  "make the layers before it output " + std::to_string(table[1]) +
                      " features per position (the embedding's out), or remove tie");
}

// Channels-last when the backend prefers it, the model has a conv stack on image/volume input, every layer that sees a
// spatial sample ((C, H, W) or (C, D, H, W); flatten, global_avgpool and to_sequence end them) can take that layout,
// and the output is flat (so losses, targets and predictions never see it).
bool Model::channels_last_pays_off() const {
  if (backend_.preferred_spatial_layout(buffers_.activation_dtype) != SpatialLayout::channels_last ||
      input_shape_.size() < 3 || layers_.back()->output_shape().size() != 1)
    return false;
  bool spatial_operations = false;
  for (const auto& layer : layers_) {
    if (layer->input_shape().size() >= 3 && !layer->takes_any_layout()) return false;
    spatial_operations = spatial_operations || layer->uses_spatial_operations();
  }
  return spatial_operations;
}

TensorView Model::layer_input(std::size_t index, std::int64_t rows) const {
  return {activation(index), buffers_.activation_dtype, rows,
          index == 0 ? input_width_ : layers_[index - 1]->output_width()};
}

bool Model::opens_block(std::size_t index) const {
  return std::any_of(blocks_.begin(), blocks_.end(),
                     [index](const ResidualBlock& block) { return block.open == index; });
}

void* Model::activation(std::size_t index) const {
  if (index > 0 && opens_block(index - 1)) --index;  // blocks do not nest: one step back is the buffer
  return index == 0 && converted_input_.data != nullptr ? converted_input_.data : activations_[index].data;
}

void Model::bind_residual_blocks() {
  std::int64_t widest = 0;
  for (const ResidualBlock& block : blocks_) widest = std::max(widest, layers_[block.open]->output_width());
  if (buffers_.training && widest > 0) {
    const std::size_t bytes =
        static_cast<std::size_t>(buffers_.max_rows * widest) * dtype_size(buffers_.activation_dtype);
    skip_gradient_ = BackendBuffer(backend_, bytes);
    memory_.activations += bytes;
  }
  for (const ResidualBlock& block : blocks_) {
    static_cast<nn_detail::ResidualOpen&>(*layers_[block.open]).bind_skip_gradient(skip_gradient_.data);
    static_cast<nn_detail::ResidualClose&>(*layers_[block.close])
        .bind_block(activation(block.open), skip_gradient_.data);
  }
}

Model::~Model() = default;

TensorView Model::working_copy() const {
  return {working_.data, buffers_.activation_dtype, working_.data != nullptr ? parameter_count_ : 0, 1};
}

void Model::initialize(std::uint64_t seed) {
  Initialization init{init_scheme_};
  if (residual_branches_ > 0) init.projection_std = init.std / std::sqrt(static_cast<double>(residual_branches_));
  // Initialise in fp32 on the host (the generator's output is fp32), then convert to the master dtype.
  std::vector<float> host(static_cast<std::size_t>(parameter_count_));
  // A layer initialises its tensors back to back: into a contiguous block, then into their (padded) places; a tied
  // tensor keeps its owner's values.
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::int64_t total = 0;
    for (const TensorSlot& slot : slots_[i]) total += slot.count;
    std::vector<float> block(static_cast<std::size_t>(total));
    layers_[i]->initialize(block.data(), seed, static_cast<std::uint32_t>(i), init);
    std::int64_t from = 0;
    for (const TensorSlot& slot : slots_[i]) {
      if (!slot.tied) std::copy_n(block.begin() + from, slot.count, host.begin() + slot.offset);
      from += slot.count;
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
    const TensorView y{activation(i + 1), dtype, context.rows, layers_[i]->output_width()};
    if (folded_[i]) {
      Activation kind{};
      float alpha = 0.0f;
      layers_[i + 1]->activation(&kind, &alpha);
      const TensorView activated{activation(i + 2), dtype, context.rows, layers_[i + 1]->output_width()};
      if (layers_[i]->forward_activated(context, layer_input(i, context.rows), y, activated, kind, alpha)) {
        ++i;
        continue;
      }
    }
    if (adds_residual_[i]) {
      const ResidualBlock& block = *std::find_if(
          blocks_.begin(), blocks_.end(), [i](const ResidualBlock& candidate) { return candidate.close == i + 1; });
      const TensorView skip{activation(block.open), dtype, context.rows, layers_[i]->output_width()};
      const TensorView sum{activation(i + 2), dtype, context.rows, layers_[i]->output_width()};
      if (layers_[i]->forward_residual(context, static_cast<std::uint32_t>(i), layer_input(i, context.rows), skip,
                                       sum)) {
        ++i;  // the closing marker's add is done
        continue;
      }
      HPCTRAIN_ASSERT(activation(i + 1) != nullptr, "layer '" << layers_[i]->name() << "' has no residual path");
    }
    layers_[i]->forward(context, static_cast<std::uint32_t>(i), layer_input(i, context.rows), y);
  }
  return output(context.rows);
}

TensorView Model::output(std::int64_t rows) const {
  return {activation(layers_.size()), buffers_.activation_dtype, rows, output_width()};
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
    const TensorView y{activation(i + 1), dtype, context.rows, layer.output_width()};
    Activation kind{};
    float alpha = 0.0f;
    // A folded relu's input (the pre-activation) may hold something else: its derivative is read from its output.
    const bool folded_relu = i > 0 && folded_[i - 1] && layer.activation(&kind, &alpha) && kind == Activation::relu;
    const TensorView x = folded_relu ? y : layer_input(i, context.rows);
    TensorView dx{nullptr, dtype, context.rows, layer.input_width()};
    if (layer.in_place_backward()) {
      dx.data = dy.data;
    } else if (!(i == 0 && layer.skips_input_gradient())) {  // the model's input needs no gradient
      dx.data = dy.data == scratch_[0].data ? scratch_[1].data : scratch_[0].data;
    }
    // A linear layer after a folded pair runs that pair's activation backward in its input-gradient product (CUDA:
    // DRELU/DGELU epilogues reading what the pair's forward left in the pre-activation buffer).
    if (i >= 2 && folded_[i - 2] && layers_[i - 1]->activation(&kind, &alpha)) {
      const TensorView pre{activation(i - 1), dtype, context.rows, layers_[i - 2]->output_width()};
      if (layer.backward_activated(context, x, dy, dx, accumulate, kind, alpha, pre, layer_input(i, context.rows))) {
        HPCTRAIN_ASSERT(parameter_begin_[i] == parameter_begin_[i - 1], "an activation layer with parameters");
        if (after_layer && parameter_begin_[i + 1] > parameter_begin_[i]) after_layer(parameter_begin_[i]);
        dy = dx;
        --i;  // the activation's backward is done
        continue;
      }
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
    const TensorView x{activation(i), dtype, count, in}, y{activation(i + 1), dtype, count, out};
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
  std::size_t name_width = 16;  // wider for long names (a residual block's layers: residual1.linear0)
  for (const auto& layer : layers_) name_width = std::max(name_width, layer->name().size() + 2);
  const auto width = static_cast<int>(name_width);
  os << "  " << std::left << std::setw(width) << "layer" << std::setw(16) << "type" << std::setw(24) << "output"
     << "parameters\n";
  os << "  " << std::setw(width) << "input" << std::setw(16) << "" << std::setw(24) << batch_shape_text(input_shape_)
     << "\n";
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    os << "  " << std::setw(width) << layer.name() << std::setw(16) << layer.type() << std::setw(24)
       << batch_shape_text(layer.output_shape()) << layer_parameters(i) << "\n";
  }
  os << "  total parameters: " << trainable_parameters_;
  if (padded_)
    os << " (tensors at " << parameter_alignment_ << "-byte offsets: flat buffers of " << parameter_count_
       << " elements)";
  for (std::size_t i = 0; i < layers_.size(); ++i)
    if (const std::size_t owner = tied_owner(i); owner < i)
      os << "\n  layer '" << layers_[i]->name() << "' uses the table of '" << layers_[owner]->name()
         << "' as its weight (tied: one parameter)";
  if (const auto pairs = std::count(folded_.begin(), folded_.end(), true); pairs > 0)
    os << "\n  " << pairs
       << " linear + activation pair(s) run as one product each (the activation in the product's epilogue, its "
          "backward in the next linear layer's when there is one)";
  if (const std::string loss = loss_->options_text(); !loss.empty()) os << "\n  loss: " << loss;
  if (layout_ == SpatialLayout::channels_last) {
    // In a model on images the layer that starts a sequence is a to_sequence, which reads the layout directly.
    const bool to_sequence =
        std::any_of(layers_.begin(), layers_.end(), [](const auto& layer) { return layer->starts_sequence(); });
    os << "\n  conv layers run channels-last (the " << backend_.name()
       << " backend's fastest layout): each batch is converted on the way in"
       << (to_sequence ? "; to_sequence reads them as they are" : " and at flatten");
  }
  return os.str();
}

}  // namespace hpctrain
