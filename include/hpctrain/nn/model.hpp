// A sequential model over flat buffers: one allocation each for the master parameters, their gradients, the 16-bit
// working copy, the activations of every layer and the backward scratch, all made at set-up for the largest batch.
// Parameters are laid out layer after layer in forward order (each tensor at the backend's alignment, zeros between),
// so the backward pass completes a suffix of the gradient buffer after each layer: that is what lets gradient buckets
// be all-reduced while backward goes on. Convolutional models on a backend that prefers channels-last activations (the
// CPU backend) run their conv stack in that layout: the input batch is converted once per step into its own buffer,
// flatten converts back, and nothing in between is reordered. Checkpoints, data files and outputs keep PyTorch's
// channels-first layout.
// A residual block (deck: {type = "residual", layers = [...]}) is flattened into this sequence: an opening marker
// named after the block, its branch's layers named "<block>.<layer>" (e.g. residual1.linear0: the names in summaries
// and checkpoints), and a closing marker (type "add") that adds the block's input to the branch's output
// (nn/residual_markers.hpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hpctrain/kernels/backend_buffer.hpp"
#include "hpctrain/nn/layer.hpp"
#include "hpctrain/nn/loss.hpp"

namespace hpctrain {

struct ModelSection;

struct ModelBuffers {
  DType activation_dtype = DType::f32;  // storage of activations and their gradients (16-bit in mixed precision)
  DType master_dtype = DType::f32;      // parameters, gradients, optimizer state
  std::int64_t max_rows = 0;            // largest batch this model will see (per rank)
  bool training = true;                 // false (inference): no gradient buffer, no backward scratch
  // Byte alignment of each parameter tensor in the flat buffers; 0: the backend's (Backend::parameter_alignment).
  std::size_t parameter_alignment = 0;
  // Incremental decoding (hpctrain generate, max_rows 1): the caches of the layers that keep state per position.
  bool decoding = false;
};

// A parameter tensor as stored in the flat buffer, for checkpoints and summaries.
struct ParameterEntry {
  std::string layer;
  std::string layer_type;
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;
  std::int64_t count = 0;
};

// Bytes of backend memory the model allocated, by purpose (the backend's own workspaces are not included).
struct ModelMemory {
  std::size_t parameters = 0;    // master parameters (padding included)
  std::size_t gradients = 0;     // their gradients (training only)
  std::size_t working_copy = 0;  // the 16-bit copy the products read (bf16/fp16)
  std::size_t activations = 0;   // every layer's input and the output, backward scratch, saved statistics and
                                 // activations (attention's qkv), an embedding model's token ids; all proportional
                                 // to ModelBuffers::max_rows
};

class Model {
 public:
  // Layers from the deck; input_shape is one sample's shape from the data ((F), (C, H, W), (C, D, H, W)); layer
  // shapes are inferred from it and checked (InputError naming the deck position and layer). deck_path names the deck
  // for error messages.
  Model(const ModelSection& spec, const SampleShape& input_shape, Backend& backend, ModelBuffers buffers,
        const std::string& deck_path);
  // Flat feature vectors of input_width features.
  Model(const ModelSection& spec, std::int64_t input_width, Backend& backend, ModelBuffers buffers,
        const std::string& deck_path)
      : Model(spec, SampleShape{input_width}, backend, buffers, deck_path) {}
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  [[nodiscard]] std::int64_t input_width() const { return input_width_; }
  [[nodiscard]] const SampleShape& input_shape() const { return input_shape_; }
  [[nodiscard]] std::int64_t output_width() const { return layers_.back()->output_width(); }
  // Elements of each flat buffer (parameters, gradients, optimizer state), padding between tensors included.
  [[nodiscard]] std::int64_t parameter_count() const { return parameter_count_; }
  // The model's parameters (the sum of the tensors' sizes).
  [[nodiscard]] std::int64_t trainable_parameters() const { return trainable_parameters_; }
  [[nodiscard]] const std::vector<ParameterEntry>& parameter_entries() const { return entries_; }
  [[nodiscard]] const ModelBuffers& buffers() const { return buffers_; }
  [[nodiscard]] const ModelMemory& memory() const { return memory_; }
  [[nodiscard]] std::size_t layer_count() const { return layers_.size(); }
  [[nodiscard]] const Layer& layer(std::size_t index) const { return *layers_[index]; }
  // Element offset of the first parameter of layer `index` (or of the next layer that has parameters).
  [[nodiscard]] std::int64_t parameter_begin(std::size_t index) const { return parameter_begin_[index]; }

