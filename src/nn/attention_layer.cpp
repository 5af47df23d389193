// Multi-head self-attention on a sequence (T, C), GPT-2's block: the packed projection qkv = x W_attn^T + b_attn
// (c_attn, W_attn (3C, C)), the backend's fused attention per (sequence, head), and the output projection
// y = a W_proj^T + b_proj (c_proj, W_proj (C, C)). The products read the working copy of the weights, as Linear does.
#include <algorithm>
#include <cmath>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "layer_internal.hpp"

namespace hpctrain {

namespace {

using nn_detail::last_axis;
using nn_detail::matrix;

class Attention final : public Layer {
 public:
  Attention(std::string name, const SampleShape& shape, std::int64_t heads, bool causal)
      : Layer(std::move(name), shape, shape),
        sequence_(shape.front()),
        width_(shape.back()),
        heads_(heads),
        causal_(causal) {}
  [[nodiscard]] std::string type() const override { return "attention"; }
  [[nodiscard]] bool ends_with_projection() const override { return true; }

  // Named as GPT-2's modules (checkpoints hold /model/<layer>/c_attn.weight ...: PyTorch's <layer>.c_attn.weight).
  [[nodiscard]] std::vector<ParameterSpec> parameters() const override {
    return {{"c_attn.weight", {3 * width_, width_}},
            {"c_attn.bias", {3 * width_}},
            {"c_proj.weight", {width_, width_}},
            {"c_proj.bias", {width_}}};
  }
  // pytorch: nn.Linear's default for both projections; both have fan_in C, so one call draws the four tensors (each
  // from its own stream, as a linear layer's weight and bias). gpt2: weights normal(0, std), c_proj's at the
  // residual projections' std when the layer ends a residual branch (as in a transformer_block), biases 0.
  void initialize(float* host_master, std::uint64_t seed, std::uint32_t layer_index,
                  const Initialization& init) const override {
    if (init.scheme == InitScheme::pytorch)
      return nn_detail::fill_uniform(host_master, parameters(), seed, layer_index, width_);
    const std::int64_t c = width_;
    nn_detail::fill_normal(host_master, 3 * c * c, seed, nn_detail::init_stream(layer_index, 0), init.std);
    std::fill_n(host_master + 3 * c * c, 3 * c, 0.0f);
    nn_detail::fill_normal(host_master + 3 * c * c + 3 * c, c * c, seed, nn_detail::init_stream(layer_index, 2),
                           residual_output() ? init.projection_std : init.std);
    std::fill_n(host_master + 4 * c * c + 3 * c, c, 0.0f);
  }

  // The row log-sum-exp of each (head, position): master elements (f32, or f64 with f64 storage: what the kernel
  // writes fits).
  [[nodiscard]] std::int64_t saved_per_row() const override { return heads_ * sequence_; }
  // qkv (T, 3C) and the heads' output (T, C).
  [[nodiscard]] std::int64_t saved_activations_per_row() const override { return 4 * sequence_ * width_; }
  // their gradients
  [[nodiscard]] std::int64_t backward_workspace_per_row() const override { return 4 * sequence_ * width_; }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    Backend& backend = *context.backend;
    const TensorView qkv = packed(saved_activations(), x.dtype, x.rows);
    const TensorView heads = heads_output(saved_activations(), x.dtype, x.rows);
    // (rows T, 3C) = (rows T, C) x W_attn^T (C, 3C) + b_attn
    backend.gemm(last_axis(x, width_), false, weight(0, 3 * width_), true, qkv, master(1), false);
    backend.attention_forward(geometry(x.rows), qkv, heads, saved(0));
    // (rows T, C) = (rows T, C) x W_proj^T + b_proj
    backend.gemm(heads, false, weight(2, width_), true, last_axis(y, width_), master(3), false);
  }

  // Incremental decoding (hpctrain generate): the keys and values of past positions stay in the model's (T, 2C)
  // cache in backend memory, each new position's query attends over them (Backend::cached_attention, on either
  // backend). A non-causal attention cannot decode at all.
  [[nodiscard]] IncrementalDecoding incremental_decoding(const Backend&) const override {
    return causal_ ? IncrementalDecoding::own : IncrementalDecoding::unsupported;
  }
  [[nodiscard]] std::int64_t decoding_cache_per_position() const override { return 2 * width_; }
  [[nodiscard]] bool reads_later_positions() const override { return !causal_; }
  // x, y: (count, C), positions [first, first + count) of sample 0.
  void forward_positions(const StepContext& context, std::uint32_t, std::int64_t first, const TensorView& x,
                         const TensorView& y, void* cache) override {
    Backend& backend = *context.backend;
    const std::int64_t count = x.rows;
    const TensorView qkv = matrix(saved_activations(), x.dtype, count, 3 * width_);  // (count, 3C)
    const TensorView heads{heads_output(saved_activations(), x.dtype, 1).data, x.dtype, count, width_};
    backend.gemm(x, false, weight(0, 3 * width_), true, qkv, master(1), false);
    // appends the new positions' k and v to the cache, then attends
    backend.cached_attention(geometry(1), qkv, cache, first, heads);
    backend.gemm(heads, false, weight(2, width_), true, y, master(3), false);
  }

