// The kernel interface. Every compute step of training goes through one Backend; the CPU backend (loops + oneDNN) and
// the CUDA backend (own kernels + cuBLASLt) implement it, and tests compare them on the same inputs.
//
// Conventions:
// - Pointers and TensorViews refer to backend memory (host memory for the CPU backend, device memory for CUDA).
// - Matrices are row-major. Activations are (rows = samples in the batch, cols = features).
// - Storage dtypes: activations f32/bf16/f16 (or f64 in gradient checks); parameters, gradients and optimizer state are
//   f32 (f64 in gradient checks), i.e. "master" dtype. Arithmetic is fp32 (fp64 for f64 storage) whatever the storage.
// - `accumulate` means "add into the output" (gradient accumulation); otherwise the output is overwritten.
// - Scalars that change during training (loss scale, learning rate, skip flag) are read from a StepScalars in backend
//   memory, never passed by value, so a captured CUDA graph can replay a step without the host.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/core/tensor.hpp"

namespace hpctrain {

// gelu: the exact erf form (PyTorch's default); gelu_tanh: its tanh approximation (approximate = "tanh").
enum class Activation : std::uint8_t { relu, gelu, tanh, leaky_relu, gelu_tanh };

// Training scalars that live in backend memory for the whole run. Plain data: copied to the host only to log or
// checkpoint.
struct StepScalars {
  float loss_scale = 1.0f;           // current loss scale (1 when scaling is off)
  std::int32_t growth_tracker = 0;   // consecutive finite steps since the last scale change
  std::int32_t found_nonfinite = 0;  // this step: 1 if any (all-reduced) gradient is Inf/NaN -> skip the update
  std::int32_t applied_steps = 0;    // optimizer updates actually applied (AdamW bias correction)
  float learning_rate = 0.0f;        // written by the host before each step
  float grad_norm = 0.0f;            // global L2 norm of the unscaled gradients (before clipping)
  float clip_coefficient = 1.0f;     // min(1, max_norm / (grad_norm + 1e-6)), or 1 without clipping
  std::int32_t consecutive_skips = 0;
};

// Dynamic loss scaling parameters (PyTorch GradScaler semantics).
struct LossScalerConfig {
  bool enabled = false;  // false: scale stays fixed at its initial value (1 for fp32/bf16)
  bool dynamic = true;   // false: fixed scale, never changed
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::int32_t growth_interval = 2000;
};

enum class OptimizerType : std::uint8_t { sgd, adamw };

struct OptimizerHyper {
  OptimizerType type = OptimizerType::adamw;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW
  float momentum = 0.0f;                            // SGD
  bool nesterov = false;                            // SGD
  float weight_decay = 0.0f;   // decoupled for AdamW (p -= lr*wd*p); L2 added to the gradient for SGD, as in PyTorch
  float max_grad_norm = 0.0f;  // 0: no clipping
};

// Element-wise loss outputs accumulated by the loss kernels (in backend memory); the caller zeroes them.
// Double, so that sums over many batches keep their precision and f64 finite-difference checks can difference the loss.
struct LossSums {
  double loss_sum = 0.0;  // sum over rows of the per-sample loss
  double correct = 0.0;   // classification: rows whose argmax equals the label
};

// Class weights and label smoothing of the cross-entropy (model.class_weights, model.label_smoothing): PyTorch's
// CrossEntropyLoss(weight, label_smoothing). The per-row formula is kernel_math::smoothed_cross_entropy_loss.
struct CrossEntropyOptions {
  const float* class_weights = nullptr;  // (cols) in backend memory; null: every class weighs 1
  float label_smoothing = 0.0f;          // in [0, 1)
};

// How one sample of a convolutional layer is laid out in its activation row. Files and checkpoints are channels-first
// (NCHW / NCDHW, PyTorch's default); a backend may prefer channels-last (NHWC / NDHWC: the layout oneDNN's fastest
// convolutions read directly), and the model then converts each sample once on its way into the conv stack and once on
// its way out (at flatten), never between layers.
enum class SpatialLayout : std::uint8_t { channels_first, channels_last };

// The geometry of one convolution or pooling layer for a batch of samples stored as rows (each row one sample in the
// `layout` order). Spatial extents are (H, W) or (D, H, W) in the first `dimensions` entries of each array.
struct SpatialGeometry {
  int dimensions = 2;  // 2 or 3 spatial axes
  std::int64_t in_channels = 0, out_channels = 0;
  std::int64_t groups = 1;  // convolution: channel groups (weights (out, in/groups, k...))
  std::array<std::int64_t, 3> input{}, output{}, kernel{}, stride{}, padding{}, dilation{};
  SpatialLayout layout = SpatialLayout::channels_first;  // of x, y and their gradients; weights are always PyTorch's

