// A layer of a sequential model. Layers own no memory: the Model hands them views into its flat parameter, gradient and
// activation buffers, and they call the Backend for all arithmetic.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpctrain/config/choices.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

struct LayerSpec;

// What a layer needs to know about the step it is running in.
struct StepContext {
  Backend* backend = nullptr;
  bool training = true;
  std::uint64_t seed = 0;
  std::uint32_t step = 0;                    // optimizer step (keys dropout masks)
  const std::int64_t* sample_ids = nullptr;  // (rows) global sample index of each row, backend memory
  std::int64_t rows = 0;                     // samples in this (possibly partial) batch
};

// A named parameter tensor with PyTorch's shape (linear weight: out x in).
struct ParameterSpec {
  std::string name;  // "weight", "bias"
  std::vector<std::int64_t> shape;
};

// Where a layer's parameters live: element offsets into the model's flat buffers, one per ParameterSpec.
struct ParameterBinding {
  void* master = nullptr;     // fp32 master parameters (f64 in gradient checks)
  void* gradients = nullptr;  // same dtype and layout as master
  void* working = nullptr;    // 16-bit working copy for matrix products; == master when no copy is kept
  DType master_dtype = DType::f32;
  DType working_dtype = DType::f32;
  std::vector<std::int64_t> offsets;
  // Per parameter (may be shorter than offsets: false beyond): the tensor is also a later layer's (a tied weight),
  // whose backward runs first and writes its gradient slot, so this layer always adds into it.
  std::vector<bool> shared;
};

// How Model::initialize asks a layer to fill its parameters (deck: model.init). pytorch: each layer's PyTorch default.
// gpt2 (GPT-2's _init_weights): linear and embedding weights (the position table too) normal(0, std), biases 0,
// normalisation layers weight 1 and bias 0; a residual output projection (Layer::residual_output) normal(0,
// projection_std), std / sqrt(the model's residual branches), GPT-2's 1 / sqrt(2 x layers). Layers without a GPT-2
// form (convolutions) keep their PyTorch default.
struct Initialization {
  InitScheme scheme = InitScheme::pytorch;
  double std = 0.02;
  double projection_std = 0.02;
};

// One sample's shape without the batch axis: (F) for feature vectors, (C, H, W) for images, (C, D, H, W) for volumes.
// A sample is one activation row, stored in this shape's row-major (NCHW / NCDHW) order, or channels-last inside the
// conv stack of a model on a backend that prefers it (see Model).
using SampleShape = std::vector<std::int64_t>;
[[nodiscard]] std::int64_t shape_size(const SampleShape& shape);       // elements of one sample
[[nodiscard]] std::string batch_shape_text(const SampleShape& shape);  // "(N, 8, 14, 14)"

// How a layer takes part in incremental decoding (hpctrain generate: one sample, a few new positions per call, see
// Model::forward_positions).
enum class IncrementalDecoding {
  unsupported,    // the generator recomputes the whole window with forward() for every new token
  position_wise,  // each position's output depends on that position's input only (linear and layernorm on the last
                  // axis of a sequence, activations, dropout at inference): forward() on the new positions' rows
  own,            // forward_positions(): the embedding (the absolute position index), attention (cached keys/values)
};