  void backward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool accumulate) override {
    HPCTRAIN_ASSERT(backward_workspace() != nullptr, "attention backward without its workspace");
    Backend& backend = *context.backend;
    const TensorView qkv = packed(saved_activations(), x.dtype, x.rows);
    const TensorView heads = heads_output(saved_activations(), x.dtype, x.rows);
    const TensorView dqkv = packed(backward_workspace(), x.dtype, x.rows);
    const TensorView dheads = heads_output(backward_workspace(), x.dtype, x.rows);
    const TensorView dy_rows = last_axis(dy, width_);
    // dW_proj (C, C) (+)= dy^T heads, db_proj (+)= column sums of dy; dheads = dy W_proj
    backend.linear_weight_gradient(dy_rows, heads, matrix(gradient(2), master_dtype(), width_, width_), gradient(3),
                                   accumulate);
    backend.gemm(dy_rows, false, weight(2, width_), false, dheads, nullptr, false);
    backend.attention_backward(geometry(x.rows), qkv, heads, dheads, saved(0), dqkv);
    // dW_attn (3C, C) (+)= dqkv^T x, db_attn (+)= column sums of dqkv; dx = dqkv W_attn
    backend.linear_weight_gradient(dqkv, last_axis(x, width_), matrix(gradient(0), master_dtype(), 3 * width_, width_),
                                   gradient(1), accumulate);
    if (dx.data != nullptr)
      backend.gemm(dqkv, false, weight(0, 3 * width_), false, last_axis(dx, width_), nullptr, false);
  }

 private:
  [[nodiscard]] AttentionGeometry geometry(std::int64_t rows) const {
    const std::int64_t head_dim = width_ / heads_;
    return {rows, sequence_, heads_, head_dim, causal_, static_cast<float>(1.0 / std::sqrt(double(head_dim)))};
  }
  // (rows T, out) working weight of parameter `index` (c_attn: out = 3C, c_proj: out = C)
  [[nodiscard]] TensorView weight(std::size_t index, std::int64_t out) const {
    return matrix(working(index), working_dtype(), out, width_);
  }
  // The storage `base` (saved activations or backward workspace) holds (max_rows T, 3C) then (max_rows T, C).
  [[nodiscard]] TensorView packed(void* base, DType dtype, std::int64_t rows) const {
    return matrix(base, dtype, rows * sequence_, 3 * width_);
  }
  [[nodiscard]] TensorView heads_output(void* base, DType dtype, std::int64_t rows) const {
    const std::int64_t offset = saved_max_rows() * sequence_ * 3 * width_;
    return matrix(static_cast<char*>(base) + offset * static_cast<std::int64_t>(dtype_size(dtype)), dtype,
                  rows * sequence_, width_);
  }
  std::int64_t sequence_, width_, heads_;  // T, C, heads
  bool causal_;
};

}  // namespace

namespace nn_detail {
std::unique_ptr<Layer> make_attention_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                            const std::string& deck_location, bool sequence) {
  HPCTRAIN_VERIFY(sequence && input_shape.size() == 2, InputError,
                  deck_location << ": layer '" << spec.name << "' (attention) receives samples of shape "
                                << batch_shape_text(input_shape) << ", not a sequence (T, C)",
                  "attention acts on the positions of a sequence: put it after an embedding or a to_sequence (and "
                  "before any flatten)");
  const std::int64_t width = input_shape.back();
  HPCTRAIN_VERIFY(width % spec.heads == 0, InputError,
                  deck_location << ": layer '" << spec.name << "' (attention) splits its width C = " << width
                                << " into heads = " << spec.heads << " heads, which does not divide it",
                  "set heads to a divisor of " + std::to_string(width) + " (or change the embedding's out)");
  if (spec.dropout > 0.0)
    throw NotSupported(deck_location + ": layer '" + spec.name +
                       "' (attention): attention dropout is not supported yet; set dropout = 0.0 or remove it");
  return std::make_unique<Attention>(spec.name, input_shape, spec.heads, spec.causal);
}
}  // namespace nn_detail

}  // namespace hpctrain