  [[nodiscard]] std::int64_t input_size() const { return product(input); }  // spatial elements per channel
  [[nodiscard]] std::int64_t output_size() const { return product(output); }
  [[nodiscard]] std::int64_t kernel_size() const { return product(kernel); }
  bool operator==(const SpatialGeometry&) const = default;

 private:
  [[nodiscard]] std::int64_t product(const std::array<std::int64_t, 3>& extents) const {
    std::int64_t size = 1;
    for (int axis = 0; axis < dimensions; ++axis) size *= extents[static_cast<std::size_t>(axis)];
    return size;
  }
};

enum class PoolingKind : std::uint8_t { max, average };
// Pooling of a sequence into one vector (encoders): the mean over the positions, or the first position (a class token).
enum class SequencePooling : std::uint8_t { mean, first };

// Multi-head self-attention over sequences stored as rows: a batch of `batch` sequences of `sequence` positions is
// batch * sequence rows. The packed projection qkv has 3 * heads * head_dim columns per row: [q | k | v], head h at
// columns h * head_dim ... (h + 1) * head_dim - 1 of each part (PyTorch's GPT-2 c_attn layout: split, then view(B, T,
// heads, head_dim)). The output has heads * head_dim columns, the heads side by side (the input of the output
// projection).
//
// Dropout on the probabilities (training only; PyTorch's scaled_dot_product_attention(dropout_p = p)): the output is
// (P * keep / (1 - p)) V, P the undropped softmax (whose log-sum-exp is the lse), and the backward uses the same mask.
// No mask is stored: element (query i, key j) of head h of sequence b is kept when
// kernel_math::attention_dropout_keep(dropout_key(seed, step), layer, attention_dropout_index(sample_ids[b], heads, h,
// sequence, i, j), p), a pure function of (seed, step, layer, global sample index, head, query, key): every backend,
// tile size, thread count and rank count drops the same elements (see kernels/math.hpp for the contract a new kernel
// must keep).
struct AttentionDropout {
  float p = 0.0f;  // drop probability; 0: no dropout (the kernels then run exactly their plain arithmetic)
  std::uint64_t seed = 0;
  std::uint32_t step = 0, layer = 0;
  const std::int64_t* sample_ids = nullptr;  // (batch) global sample index of each sequence, backend memory
  [[nodiscard]] bool active() const { return p > 0.0f; }
  bool operator==(const AttentionDropout&) const = default;
};

struct AttentionGeometry {
  std::int64_t batch = 0, sequence = 0, heads = 1, head_dim = 0;
  bool causal = true;        // position t attends to positions <= t only
  float scale = 0.0f;        // the scores' factor, 1 / sqrt(head_dim) as in PyTorch's scaled_dot_product_attention
  AttentionDropout dropout;  // on the probabilities (training); default none
  [[nodiscard]] std::int64_t width() const { return heads * head_dim; }
  bool operator==(const AttentionGeometry&) const = default;
};

// The shapes Backend::cached_attention takes (both backends check them the same way): one causal sequence of
// geometry.sequence positions without dropout (decoding is inference), qkv (count, 3C) and out (count, C) in one
// dtype, the new positions inside the sequence.
inline void check_cached_attention(const AttentionGeometry& g, const TensorView& qkv, std::int64_t first,
                                   const TensorView& out) {
  HPCTRAIN_ASSERT(g.batch == 1 && g.causal && g.heads > 0 && g.head_dim > 0 && qkv.cols == 3 * g.width() &&
                      out.cols == g.width() && out.rows == qkv.rows && out.dtype == qkv.dtype && qkv.rows > 0 &&
                      first >= 0 && first + qkv.rows <= g.sequence && out.data != qkv.data,
                  "cached attention: qkv (" << qkv.rows << ", " << qkv.cols << "), out (" << out.rows << ", "
                                            << out.cols << "), positions [" << first << ", " << first + qkv.rows
                                            << ") of " << g.sequence << ", width " << g.width());
  HPCTRAIN_ASSERT(!g.dropout.active(), "cached attention is inference: no attention dropout");
}

// The recordings a backend keeps (CUDA graphs): the training step, and forward passes without gradients (evaluation,
// predict, evaluate), so that one does not replace the other.
enum class CaptureSlot : std::uint8_t { step, inference };

// A device's identity (CUDA: the 16-byte UUID), to tell whether two ranks drive the same GPU. All zero: no device.
using DeviceUuid = std::array<unsigned char, 16>;

class Backend {
 public:
  virtual ~Backend() = default;
  [[nodiscard]] virtual std::string name() const = 0;
  // One line for the run's log when this hardware computes 16-bit `storage` without instructions of its own (so a
  // 16-bit run saves memory but is no faster than fp32); empty when it runs natively or `storage` is not 16-bit.
  [[nodiscard]] virtual std::string precision_note(DType /*storage*/) const { return {}; }

