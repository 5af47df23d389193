// Sequence kernels of the CUDA backend (see cuda_attention.hpp): fused attention flash-attention style (no T x T
// matrix per head in device memory) and the embedding lookup, both deterministic.
//
// Attention, storage f32/bf16/f16, all arithmetic in fp32 FMAs: tensor cores (mma/wmma) are NOT used yet, and head_dim
// is limited to max_head_dim (NotSupported beyond). The scores are in base 2 (scale * log2(e) folded in), as on the
// CPU.
// - Forward: one block of query_tile threads per (batch * head, query tile), a thread per query row holding its
//   (pre-scaled) query and output in registers; key/value tiles of stream_tile rows streamed through shared memory;
//   online softmax (running maximum m and sum l per row); causal blocks stop at the tile's last query, so fully masked
//   key tiles are never loaded. lse = ln(2) (m + log2 l) per row.
// - Backward: D_i = rowsum(dO_i * O_i) by a small kernel; then one block per (batch * head, key tile) owning dK and dV
//   of its keys (a thread per key, accumulators in registers) over the query tiles that see them, and one block per
//   (batch * head, query tile) owning dQ over the key tiles. P = 2^(S - lse2) is recomputed in both. Every gradient
//   element is summed by one thread in a fixed order: no atomics, results identical run to run.
// - Dropout on the probabilities (AttentionGeometry::dropout, training): each (query, key) element's keep factor
//   (keep / (1 - p), or 0) is regenerated from kernels/math.hpp's counter-based mask where the element is formed (no
//   mask in memory), so every kernel, the CPU's included, drops the same elements. The forward's running sum takes the
//   undropped P and its output the dropped one; the backward forms dV from P' = P factor and dS = P (dP' factor - D).
//   The dK/dV kernel walks a key's queries (index stride T): one Philox call per element there, one per four keys in
//   the others. Without dropout the factor is the constant 1, which changes no bit.
// Embedding backward: the (id, row) pairs are sorted by id with CUB's radix sort (stable: rows of an id stay in row
// order), then the thread of (first position of an id, column) adds that id's rows in row order, as the CPU does.
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <limits>
#include <string>

#include "cuda_attention.hpp"
#include "cuda_device.cuh"
#include "cuda_dispatch.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/math.hpp"

namespace hpctrain::cuda {
namespace {

constexpr int max_head_dim = 64;
constexpr int padded_dim = max_head_dim + 1;  // a row stride in shared memory: thread r reading row r hits bank r + d
constexpr int query_tile = 64;                // threads per block: query rows (forward, dQ) or keys (dK/dV)
constexpr int stream_tile = 32;               // key/value rows per shared tile in the forward
constexpr int backward_tile = 16;             // rows per streamed shared tile in the backward kernels
constexpr float log2e = 1.4426950408889634f;
constexpr float ln2 = 0.6931471805599453f;
constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

// A block's (batch x head, tile): where the head of that sequence lives (qkv rows of 3 * width ([q | k | v]), out/dout
// rows of width), the tile's first position and this thread's own position (its query or key row), the scores' factor.
struct Head {
  std::int64_t width, qkv_stride, qkv_offset, out_offset, lse_offset, first, own;
  float score_scale;
  __device__ explicit Head(const AttentionGeometry& g) {
    const std::int64_t batch_head = blockIdx.x;
    first = static_cast<std::int64_t>(blockIdx.y) * query_tile;
    own = first + threadIdx.x;
    score_scale = g.scale * log2e;
    width = g.heads * g.head_dim;
    qkv_stride = 3 * width;
    const std::int64_t b = batch_head / g.heads, h = batch_head % g.heads;
    qkv_offset = b * g.sequence * qkv_stride + h * g.head_dim;
    out_offset = b * g.sequence * width + h * g.head_dim;
    lse_offset = batch_head * g.sequence;
  }
};

// tile[r * tile_stride + d] = rows first + r (r < rows) of a head's part (row stride `stride`) in fp32, zero for
// positions at or beyond the sequence and d >= head_dim. All threads of the block take part.
template <class T>
__device__ void load_tile(const T* source, std::int64_t stride, std::int64_t first, int rows,
                          const AttentionGeometry& g, float* tile, int tile_stride) {
  for (int index = static_cast<int>(threadIdx.x); index < rows * max_head_dim; index += static_cast<int>(blockDim.x)) {
    const int r = index / max_head_dim, d = index % max_head_dim;
    const std::int64_t position = first + r;
    tile[r * tile_stride + d] = position < g.sequence && d < g.head_dim ? load(source[position * stride + d]) : 0.0f;
  }
}

// The dropout keep factors of one (sequence, head)'s elements, walked by one thread; consecutive calls for keys of one
// query in increasing order reuse the Philox call of their group of four indices (kernels/math.hpp's contract). The
// kernels are instantiated with and without dropout: without, every factor is the constant 1, which the compiler
// folds away, so those kernels are the plain ones (no registers spent on the generator's state).
template <bool enabled>
class DropoutFactors {
 public:
  __device__ DropoutFactors(const AttentionGeometry& g, std::int64_t batch_head)
      : p_(g.dropout.p), layer_(g.dropout.layer) {
    if (!enabled) return;
    key_ = kernel_math::dropout_key(g.dropout.seed, g.dropout.step);
    kept_ = kernel_math::dropout_scale<float>(p_);
    const std::int64_t b = batch_head / g.heads;
    first_index_ =
        kernel_math::attention_dropout_index(g.dropout.sample_ids[b], g.heads, batch_head % g.heads, g.sequence, 0, 0);
    sequence_ = static_cast<std::uint64_t>(g.sequence);
  }
  // 1 without dropout.
  __device__ float operator()(std::int64_t query, std::int64_t key) {
    if (!enabled) return 1.0f;
    const std::uint64_t index =
        first_index_ + static_cast<std::uint64_t>(query) * sequence_ + static_cast<std::uint64_t>(key);
    if ((index >> 2) != group_) {
      group_ = index >> 2;
      bits_ = kernel_math::attention_dropout_group_bits(key_, layer_, group_);
    }
    return kernel_math::attention_dropout_keep_from_bits(bits_, index, p_) ? kept_ : 0.0f;
  }