  // Flat buffers in backend memory.
  [[nodiscard]] void* master() const { return master_.data; }
  [[nodiscard]] void* gradients() const { return gradients_.data; }
  [[nodiscard]] TensorView working_copy() const;  // data == nullptr when the matrix products read the master directly

  // Initialisation from the counter-based generator as model.init says (PyTorch's defaults, or GPT-2's scheme),
  // identical for every rank count.
  void initialize(std::uint64_t seed);
  // Refresh the 16-bit working copy from the master parameters (the optimizer does this itself after each step).
  void refresh_working_copy();

  // The input batch buffer to fill: (rows, input_width) in the activation dtype.
  [[nodiscard]] TensorView input(std::int64_t rows) const;
  // A model whose first layer is an embedding reads token ids instead: the buffer to fill with (rows, T) int32 ids
  // (backend memory); null for other models.
  [[nodiscard]] std::int32_t* token_ids() const { return token_ids_.as<std::int32_t>(); }
  // Positions scored per sample: T when the output is a sequence (T, classes) after an embedding (the loss and its
  // answers then cover rows * T rows), 1 otherwise.
  [[nodiscard]] std::int64_t positions() const { return positions_; }
  // Classes (outputs) per scored position: output_width() / positions().
  [[nodiscard]] std::int64_t classes() const { return output_width() / positions_; }
  // Forward over context.rows rows of input(); returns the output (rows, output_width).
  TensorView forward(const StepContext& context);
  // The output of the last forward pass, (rows, output_width).
  [[nodiscard]] TensorView output(std::int64_t rows) const;
  // The model's loss (deck: model.loss) and the buffer the batch's answers are uploaded into.
  [[nodiscard]] const Loss& loss() const { return *loss_; }
  // sums += the loss of the last forward pass over `rows` rows; with gradient_scale (backend memory), the loss
  // gradient times *gradient_scale is written over the output, where backward() starts.
  void apply_loss(std::int64_t rows, const float* gradient_scale, LossSums* sums);
  // Backward from the gradient of the loss with respect to the output, which apply_loss wrote over the output.
  // after_layer(begin) is called when every parameter gradient at [begin, parameter_count) is final.
  void backward(const StepContext& context, bool accumulate, const std::function<void(std::int64_t)>& after_layer);

  // ---- incremental decoding (hpctrain generate; one sample, row 0 of token_ids()) ----
  // The first layer that cannot run a few positions at a time on this backend (null when every layer can).
  [[nodiscard]] const Layer* layer_without_incremental_decoding() const;
  // Positions [first, first + count) of sample 0, whose ids the caller wrote to token_ids(); the layers' caches hold
  // positions [0, first) from earlier calls (so a sequence is decoded as one call for the prompt, then one per new
  // token). Returns the logits (count, classes()). Needs ModelBuffers::decoding and
  // layer_without_incremental_decoding() == null.
  TensorView forward_positions(const StepContext& context, std::int64_t first, std::int64_t count);

  // A printed summary: layer, type, output shape, parameters.
  [[nodiscard]] std::string summary() const;
  // How the conv layers hold their samples: channels-last when the backend prefers it and the model allows it.
  [[nodiscard]] SpatialLayout spatial_layout() const { return layout_; }