  // ---- memory ----
  virtual void* allocate(std::size_t bytes) = 0;  // aligned to 64 bytes; contents undefined
  virtual void deallocate(void* pointer) = 0;
  virtual void copy_to_backend(void* destination, const void* host_source, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_destination, const void* source, std::size_t bytes) = 0;
  // Whether backend memory is host memory that the host may read and write directly (the CPU backend's): checkpoints
  // then write and read the model's and the optimizer's buffers in place, without host copies.
  [[nodiscard]] virtual bool memory_is_host() const { return false; }
  virtual void copy(void* destination, const void* source, std::size_t bytes) = 0;  // within backend memory
  virtual void zero(void* pointer, std::size_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- conversions ----
  // dst = src element-wise, converting dtypes (same shape).
  virtual void cast(const TensorView& source, const TensorView& destination) = 0;

  // ---- matrix products ----
  // c = op(a) * op(b) [+ bias broadcast over rows] [+ c if accumulate]; op(x) = x or x^T.
  // a, b: activations/weights of one 16-bit or f32 dtype (or f64); c: any dtype; bias: master dtype (f32 or f64),
  // length c.cols, or null. Accumulation is in fp32 (fp64 for f64).
  virtual void gemm(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b, const TensorView& c,
                    const void* bias, bool accumulate) = 0;
  // dbias[j] (+)= sum_i dy[i][j]; dbias in master dtype.
  virtual void bias_gradient(const TensorView& dy, void* dbias, DType master, bool accumulate) = 0;

  // ---- element-wise ----
  // y = f(x); alpha is leaky_relu's negative slope.
  virtual void activation_forward(Activation kind, float alpha, const TensorView& x, const TensorView& y) = 0;
  // dx = f'(x) * dy (x is the forward input). dx may alias dy.
  virtual void activation_backward(Activation kind, float alpha, const TensorView& x, const TensorView& dy,
                                   const TensorView& dx) = 0;
  // sum = a + b element-wise, added in the compute type and rounded once (residual blocks); sum may alias a or b.
  virtual void add(const TensorView& a, const TensorView& b, const TensorView& sum);
  // Inverted dropout: y = x * keep / (1 - p), keep = uniform(seed, step, layer, sample_ids[row] * cols + col) >= p.
  // sample_ids are the global indices of the batch's rows (backend memory), so the mask does not depend on the rank
  // count. The backward regenerates the same mask (no mask is stored). dx may alias dy, y may alias x.
  virtual void dropout_forward(float p, std::uint64_t seed, std::uint32_t step, std::uint32_t layer,
                               const std::int64_t* sample_ids, const TensorView& x, const TensorView& y) = 0;
  virtual void dropout_backward(float p, std::uint64_t seed, std::uint32_t step, std::uint32_t layer,
                                const std::int64_t* sample_ids, const TensorView& dy, const TensorView& dx) = 0;

  // ---- normalisation (statistics and arithmetic in fp32, or fp64 for f64 storage) ----
  // Per row: y = (x - mean) * rstd * gamma + beta. gamma, beta: master dtype (length cols); mean, rstd: master dtype
  // (length rows), kept for the backward.
  virtual void layernorm_forward(const TensorView& x, const void* gamma, const void* beta, float eps,
                                 const TensorView& y, void* mean, void* rstd) = 0;
  virtual void layernorm_backward(const TensorView& x, const TensorView& dy, const void* gamma, const void* mean,
                                  const void* rstd, const TensorView& dx, void* dgamma, void* dbeta,
                                  bool accumulate) = 0;

  // ---- convolutional networks (default implementations throw NotSupported; see the CPU backend) ----
  // Convolution (cross-correlation, as PyTorch): x (rows, in_channels * input_size), y (rows, out_channels *
  // output_size), weight (out_channels, in_channels / groups * kernel_size) in the working dtype (x's dtype, or f64),
  // bias: master dtype (out_channels) or null. fp32 accumulation (fp64 for f64).
  virtual void convolution_forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& weight,
                                   const void* bias, const TensorView& y);
  // dx = d loss / dx (overwritten).
  virtual void convolution_backward_data(const SpatialGeometry& geometry, const TensorView& dy,
                                         const TensorView& weight, const TensorView& dx);
  // dweight (master dtype, weight's shape) and dbias (master dtype, out_channels; may be null) written or added.
  virtual void convolution_backward_weights(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                                            const TensorView& dweight, void* dbias, bool accumulate);
  // Pooling per channel (in_channels == out_channels); windows that reach into the padding: max ignores it, average
  // divides by the whole kernel size (PyTorch's count_include_pad = true).
  virtual void pooling_forward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x,
                               const TensorView& y);
  // dx overwritten; max pooling sends the gradient to the first maximum of each window (recomputed from x).
  virtual void pooling_backward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x,
                                const TensorView& dy, const TensorView& dx);
  // Max pooling that may keep each output's first maximum for its backward (argmax: (rows, channels x output
  // positions) int32, reserved by the layer), instead of recomputing every window. Defaults: the plain operations,
  // argmax unused. The results are the plain operations' either way (argmax null: the plain operations).
  virtual void max_pooling_forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& y,
                                   std::int32_t* /*argmax*/) {
    pooling_forward(PoolingKind::max, geometry, x, y);
  }
  virtual void max_pooling_backward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                                    const std::int32_t* /*argmax*/, const TensorView& dx) {
    pooling_backward(PoolingKind::max, geometry, x, dy, dx);
  }
  // Group normalisation of rows holding `channels` channels of cols / channels elements each, in `layout` order:
  // statistics per (row, group) in fp32 (fp64 for f64); gamma, beta per channel (master dtype); mean, rstd: (rows,
  // groups) master dtype.
  virtual void groupnorm_forward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                                 const void* gamma, const void* beta, float eps, const TensorView& y, void* mean,
                                 void* rstd);
  // dx must not alias dy; dgamma, dbeta written or added.
  virtual void groupnorm_backward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                                  const TensorView& dy, const void* gamma, const void* mean, const void* rstd,
                                  const TensorView& dx, void* dgamma, void* dbeta, bool accumulate);
  // The layout this backend's spatial operations run fastest on for activations of `dtype` (the model converts to it
  // when it builds a conv stack). CUDA: channels-last for 16-bit activations (cuDNN's tensor-core layout).
  [[nodiscard]] virtual SpatialLayout preferred_spatial_layout(DType /*activations*/) const {
    return SpatialLayout::channels_first;
  }
  // Rows of `channels` channels of x.cols / channels elements each, from layout `from` into the other layout: a
  // transpose of each row between (C, S) and (S, C). y must not alias x.
  virtual void convert_spatial_layout(std::int64_t channels, SpatialLayout from, const TensorView& x,
                                      const TensorView& y);

  // ---- sequences (transformers; default implementations throw NotSupported) ----
  // Fused attention: out = softmax(scale * q k^T (+ causal mask)) v per (sequence, head), scores and softmax in fp32
  // (fp64 for f64), never a T x T matrix per head in backend memory. lse (f32, or f64 for f64 storage: (batch, heads,
  // sequence)) receives each query row's log-sum-exp of the scaled scores, which the backward reads to recompute the
  // probabilities (flash-attention style). out must not alias qkv.
  virtual void attention_forward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out,
                                 void* lse);
  // dqkv (qkv's shape, overwritten) from dout; out and lse are the forward's.
  virtual void attention_backward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out,
                                  const TensorView& dout, const void* lse, const TensorView& dqkv);
  // Incremental decoding (hpctrain generate) of a causal attention over a key/value cache in backend memory. qkv
  // (count, 3C): the packed projections of positions [first, first + count) of one sequence (geometry: batch 1,
  // causal, `sequence` the cache's capacity T). cache (T, 2C) in qkv's dtype: each position's k then v. Writes the new
  // positions' k and v into cache rows [first, first + count) (rows [0, first) must hold the earlier positions'),
  // then out row i (count, C) = softmax(scale * q_i k^T) v over cache rows [0, first + i], scores, softmax and the
  // weighted sum in fp32 (fp64 for f64). out must not alias qkv or the cache.
  virtual void cached_attention(const AttentionGeometry& geometry, const TensorView& qkv, void* cache,
                                std::int64_t first, const TensorView& out);
  // Embedding lookup: y row r = table row ids[r] (table: master dtype (vocabulary, y.cols); y in the activation dtype).
  // ids in backend memory, each in [0, vocabulary) (checked by the data layer). With positions (master dtype,
  // (sequence, y.cols), a learned position embedding): + positions row (r % sequence), added in the master dtype
  // before the one rounding to the activation dtype.
  virtual void embedding_forward(const std::int32_t* ids, const void* table, std::int64_t vocabulary,
                                 const TensorView& y, const void* positions = nullptr, std::int64_t sequence = 0);
  // dtable (master dtype, (vocabulary, dy.cols)) += or = the sum of dy's rows per id, in an order that does not depend
  // on scheduling (deterministic: no floating-point atomics whose order changes the result).
  virtual void embedding_backward(const std::int32_t* ids, const TensorView& dy, std::int64_t vocabulary, void* dtable,
                                  bool accumulate);

  // Sequences stored as rows of (sequence, channels) values, channels = x.cols / sequence (position-major, as the
  // embedding's output): y (rows, channels) = the mean over the positions (summed in position order in fp32, fp64 for
  // f64, then divided by sequence) or position 0 (first). x and y in the activation dtype.
  virtual void sequence_pool_forward(SequencePooling mode, std::int64_t sequence, const TensorView& x,
                                     const TensorView& y);
  // dx (rows, sequence * channels), overwritten: dy / sequence at every position (mean), or dy at position 0 and zero
  // at the others (first). dx must not alias dy.
  virtual void sequence_pool_backward(SequencePooling mode, std::int64_t sequence, const TensorView& dy,
                                      const TensorView& dx);

  // A conv feature map as a sequence (a vision transformer's patch tokens): x rows hold `channels` channels of S =
  // x.cols / channels spatial elements in `layout` order; y rows are (sequence, channels), position-major, sequence =
  // S + 1 with a class token (class_token: master dtype, (channels); its row comes first) or S without (null).
  // Spatial element s (h * W + w of the channels-first map) is position s (+ 1): PyTorch's x.flatten(2).transpose(1,
  // 2). With positions (master dtype, (sequence, channels), or null) row t is added at position t, in the master dtype
  // before the one rounding to the activation dtype. y must not alias x.
  virtual void to_sequence_forward(std::int64_t channels, SpatialLayout layout, const TensorView& x,
                                   const void* class_token, const void* positions, const TensorView& y);
  // dx (x's shape, overwritten; skipped when dx.data is null) = dy's spatial positions back in `layout` order;
  // dclass_token (null: no class token) and dpositions (null: none) in the master dtype: the sums over dy's rows of
  // position 0 and of every position, each summed in row order from zero in the master dtype, then written or added
  // (accumulate) to the destination (the same additions on every backend). dx must not alias dy.
  virtual void to_sequence_backward(std::int64_t channels, SpatialLayout layout, const TensorView& dy,
                                    const TensorView& dx, void* dclass_token, void* dpositions, bool accumulate);

  // ---- losses (fp32 math; fp64 for f64) ----
  // Softmax cross-entropy on integer labels (backend memory, one per row, in [0, cols)).
  // sums += (sum of -log softmax(x)[label], rows whose argmax == label). If dlogits.data is not null:
  // dlogits = (softmax(x) - onehot) * (*grad_scale); dlogits may alias logits. grad_scale points into backend memory
  // (for training: loss_scale / global_batch), master dtype... always float.
  virtual void softmax_cross_entropy(const TensorView& logits, const std::int32_t* labels, const float* grad_scale,
                                     const TensorView& dlogits, LossSums* sums) = 0;
  // The same with class weights and label smoothing: sums.loss_sum += the per-row losses of
  // kernel_math::smoothed_cross_entropy_loss (weighted, not yet divided by the weights of the labels; the caller's
  // *grad_scale holds that division), sums.correct as above; dlogits = the loss's gradient * (*grad_scale).
  virtual void smoothed_softmax_cross_entropy(const TensorView& logits, const std::int32_t* labels,
                                              const CrossEntropyOptions& options, const float* grad_scale,
                                              const TensorView& dlogits, LossSums* sums);
  // Mean squared error: per-sample loss = mean_k (pred - target)^2; targets have pred's shape, in master dtype.
  // dpred = 2 (pred - target) / cols * (*grad_scale).
  virtual void mean_squared_error(const TensorView& pred, const void* targets, const float* grad_scale,
                                  const TensorView& dpred, LossSums* sums) = 0;

  // ---- evaluation counts ----
  // Per row of class scores (rows, cols) against its int32 target (backend memory, one per row; kernel_math::
  // ignored_label (-100), or a target outside [0, cols), is never a hit): counts[0] = rows whose argmax (the first
  // maximum, as kernel_math::row_argmax: ties -> the lowest index, a NaN after the first score never wins) is the
  // target; counts[1] = rows with fewer than 5 scores strictly above the target's (ties count for the target, a NaN
  // target score is a hit). Scores compared in the compute type (fp32 for f32/bf16/f16 storage). counts: 2 doubles in
  // backend memory, overwritten, or added to with accumulate; the counts are exact integers. What evaluation keeps on
  // the device instead of copying the model's output to the host.
  virtual void count_class_hits(const TensorView& scores, const std::int32_t* targets, double* counts, bool accumulate);
  // Per row of logits (rows, cols) and its int32 target (backend memory): argmax[row] = the first maximum (as above),
  // target_log_probability[row] = log softmax(row)[target] = x[target] - max - log sum_k exp(x[k] - max), the sum in
  // double (NaN for a target outside [0, cols), e.g. -100). What `predict` writes per position of a token model.
  virtual void score_targets(const TensorView& logits, const std::int32_t* targets, std::int32_t* argmax,
                             float* target_log_probability);

  // ---- optimizer (flat fp32 buffers) ----
  // Elements per partial sum of the gradient statistics (a fixed split, so the norm does not depend on the threads).
  static constexpr std::int64_t gradient_statistics_chunk = 4096;
  // Global statistics of the (all-reduced, still scaled) gradients: sets scalars->found_nonfinite, grad_norm
  // (unscaled: sqrt(sum g^2) / loss_scale) and clip_coefficient. The reduction order is fixed (deterministic).
  virtual void gradient_statistics(const float* gradients, std::int64_t count, const OptimizerHyper& hyper,
                                   StepScalars* scalars) = 0;
  // gradient_statistics in two halves, for an optimizer sharded over the ranks (GradientExchange::owned). First the
  // sum of squares and the non-finite flag (1 or 0) of each chunk of gradient_statistics_chunk elements that lies in
  // `owned` (whole chunks, but the buffer's last), into partials[chunk] and partials[chunks + chunk] (host memory, 2 x
  // chunks doubles; the other entries are left as they are). Then, once every rank's partials are summed (each chunk
  // has one owner, so the sums are exact), the statistics from them: the chunks added in order, the same bits as
  // gradient_statistics over the whole buffer. Defaults: NotSupported.
  virtual void gradient_chunk_statistics(const float* gradients, std::int64_t count,
                                         std::span<const ElementRange> owned, double* partials);
  virtual void statistics_from_chunks(const double* partials, std::int64_t chunks, const OptimizerHyper& hyper,
                                      StepScalars* scalars);
  // One fused pass: unscale, clip, update parameters and state, refresh the 16-bit working copy (if working.data is not
  // null; working has `count` elements). Does nothing when scalars->found_nonfinite. state1: momentum / AdamW m;
  // state2: AdamW v (may be null for SGD). decay: whether weight decay applies to this range.
  virtual void optimizer_step(const OptimizerHyper& hyper, bool decay, float* parameters, const float* gradients,
                              float* state1, float* state2, std::int64_t count, const TensorView& working,
                              const StepScalars* scalars) = 0;
  // Loss scaler update after the optimizer: growth/backoff, counters, applied_steps. Single-thread work.
  virtual void finish_step(const LossScalerConfig& config, StepScalars* scalars) = 0;
  // *grad_scale = scalars->loss_scale / rows: the factor of the loss gradient (mean over the global batch's rows, times
  // the loss scale), formed where the scalars live so a step needs no host round trip. Single-thread work.
  // label_weights (backend memory, or null): with class weights the mean divides by the global batch's sum of the
  // labels' weights instead of rows; it changes every step, so it is read from memory (a CUDA graph replays it).
  virtual void loss_gradient_scale(const StepScalars* scalars, float rows, const float* label_weights,
                                   float* grad_scale) = 0;
  // Whether the convolution, pooling and groupnorm operations are implemented (their defaults throw NotSupported);
  // the model asks at set-up so a deck the backend cannot run is refused before training starts.
  [[nodiscard]] virtual bool has_spatial_operations() const { return false; }

  // ---- step graphs (CUDA graphs; the CPU backend has none) ----
  // Work issued between begin_capture and end_capture is recorded, not run; replay_capture runs the recording (same
  // buffers, same launch parameters, device scalars read at replay). One recording per slot; a new one replaces it.
  virtual void begin_capture(CaptureSlot slot = CaptureSlot::step);
  virtual void end_capture(CaptureSlot slot = CaptureSlot::step);
  virtual void replay_capture(CaptureSlot slot = CaptureSlot::step);
  [[nodiscard]] virtual bool supports_capture() const { return false; }
  [[nodiscard]] virtual bool has_capture(CaptureSlot /*slot*/) const { return false; }
  // Destroys every recording. Call before the NCCL communicator a recording uses is destroyed: NCCL 2.28's
  // ncclCommDestroy waits until no graph uses the communicator (GradientExchange::release, then the exchange).
  virtual void release_graphs() {}

  // ---- waiting, uploads, timing, set-up choices (defaults: what a synchronous host backend needs) ----
  // Called while the host waits for the backend (read-backs, synchronize, upload ring space): the NCCL gradient
  // exchange installs its asynchronous-error check, which aborts the job's communication and throws instead of
  // hanging on a failed peer. An empty function removes it.
  virtual void set_wait_monitor(std::function<void()> /*monitor*/) {}
  // f32 host values into `destination` (any storage dtype, same element count): a step's batch. CUDA copies on a copy
  // stream into one of two staging slots (the copy overlaps the work already queued) and the compute stream waits on
  // its event; returns once `host_source` has been read.
  virtual void upload_cast(const float* host_source, const TensorView& destination);
  // Host memory the caller keeps allocated, at this address, until unpin_host_memory (a data loader's ring): CUDA
  // page-locks it, so upload_cast copies from it by DMA without a host-side copy. False when not done (CPU backend,
  // or the driver refused: uploads then go through a pinned ring).
  virtual bool pin_host_memory(const void* /*pointer*/, std::size_t /*bytes*/) { return false; }
  virtual void unpin_host_memory(const void* /*pointer*/) {}
  // Phase timing on the backend's own timeline (--profile): mark_phase(p) ends the running phase and starts phase p
  // (0 <= p < 16; -1 only ends), named for profilers (CUDA: an event on the stream and an NVTX range).
  // phase_seconds()[p]: seconds of phase p so far (waits for the marks). false / empty: no timeline of its own (the
  // CPU backend's work is synchronous, so host clocks time it).
  virtual bool mark_phase(int /*phase*/, const char* /*name*/) { return false; }
  virtual std::vector<double> phase_seconds() { return {}; }
  // fp32 products and convolutions on tensor cores (TF32 inputs, fp32 accumulation): precision.tf32. Set before the
  // first product; the CPU backend ignores it.
  virtual void allow_tf32(bool /*allowed*/) {}
  // Byte alignment the backend wants for each parameter tensor in the flat buffers (the model pads offsets to it);
  // 0: none (the CPU backend, whose layout and results stay exactly as without padding).
  [[nodiscard]] virtual std::size_t parameter_alignment() const { return 0; }
  [[nodiscard]] virtual DeviceUuid device_uuid() const { return {}; }
  // Lines worth a log entry that the backend noted since the last call (algorithm choices and fallbacks).
  virtual std::vector<std::string> take_notes() { return {}; }

  // ---- fused linear-layer products (defaults compose the plain operations, so the CPU's results stay the same) ----
  // dweight (out, in) (+)= dy^T x and dbias (+)= column sums of dy (dbias may be null): a linear layer's parameter
  // gradients. CUDA folds the bias gradient into the product's epilogue (CUBLASLT_EPILOGUE_BGRADB).
  virtual void linear_weight_gradient(const TensorView& dy, const TensorView& x, const TensorView& dweight, void* dbias,
                                      bool accumulate);
  // Whether linear_activation_forward folds `kind` into the product (CUDA: relu and gelu_tanh, see
  // cuda/linear_epilogue.hpp). Then a relu's pre-activation may hold something else (the model runs relu's backward
  // on its output), any other activation's pre-activation is written. The CPU: never.
  [[nodiscard]] virtual bool fuses_linear_activation(Activation /*kind*/) const { return false; }
  // y = f(x weight^T + bias) (weight (out, in), bias in master dtype or null): a linear layer and the activation
  // after it. The default composes gemm into `pre` and activation_forward from it; a backend that fuses `kind` may
  // leave in `pre` what its linear_activation_backward reads instead.
  virtual void linear_activation_forward(const TensorView& x, const TensorView& weight, const void* bias,
                                         Activation kind, float alpha, const TensorView& pre, const TensorView& y);
  // dx = f'(pre) * (dy weight) (weight (out, in), dx overwritten): the input gradient of a linear layer whose input
  // y = f(pre) came from linear_activation_forward (pre and y as given there), with f's backward. The default
  // composes gemm and activation_backward (relu on y, the others on pre); CUDA folds f' into the product's epilogue
  // (DRELU/DGELU) when its forward left the mask or pre-activation for it.
  virtual void linear_activation_backward(const TensorView& dy, const TensorView& weight, Activation kind, float alpha,
                                          const TensorView& pre, const TensorView& y, const TensorView& dx);

  // Whether linear_residual_forward folds the add into the product for activations of `dtype` (CPU: oneDNN's binary
  // add post-op, or the loop that stores the product; CUDA: cuBLASLt's D = A B + C with C = skip, when aligned).
  [[nodiscard]] virtual bool fuses_residual_add(DType /*dtype*/) const { return false; }
  // y = (x weight^T + bias) + skip (weight (out, in), bias in master dtype or null, skip of y's shape and dtype, not
  // aliasing y): a linear product that ends a residual branch, with the block's add. The default composes gemm into y
  // and add (the branch output rounded to y's dtype before the add); a fusing backend rounds once.
  virtual void linear_residual_forward(const TensorView& x, const TensorView& weight, const void* bias,
                                       const TensorView& skip, const TensorView& y);

  // ---- step bookkeeping in backend memory (what a captured step replays without the host) ----
  // base + slot * stride <- source, and the reverse, `slot` read from backend memory at run (replay) time;
  // advance_slot: *slot += 1. The trainer keeps the step's records and its learning-rate table this way.
  virtual void copy_to_slot(void* base, std::size_t stride, const std::int32_t* slot, const void* source,
                            std::size_t bytes);
  virtual void copy_from_slot(void* destination, const void* base, std::size_t stride, const std::int32_t* slot,
                              std::size_t bytes);
  virtual void advance_slot(std::int32_t* slot);
};

// The CPU backend (always built). Its spatial operations prefer channels-last activations; $HPCTRAIN_SPATIAL_LAYOUT =
// channels_first makes models keep the file layout instead (for comparisons; InputError for other values).
std::unique_ptr<Backend> make_cpu_backend();
std::unique_ptr<Backend> make_cpu_backend(SpatialLayout preferred);

// The CUDA backend on `device` (an index among the visible devices): one stream, cuBLASLt for matrix products, cuDNN
// for convolutions (when the build found it), own kernels for the rest. Storage dtypes f32/bf16/f16 (f64, used only by
// gradient checks, is NotSupported). It lives in the CUDA module (kernels/cuda_module.hpp): the executable's definition
// forwards to it, and throws InputError saying why when the module cannot be loaded (a CPU-only build: how to rebuild).
std::unique_ptr<Backend> make_cuda_backend(int device);

// Visible CUDA devices, from the driver without the CUDA module; 0 without a driver or GPU, or CPU-only (never throws).
int cuda_device_count();

}  // namespace hpctrain