 private:
  float p_, kept_ = 1.0f;
  std::uint32_t layer_;
  std::uint64_t key_ = 0, first_index_ = 0, sequence_ = 0, group_ = ~std::uint64_t{0};
  Philox4 bits_{};
};

__device__ __forceinline__ bool visible(const AttentionGeometry& g, std::int64_t query, std::int64_t key) {
  return query < g.sequence && key < g.sequence && (!g.causal || key <= query);
}

template <class T, bool with_dropout>
__global__ void __launch_bounds__(query_tile)
    attention_forward_kernel(AttentionGeometry g, const T* qkv, T* out, float* lse) {
  __shared__ float keys[stream_tile * max_head_dim];
  __shared__ float values[stream_tile * max_head_dim];
  const Head head(g);
  const std::int64_t first = head.first, query = head.own;
  const T* q = qkv + head.qkv_offset;
  const float score_scale = head.score_scale;
  float query_row[max_head_dim], output[max_head_dim];
#pragma unroll
  for (int d = 0; d < max_head_dim; ++d) {
    query_row[d] = query < g.sequence && d < g.head_dim ? score_scale * load(q[query * head.qkv_stride + d]) : 0.0f;
    output[d] = 0.0f;
  }
  float running_max = minus_infinity, running_sum = 0.0f;
  DropoutFactors<with_dropout> dropout(g, blockIdx.x);
  const std::int64_t end = g.causal ? std::min<std::int64_t>(g.sequence, first + query_tile) : g.sequence;
  for (std::int64_t key_first = 0; key_first < end; key_first += stream_tile) {
    __syncthreads();  // the previous tile is read
    load_tile(q + head.width, head.qkv_stride, key_first, stream_tile, g, keys, max_head_dim);
    load_tile(q + 2 * head.width, head.qkv_stride, key_first, stream_tile, g, values, max_head_dim);
    __syncthreads();
    float scores[stream_tile];
    float tile_max = minus_infinity;
#pragma unroll
    for (int j = 0; j < stream_tile; ++j) {
      float dot = 0.0f;
#pragma unroll
      for (int d = 0; d < max_head_dim; ++d) dot += query_row[d] * keys[j * max_head_dim + d];
      scores[j] = visible(g, query, key_first + j) ? dot : minus_infinity;
      tile_max = fmaxf(tile_max, scores[j]);
    }
    const float new_max = fmaxf(running_max, tile_max);
    if (new_max == minus_infinity) continue;  // a row beyond the sequence (key 0 is visible to every other)
    const float rescale = exp2f(running_max - new_max);
    running_sum *= rescale;
#pragma unroll
    for (int d = 0; d < max_head_dim; ++d) output[d] *= rescale;
#pragma unroll
    for (int j = 0; j < stream_tile; ++j) {
      const float p = exp2f(scores[j] - new_max);
      running_sum += p;  // the undropped probability
      // A masked element (p = 0) draws no random number.
      const float dropped = p * (scores[j] == minus_infinity ? 1.0f : dropout(query, key_first + j));
#pragma unroll
      for (int d = 0; d < max_head_dim; ++d) output[d] += dropped * values[j * max_head_dim + d];
    }
    running_max = new_max;
  }
  if (query >= g.sequence) return;
  const float inverse = 1.0f / running_sum;
  T* o = out + head.out_offset + query * head.width;
#pragma unroll
  for (int d = 0; d < max_head_dim; ++d)
    if (d < g.head_dim) o[d] = store<T>(output[d] * inverse);
  lse[head.lse_offset + query] = (running_max + log2f(running_sum)) * ln2;
}

// delta[(batch * heads + head) * sequence + t] = sum_d dout * out of that row's head.
template <class T>
__global__ void attention_delta_kernel(AttentionGeometry g, const T* out, const T* dout, float* delta) {
  const std::int64_t total = g.batch * g.heads * g.sequence;
  for (std::int64_t index = global_thread(); index < total; index += grid_threads()) {
    const std::int64_t t = index % g.sequence, batch_head = index / g.sequence;
    const std::int64_t width = g.heads * g.head_dim;
    const std::int64_t offset = (batch_head / g.heads * g.sequence + t) * width + batch_head % g.heads * g.head_dim;
    float sum = 0.0f;
    for (std::int64_t d = 0; d < g.head_dim; ++d) sum += load(dout[offset + d]) * load(out[offset + d]);
    delta[index] = sum;
  }
}

// P and dS of one (query, key) pair in the backward: the score from the block's own row and a streamed row (S =
// scale q.k, P = 2^(S log2(e) - lse2)), dP from the own and streamed gradient/value rows, dS = P (dP - D). The own rows
// are volatile: read from shared memory at each use, not held in registers (those hold the gradient accumulators).
// With dropout, factor is the element's keep / (1 - p) or 0 (1 without): probability is then the dropped P' (dV's
// factor) and dS = P (dP' factor - D), dP' the product of the gradient and value rows.
struct Pair {
  float probability, dscore;
};
__device__ __forceinline__ Pair backward_pair(bool seen, const volatile float* own_score_row, const float* score_row,
                                              const volatile float* own_gradient_row, const float* gradient_row,
                                              float score_scale, float lse2, float delta, float factor) {
  float score = 0.0f, dprobability = 0.0f;
#pragma unroll
  for (int d = 0; d < max_head_dim; ++d) {
    score += own_score_row[d] * score_row[d];
    dprobability += own_gradient_row[d] * gradient_row[d];
  }
  const float probability = seen ? exp2f(score * score_scale - lse2) : 0.0f;
  return {probability * factor, probability * (dprobability * factor - delta)};
}

// dK, dV of one key tile (a thread per key) over the query tiles that see it.
template <class T, bool with_dropout>
__global__ void __launch_bounds__(query_tile) attention_dkdv_kernel(AttentionGeometry g, const T* qkv, const T* dout,
                                                                    const float* lse, const float* delta, T* dqkv) {
  __shared__ float keys[query_tile * padded_dim];
  __shared__ float values[query_tile * padded_dim];
  __shared__ float queries[backward_tile * max_head_dim];
  __shared__ float gradients[backward_tile * max_head_dim];
  __shared__ float lse2[backward_tile], deltas[backward_tile];
  const Head head(g);
  const std::int64_t key_first = head.first, key = head.own;
  const T* q = qkv + head.qkv_offset;
  const float score_scale = head.score_scale;
  load_tile(q + head.width, head.qkv_stride, key_first, query_tile, g, keys, padded_dim);
  load_tile(q + 2 * head.width, head.qkv_stride, key_first, query_tile, g, values, padded_dim);
  const volatile float* own_key = keys + threadIdx.x * padded_dim;
  const volatile float* own_value = values + threadIdx.x * padded_dim;
  float dkey[max_head_dim], dvalue[max_head_dim];
#pragma unroll
  for (int d = 0; d < max_head_dim; ++d) dkey[d] = dvalue[d] = 0.0f;
  DropoutFactors<with_dropout> dropout(g, blockIdx.x);
  // Causal: query tiles before this key tile see none of its keys.
  for (std::int64_t query_first = g.causal ? key_first : 0; query_first < g.sequence; query_first += backward_tile) {
    __syncthreads();  // the previous tile is read (and the own tiles are loaded)
    load_tile(q, head.qkv_stride, query_first, backward_tile, g, queries, max_head_dim);
    load_tile(dout + head.out_offset, head.width, query_first, backward_tile, g, gradients, max_head_dim);
    if (threadIdx.x < backward_tile) {
      const std::int64_t position = query_first + threadIdx.x;
      lse2[threadIdx.x] = position < g.sequence ? lse[head.lse_offset + position] * log2e : 0.0f;
      deltas[threadIdx.x] = position < g.sequence ? delta[head.lse_offset + position] : 0.0f;
    }
    __syncthreads();
#pragma unroll 1
    for (int r = 0; r < backward_tile; ++r) {
      const float* query_row = queries + r * max_head_dim;
      const float* gradient_row = gradients + r * max_head_dim;
      const bool seen = visible(g, query_first + r, key);
      const Pair pair = backward_pair(seen, own_key, query_row, own_value, gradient_row, score_scale, lse2[r],
                                      deltas[r], seen ? dropout(query_first + r, key) : 1.0f);
#pragma unroll
      for (int d = 0; d < max_head_dim; ++d) {
        dvalue[d] += pair.probability * gradient_row[d];
        dkey[d] += pair.dscore * query_row[d];
      }
    }
  }
  if (key >= g.sequence) return;
  T* dk = dqkv + head.qkv_offset + key * head.qkv_stride + head.width;
#pragma unroll
  for (int d = 0; d < max_head_dim; ++d)
    if (d < g.head_dim) {
      dk[d] = store<T>(dkey[d] * g.scale);
      dk[head.width + d] = store<T>(dvalue[d]);
    }
}

// dQ of one query tile (a thread per query) over the key tiles it sees.
template <class T, bool with_dropout>
__global__ void __launch_bounds__(query_tile) attention_dq_kernel(AttentionGeometry g, const T* qkv, const T* dout,
                                                                  const float* lse, const float* delta, T* dqkv) {
  __shared__ float queries[query_tile * padded_dim];
  __shared__ float gradients[query_tile * padded_dim];
  __shared__ float keys[backward_tile * max_head_dim];
  __shared__ float values[backward_tile * max_head_dim];
  const Head head(g);
  const std::int64_t query_first = head.first, query = head.own;
  const T* q = qkv + head.qkv_offset;
  const float score_scale = head.score_scale;
  load_tile(q, head.qkv_stride, query_first, query_tile, g, queries, padded_dim);
  load_tile(dout + head.out_offset, head.width, query_first, query_tile, g, gradients, padded_dim);
  const volatile float* own_query = queries + threadIdx.x * padded_dim;
  const volatile float* own_gradient = gradients + threadIdx.x * padded_dim;
  const float own_lse2 = query < g.sequence ? lse[head.lse_offset + query] * log2e : 0.0f;
  const float own_delta = query < g.sequence ? delta[head.lse_offset + query] : 0.0f;
  float dquery[max_head_dim];
#pragma unroll
  for (int d = 0; d < max_head_dim; ++d) dquery[d] = 0.0f;
  DropoutFactors<with_dropout> dropout(g, blockIdx.x);
  const std::int64_t end = g.causal ? std::min<std::int64_t>(g.sequence, query_first + query_tile) : g.sequence;
  for (std::int64_t key_first = 0; key_first < end; key_first += backward_tile) {
    __syncthreads();
    load_tile(q + head.width, head.qkv_stride, key_first, backward_tile, g, keys, max_head_dim);
    load_tile(q + 2 * head.width, head.qkv_stride, key_first, backward_tile, g, values, max_head_dim);
    __syncthreads();
#pragma unroll 1
    for (int r = 0; r < backward_tile; ++r) {
      const float* key_row = keys + r * max_head_dim;
      const bool seen = visible(g, query, key_first + r);
      const Pair pair = backward_pair(seen, own_query, key_row, own_gradient, values + r * max_head_dim, score_scale,
                                      own_lse2, own_delta, seen ? dropout(query, key_first + r) : 1.0f);
#pragma unroll
      for (int d = 0; d < max_head_dim; ++d) dquery[d] += pair.dscore * key_row[d];
    }
  }
  if (query >= g.sequence) return;
  T* dq = dqkv + head.qkv_offset + query * head.qkv_stride;
#pragma unroll
  for (int d = 0; d < max_head_dim; ++d)
    if (d < g.head_dim) dq[d] = store<T>(dquery[d] * g.scale);
}

// An id outside [0, vocabulary) gives NaN rows (the CPU backend throws InputError; the data layer checks the ids when
// it opens the data, so this only guards against corrupted memory). positions (may be null): (sequence, cols), row
// r % sequence added in fp32 before the one rounding, as the CPU backend does.
template <class T>
__global__ void embedding_forward_kernel(const std::int32_t* ids, const float* table, std::int64_t vocabulary, T* y,
                                         std::int64_t rows, std::int64_t cols, const float* positions,
                                         std::int64_t sequence) {
  for (std::int64_t index = global_thread(); index < rows * cols; index += grid_threads()) {
    const std::int64_t row = index / cols, c = index % cols, id = ids[row];
    float value = id >= 0 && id < vocabulary ? table[id * cols + c] : std::numeric_limits<float>::quiet_NaN();
    if (positions != nullptr) value += positions[(row % sequence) * cols + c];
    y[index] = store<T>(value);
  }
}

// One thread per (row, channel): the positions added in order in fp32, then divided (the CPU backend's order).
template <class T>
__global__ void sequence_pool_forward_kernel(SequencePooling mode, const T* x, T* y, std::int64_t rows,
                                             std::int64_t sequence, std::int64_t channels) {
  for (std::int64_t index = global_thread(); index < rows * channels; index += grid_threads()) {
    const std::int64_t row = index / channels, c = index % channels;
    const T* source = x + row * sequence * channels + c;
    float value = load(source[0]);
    if (mode == SequencePooling::mean) {
      for (std::int64_t t = 1; t < sequence; ++t) value += load(source[t * channels]);
      value /= static_cast<float>(sequence);
    }
    y[index] = store<T>(value);
  }
}

template <class T>
__global__ void sequence_pool_backward_kernel(SequencePooling mode, const T* dy, T* dx, std::int64_t rows,
                                              std::int64_t sequence, std::int64_t channels) {
  const std::int64_t cols = sequence * channels;
  for (std::int64_t index = global_thread(); index < rows * cols; index += grid_threads()) {
    const std::int64_t row = index / cols, t = index % cols / channels, c = index % channels;
    const float gradient = load(dy[row * channels + c]);
    dx[index] =
        store<T>(mode == SequencePooling::mean ? gradient / static_cast<float>(sequence) : (t == 0 ? gradient : 0.0f));
  }
}

__global__ void iota_kernel(std::int32_t* values, std::int64_t count) {
  for (std::int64_t index = global_thread(); index < count; index += grid_threads())
    values[index] = static_cast<std::int32_t>(index);
}

// The thread of (position p, column c) where p is an id's first position in the sorted order adds that id's rows in
// row order to dtable's element; out-of-range ids are skipped.
template <class T>
__global__ void embedding_segment_sum_kernel(const std::int32_t* sorted_ids, const std::int32_t* sorted_rows,
                                             const T* dy, float* dtable, std::int64_t vocabulary, std::int64_t rows,
                                             std::int64_t cols) {
  for (std::int64_t index = global_thread(); index < rows * cols; index += grid_threads()) {
    const std::int64_t position = index / cols, c = index % cols;
    const std::int32_t id = sorted_ids[position];
    if ((position > 0 && sorted_ids[position - 1] == id) || id < 0 || id >= vocabulary) continue;
    float sum = dtable[id * cols + c];
    for (std::int64_t p = position; p < rows && sorted_ids[p] == id; ++p)
      sum += load(dy[static_cast<std::int64_t>(sorted_rows[p]) * cols + c]);
    dtable[id * cols + c] = sum;
  }
}

void check_attention(const AttentionGeometry& g, const TensorView& qkv, const TensorView& out, const char* what) {
  HPCTRAIN_ASSERT(g.batch >= 0 && g.sequence >= 1 && g.heads >= 1 && g.head_dim >= 1 &&
                      qkv.rows == g.batch * g.sequence && qkv.cols == 3 * g.width() && out.rows == qkv.rows &&
                      out.cols == g.width() && out.dtype == qkv.dtype,
                  what << ": qkv " << qkv.rows << "x" << qkv.cols << " and out " << out.rows << "x" << out.cols
                       << " do not match batch " << g.batch << " x sequence " << g.sequence << ", " << g.heads
                       << " heads of " << g.head_dim);
  require_device_storage(qkv.dtype, what);
  HPCTRAIN_ASSERT(!g.dropout.active() || g.dropout.sample_ids != nullptr, what << ": dropout without sample ids");
  if (g.head_dim > max_head_dim)
    throw NotSupported(std::string(what) + " with head_dim " + std::to_string(g.head_dim) +
                       " on the CUDA backend: head_dim <= " + std::to_string(max_head_dim) +
                       " only (not supported yet); use run.device = \"cpu\" or smaller heads");
  HPCTRAIN_ASSERT(
      g.batch * g.heads <= std::numeric_limits<int>::max() && g.sequence / query_tile < 65535,
      what << ": " << g.batch * g.heads << " heads in all, sequence " << g.sequence << ": too large for the CUDA grid");
}

dim3 attention_grid(const AttentionGeometry& g) {
  return {static_cast<unsigned>(g.batch * g.heads), static_cast<unsigned>((g.sequence + query_tile - 1) / query_tile)};
}

}  // namespace

void attention_forward(cudaStream_t stream, const AttentionGeometry& geometry, const TensorView& qkv,
                       const TensorView& out, float* lse) {
  check_attention(geometry, qkv, out, "attention_forward");
  HPCTRAIN_ASSERT(out.data != qkv.data, "attention_forward: out must not alias qkv");
  if (qkv.rows == 0) return;
  dispatch_storage(qkv.dtype, "attention_forward", [&]<class T>() {
    const auto* q = static_cast<const T*>(qkv.data);
    auto* o = static_cast<T*>(out.data);
    if (geometry.dropout.active())
      attention_forward_kernel<T, true><<<attention_grid(geometry), query_tile, 0, stream>>>(geometry, q, o, lse);
    else
      attention_forward_kernel<T, false><<<attention_grid(geometry), query_tile, 0, stream>>>(geometry, q, o, lse);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void attention_backward(cudaStream_t stream, SequenceScratch& scratch, const AttentionGeometry& geometry,
                        const TensorView& qkv, const TensorView& out, const TensorView& dout, const float* lse,
                        const TensorView& dqkv) {
  check_attention(geometry, qkv, out, "attention_backward");
  check_attention(geometry, dqkv, dout, "attention_backward (gradients)");
  HPCTRAIN_ASSERT(dqkv.dtype == qkv.dtype, "attention_backward: dqkv and qkv differ in dtype");
  if (qkv.rows == 0) return;
  const std::int64_t rows = geometry.batch * geometry.heads * geometry.sequence;
  auto* delta = scratch.delta.reserve_elements<float>(static_cast<std::size_t>(rows));
  dispatch_storage(qkv.dtype, "attention_backward", [&]<class T>() {
    const auto* q = static_cast<const T*>(qkv.data);
    const auto* gradient = static_cast<const T*>(dout.data);
    auto* result = static_cast<T*>(dqkv.data);
    attention_delta_kernel<T>
        <<<grid_for(rows), block_threads, 0, stream>>>(geometry, static_cast<const T*>(out.data), gradient, delta);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
    const auto launch = [&]<bool with_dropout>() {
      attention_dkdv_kernel<T, with_dropout>
          <<<attention_grid(geometry), query_tile, 0, stream>>>(geometry, q, gradient, lse, delta, result);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
      attention_dq_kernel<T, with_dropout>
          <<<attention_grid(geometry), query_tile, 0, stream>>>(geometry, q, gradient, lse, delta, result);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    };
    if (geometry.dropout.active())
      launch.template operator()<true>();
    else
      launch.template operator()<false>();
  });
}

void sequence_pool_forward(cudaStream_t stream, SequencePooling mode, std::int64_t sequence, const TensorView& x,
                           const TensorView& y) {
  HPCTRAIN_ASSERT(sequence >= 1 && x.cols == sequence * y.cols && x.rows == y.rows && x.dtype == y.dtype,
                  "sequence_pool_forward: " << x.rows << " x " << x.cols << " for " << sequence << " positions");
  if (y.size() == 0) return;
  dispatch_storage(y.dtype, "sequence_pool_forward", [&]<class T>() {
    sequence_pool_forward_kernel<T><<<grid_for(y.size()), block_threads, 0, stream>>>(
        mode, static_cast<const T*>(x.data), static_cast<T*>(y.data), y.rows, sequence, y.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void sequence_pool_backward(cudaStream_t stream, SequencePooling mode, std::int64_t sequence, const TensorView& dy,
                            const TensorView& dx) {
  HPCTRAIN_ASSERT(sequence >= 1 && dx.cols == sequence * dy.cols && dx.rows == dy.rows && dx.dtype == dy.dtype,
                  "sequence_pool_backward: " << dx.rows << " x " << dx.cols << " for " << sequence << " positions");
  if (dx.size() == 0) return;
  dispatch_storage(dx.dtype, "sequence_pool_backward", [&]<class T>() {
    sequence_pool_backward_kernel<T><<<grid_for(dx.size()), block_threads, 0, stream>>>(
        mode, static_cast<const T*>(dy.data), static_cast<T*>(dx.data), dx.rows, sequence, dy.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void embedding_forward(cudaStream_t stream, const std::int32_t* ids, const float* table, std::int64_t vocabulary,
                       const TensorView& y, const float* positions, std::int64_t sequence) {
  if (y.size() == 0) return;
  HPCTRAIN_ASSERT(positions == nullptr || sequence > 0, "embedding_forward: positions without a sequence length");
  dispatch_storage(y.dtype, "embedding_forward", [&]<class T>() {
    embedding_forward_kernel<T><<<grid_for(y.size()), block_threads, 0, stream>>>(
        ids, table, vocabulary, static_cast<T*>(y.data), y.rows, y.cols, positions, sequence);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void embedding_backward(cudaStream_t stream, SequenceScratch& scratch, const std::int32_t* ids, const TensorView& dy,
                        std::int64_t vocabulary, float* dtable, bool accumulate) {
  require_device_storage(dy.dtype, "embedding_backward");
  HPCTRAIN_ASSERT(dy.rows <= std::numeric_limits<std::int32_t>::max() && vocabulary >= 1,
                  "embedding_backward: " << dy.rows << " rows, vocabulary " << vocabulary);
  if (!accumulate)
    HPCTRAIN_CUDA_CHECK(
        cudaMemsetAsync(dtable, 0, static_cast<std::size_t>(vocabulary * dy.cols) * sizeof(float), stream));
  if (dy.size() == 0) return;
  const int rows = static_cast<int>(dy.rows);
  std::size_t temporary_bytes = 0;
  HPCTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temporary_bytes, ids, static_cast<std::int32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), rows, 0, 32, stream));
  const std::size_t pairs_bytes = (static_cast<std::size_t>(rows) * sizeof(std::int32_t) + 255) / 256 * 256;
  auto* base = static_cast<char*>(scratch.sort.reserve(3 * pairs_bytes + temporary_bytes));
  auto* row_numbers = reinterpret_cast<std::int32_t*>(base);
  auto* sorted_ids = reinterpret_cast<std::int32_t*>(base + pairs_bytes);
  auto* sorted_rows = reinterpret_cast<std::int32_t*>(base + 2 * pairs_bytes);
  iota_kernel<<<grid_for(rows), block_threads, 0, stream>>>(row_numbers, rows);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
  HPCTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * pairs_bytes, temporary_bytes, ids, sorted_ids,
                                                      row_numbers, sorted_rows, rows, 0, 32, stream));
  dispatch_storage(dy.dtype, "embedding_backward", [&]<class T>() {
    embedding_segment_sum_kernel<T><<<grid_for(dy.size()), block_threads, 0, stream>>>(
        sorted_ids, sorted_rows, static_cast<const T*>(dy.data), dtable, vocabulary, dy.rows, dy.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hpctrain::cuda