 private:
  void build_layers(const ModelSection& spec, const std::string& deck_path, SpatialLayout layout);
  // Appends one layer built from its deck entry (location: for messages); shape and sequence describe what flows
  // into it and are updated to what flows out.
  void add_layer(const LayerSpec& spec, const std::string& location, SpatialLayout layout, SampleShape& shape,
                 bool& sequence);
  void add_residual_block(const LayerSpec& spec, const std::string& location, const std::string& deck_path,
                          SpatialLayout layout, SampleShape& shape, bool& sequence);
  // Gives the residual blocks' markers the block input and the skip gradient buffer (allocated here).
  void bind_residual_blocks();
  [[nodiscard]] bool opens_block(std::size_t index) const;
  // The data of activation `index` (the input of layer index; index == layer_count(): the output). An opening marker's
  // output is its input: both are one buffer.
  [[nodiscard]] void* activation(std::size_t index) const;
  [[nodiscard]] bool channels_last_pays_off() const;
  // What layer `index` reads: the previous layer's output, or for layer 0 the input (converted, if channels-last).
  [[nodiscard]] TensorView layer_input(std::size_t index, std::int64_t rows) const;
  [[nodiscard]] std::int64_t layer_parameters(std::size_t index) const;
  // The index of the layer whose first tensor layer `index` ties to (Layer::tied_layer); layer_count() when none.
  [[nodiscard]] std::size_t tied_owner(std::size_t index) const;
  void check_tie(std::size_t index, const std::string& location) const;

  Backend& backend_;
  ModelBuffers buffers_;
  SampleShape input_shape_;
  std::int64_t input_width_;
  InitScheme init_scheme_;
  // Residual branches of the model (GPT-2: 2 x layers); gpt2 draws the weights of their output projections (the layers
  // marked Layer::residual_output) from normal(0, 0.02 / sqrt(residual_branches_)).
  std::size_t residual_branches_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParameterEntry> entries_;
  std::vector<std::int64_t> parameter_begin_;
  // Per layer, per ParameterSpec: where the tensor lives; tied: another layer's tensor (the layer's own values unused).
  struct TensorSlot {
    std::int64_t offset = 0, count = 0;
    bool tied = false;
  };
  std::vector<std::vector<TensorSlot>> slots_;
  std::int64_t parameter_count_ = 0;
  std::int64_t trainable_parameters_ = 0;
  bool padded_ = false;  // some tensor starts after a gap (see the constructor)
  std::size_t parameter_alignment_ = 0;
  BackendBuffer master_, gradients_, working_;
  SpatialLayout layout_ = SpatialLayout::channels_first;
  // activations_[i]: input of layer i; activations_[L]: the output; empty after an opening marker (see activation())
  std::vector<BackendBuffer> activations_;
  BackendBuffer converted_input_;  // channels-last: the input batch in that layout (layer 0 reads it)
  BackendBuffer token_ids_;        // (max_rows, T) int32: an embedding model's input
  std::int64_t positions_ = 1;
  BackendBuffer saved_;               // per-row statistics of layers that keep them
  BackendBuffer saved_activations_;   // activations layers keep for their backward (attention's qkv)
  BackendBuffer backward_workspace_;  // one layer's backward scratch at a time (attention's dqkv), training only
  BackendBuffer scratch_[2];          // backward ping-pong buffers (max_rows, widest layer)
  std::unique_ptr<Loss> loss_;
  ModelMemory memory_;
  // folded_[i]: layer i (linear) runs layer i + 1 (an activation the backend folds into the product) in its forward,
  // and that activation's backward reads its own output (see Backend::fuses_linear_activation).
  std::vector<bool> folded_;
  // adds_residual_[i]: layer i ends a residual branch (layer i + 1 closes it) and writes the block's sum in its forward
  // (Layer::forward_residual); its own output buffer is then not kept (except when decoding, which runs unfused).
  std::vector<bool> adds_residual_;
  // Residual blocks: layers_[open] and layers_[close] are a block's markers, its branch lies between them.
  struct ResidualBlock {
    std::size_t open = 0, close = 0;
  };
  std::vector<ResidualBlock> blocks_;
  BackendBuffer skip_gradient_;  // (max_rows, widest block) the gradient that bypasses a branch (training only)
  std::vector<BackendBuffer> decoding_caches_;  // per layer: (T, decoding_cache_per_position()) when decoding
};

}  // namespace hpctrain