class Layer {
 public:
  Layer(std::string name, SampleShape input_shape, SampleShape output_shape)
      : name_(std::move(name)),
        input_shape_(std::move(input_shape)),
        output_shape_(std::move(output_shape)),
        input_width_(shape_size(input_shape_)),
        output_width_(shape_size(output_shape_)) {}
  Layer(std::string name, std::int64_t input_width, std::int64_t output_width)
      : Layer(std::move(name), SampleShape{input_width}, SampleShape{output_width}) {}
  virtual ~Layer() = default;

  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] virtual std::string type() const = 0;
  [[nodiscard]] std::int64_t input_width() const { return input_width_; }
  [[nodiscard]] std::int64_t output_width() const { return output_width_; }
  [[nodiscard]] const SampleShape& input_shape() const { return input_shape_; }
  [[nodiscard]] const SampleShape& output_shape() const { return output_shape_; }
  // Whether backward() can skip the input gradient when this is the model's first layer (dx.data == nullptr).
  [[nodiscard]] virtual bool skips_input_gradient() const { return false; }

  [[nodiscard]] virtual std::vector<ParameterSpec> parameters() const { return {}; }
  // Linear with `tie`: the name of the earlier layer (an embedding) whose first parameter is also this layer's first
  // parameter (one tensor, bound to both; its initialisation is the owner's). Empty: every parameter is the layer's
  // own.
  [[nodiscard]] virtual const std::string& tied_layer() const {
    static const std::string none;
    return none;
  }
  void bind(ParameterBinding binding) { binding_ = std::move(binding); }
  // Fill the master parameters (host memory, the layer's tensors back to back in parameters() order) as `init` says;
  // each tensor draws from its own counter-based stream, so the values do not depend on the rank count.
  virtual void initialize(float* /*host_master*/, std::uint64_t /*seed*/, std::uint32_t /*layer_index*/,
                          const Initialization& /*init*/) const {}
  // Whether the layer ends a residual branch with a projection (the model marks them; gpt2 scales their weights).
  // Whether the layer's output comes from a weight matrix (linear, attention's c_proj): the projection that GPT-2's
  // initialisation scales when it ends a residual branch.
  [[nodiscard]] virtual bool ends_with_projection() const { return false; }
  [[nodiscard]] bool residual_output() const { return residual_output_; }
  void set_residual_output(bool value) { residual_output_ = value; }
  // Per-row statistics kept between forward and backward (layernorm), in master elements per row.
  [[nodiscard]] virtual std::int64_t saved_per_row() const { return 0; }
  // saved: (saved_per_row, max_rows) master elements reserved for this layer.
  void bind_saved(void* saved, std::int64_t max_rows) {
    saved_ = saved;
    saved_max_rows_ = max_rows;
  }
  // Activations kept from forward to backward besides the layer's input and output (attention: its qkv projection
  // and the heads' output), in activation-dtype elements per row, reserved by the Model for max_rows rows.
  [[nodiscard]] virtual std::int64_t saved_activations_per_row() const { return 0; }
  // Scratch the backward needs (attention: the gradients of qkv and of the heads' output), in activation-dtype elements
  // per row: one buffer for max_rows rows, shared by every layer (backward runs one layer at a time); training only.
  [[nodiscard]] virtual std::int64_t backward_workspace_per_row() const { return 0; }
  // saved: (saved_activations_per_row, max_rows) elements; workspace: (backward_workspace_per_row, max_rows) elements
  // or null (a model built for inference). max_rows as bind_saved's.
  void bind_activation_storage(void* saved, void* workspace, std::int64_t max_rows) {
    saved_activations_ = saved;
    backward_workspace_ = workspace;
    saved_max_rows_ = max_rows;
  }

  // y = layer(x); x: (rows, input_width), y: (rows, output_width), both in the activation dtype.
  virtual void forward(const StepContext& context, std::uint32_t layer_index, const TensorView& x,
                       const TensorView& y) = 0;
  // dx = d loss / dx; parameter gradients written (or added, when accumulate) into the gradient buffer.
  // x and y are the forward's input and output; dx may alias dy for element-wise layers (see in_place_backward).
  virtual void backward(const StepContext& context, std::uint32_t layer_index, const TensorView& x, const TensorView& y,
                        const TensorView& dy, const TensorView& dx, bool accumulate) = 0;
  // Embedding: the layer reads the batch's int32 token ids (rows, T), bound by the model, not its activation input.
  [[nodiscard]] virtual bool reads_token_ids() const { return false; }
  virtual void bind_token_ids(const std::int32_t* /*ids*/) {}
  // Whether the layer's output (T, C) is a sequence the layers after it act on per position (the embedding,
  // to_sequence); the sequence lasts until a layer's output is not (T, C) (sequence_pool, flatten).
  [[nodiscard]] virtual bool starts_sequence() const { return false; }
  // Incremental decoding (see IncrementalDecoding). The model runs a layer's new positions only when every layer
  // of the model supports it on its backend; otherwise it recomputes the window.
  [[nodiscard]] virtual IncrementalDecoding incremental_decoding(const Backend& /*backend*/) const {
    return IncrementalDecoding::unsupported;
  }
  // Elements (activation dtype) kept per position of the decoded sample between calls (attention: its keys and
  // values); the model allocates a (T, this) cache for the layer when it is built for decoding.
  [[nodiscard]] virtual std::int64_t decoding_cache_per_position() const { return 0; }
  // IncrementalDecoding::own: positions [first, first + x.rows) of one sample. x: (count, input features per
  // position), y: (count, output features per position); cache: this layer's (T, decoding_cache_per_position())
  // buffer, whose rows [0, first) earlier calls wrote (null when the layer keeps nothing).
  virtual void forward_positions(const StepContext& context, std::uint32_t layer_index, std::int64_t first,
                                 const TensorView& x, const TensorView& y, void* cache);
  // Whether an output position reads the inputs of later positions (a non-causal attention): such a model cannot
  // generate text one position after another.
  [[nodiscard]] virtual bool reads_later_positions() const { return false; }
  // Convolution, pooling and groupnorm: they need the backend's spatial operations.
  [[nodiscard]] virtual bool uses_spatial_operations() const { return false; }
  // Element-wise layers may write dx over dy, saving a buffer swap.
  [[nodiscard]] virtual bool in_place_backward() const { return false; }
  // Whether the layer computes the same thing on channels-last samples: the spatial layers and flatten, built for a
  // layout, and element-wise layers without parameters. (Linear or layernorm on an image would not: their parameters
  // are per channels-first position.)
  [[nodiscard]] virtual bool takes_any_layout() const { return false; }
  // An element-wise activation layer's function (kind, alpha); false for every other layer.
  [[nodiscard]] virtual bool activation(Activation* /*kind*/, float* /*alpha*/) const { return false; }
  // Whether forward_activated can run this layer together with the activation layer after it (linear).
  [[nodiscard]] virtual bool takes_activation() const { return false; }
  // Linear: y = f(layer(x)) in one backend call (Backend::linear_activation_forward), pre = layer(x) unless the
  // backend fuses f. False (nothing done): the layer has no such path.
  virtual bool forward_activated(const StepContext& /*context*/, const TensorView& /*x*/, const TensorView& /*pre*/,
                                 const TensorView& /*y*/, Activation /*kind*/, float /*alpha*/) {
    return false;
  }
  // Linear and attention at the end of a residual branch: y = layer(x) + skip in one call, the block's add in the
  // output projection (Backend::linear_residual_forward; skip: the block's input, y's shape, not aliasing y). False
  // (nothing done): the layer has no such path. The backward is the layer's usual one (it does not read y).
  virtual bool forward_residual(const StepContext& /*context*/, std::uint32_t /*layer_index*/, const TensorView& /*x*/,
                                const TensorView& /*skip*/, const TensorView& /*y*/) {
    return false;
  }
  // Linear: backward with the input gradient multiplied by f' of the activation (kind, alpha) this layer reads, run
  // by the linear layer before it with forward_activated: pre and activated are that activation's input and output
  // (Backend::linear_activation_backward). False (nothing done): the layer has no such path.
  virtual bool backward_activated(const StepContext& /*context*/, const TensorView& /*x*/, const TensorView& /*dy*/,
                                  const TensorView& /*dx*/, bool /*accumulate*/, Activation /*kind*/, float /*alpha*/,
                                  const TensorView& /*pre*/, const TensorView& /*activated*/) {
    return false;
  }

 protected:
  [[nodiscard]] void* master(std::size_t index) const { return offset(binding_.master, binding_.master_dtype, index); }
  [[nodiscard]] void* gradient(std::size_t index) const {
    return offset(binding_.gradients, binding_.master_dtype, index);
  }
  [[nodiscard]] void* working(std::size_t index) const {
    return offset(binding_.working, binding_.working_dtype, index);
  }
  [[nodiscard]] DType master_dtype() const { return binding_.master_dtype; }
  // Whether the backward adds into parameter `index`'s gradient: when told to (micro-batches), or always for a tensor
  // a later layer shares (see ParameterBinding::shared).
  [[nodiscard]] bool accumulates(std::size_t index, bool accumulate) const {
    return accumulate || (index < binding_.shared.size() && binding_.shared[index]);
  }
  [[nodiscard]] DType working_dtype() const { return binding_.working_dtype; }
  [[nodiscard]] void* saved_activations() const { return saved_activations_; }
  [[nodiscard]] void* backward_workspace() const { return backward_workspace_; }
  [[nodiscard]] std::int64_t saved_max_rows() const { return saved_max_rows_; }
  // Row block `block` of the saved statistics: (max_rows) master elements.
  [[nodiscard]] void* saved(std::int64_t block) const {
    return static_cast<char*>(saved_) + block * saved_max_rows_ * static_cast<std::int64_t>(dtype_size(master_dtype()));
  }

 private:
  [[nodiscard]] void* offset(void* base, DType dtype, std::size_t index) const {
    return static_cast<char*>(base) + binding_.offsets.at(index) * static_cast<std::int64_t>(dtype_size(dtype));
  }
  std::string name_;
  SampleShape input_shape_, output_shape_;
  std::int64_t input_width_, output_width_;
  ParameterBinding binding_;
  void* saved_ = nullptr;
  std::int64_t saved_max_rows_ = 0;
  void* saved_activations_ = nullptr;
  void* backward_workspace_ = nullptr;
  bool residual_output_ = false;
};

// Build a layer from its deck entry; input_shape is what flows into it (one sample), in `layout` order (spatial layers
// and flatten only; the model decides). sequence: input_shape is (T, C), a sequence of T positions (an embedding's
// or a to_sequence's output), and linear and layernorm act on its last axis (the batch seen as rows * T rows of C).
// Throws InputError for impossible shapes, naming deck_location ("deck.toml:12:1"), the layer and what to change.
std::unique_ptr<Layer> make_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                  const std::string& deck_location,
                                  SpatialLayout layout = SpatialLayout::channels_first, bool sequence = false);

}  // namespace hpctrain
