// Fused multi-head attention on the CPU, flash-attention style: no T x T matrix per head, only tiles of a query block
// by a key block in each thread's scratch.
//
// Forward: one task per (sequence, head, query block), head by head, so that a thread loads a head's keys and values
// (converted to fp32, or fp64 for f64 storage) once for several tasks. The task keeps its queries transposed and
// pre-scaled in a tile, streams the key blocks, and keeps a running maximum m and sum l per query row (the online
// softmax): scores S = K Q^T of a block, P = 2^(S - m_new), l = l 2^(m - m_new) + sum P, O = O 2^(m - m_new) + P V. The
// scores are in base 2 (the scale times log2(e) is folded into the queries), so each probability is one exp2. Causal
// attention stops at the query block's last row, so fully masked blocks are never computed; only the diagonal block is
// masked element by element. The row log-sum-exp lse = ln(2) (m + log2 l) is stored for the backward.
//
// Backward: one task per (sequence, head), which owns that head's dq, dk and dv, so no two threads add into the same
// gradient and the order of every sum is fixed (results are bit-identical for any thread count). Per key block it
// recomputes P = exp(S - lse) block by block over the query blocks that see it, with D_i = rowsum(dO_i * O_i):
// dV += P^T dO, dP = dO V^T, dS = P (dP - D), dK += scale dS^T Q, dQ += scale dS K (dQ accumulated in the task's
// scratch until the last key block).
//
// Dropout on the probabilities (AttentionGeometry::dropout, training): a tile of keep factors (keep / (1 - p), or 0) is
// regenerated from the counter-based mask of kernels/math.hpp wherever a tile of probabilities is formed, the forward
// multiplies P by it after the sums of the online softmax took the undropped P, and the backward forms
// dS = P (dP' factor - D) and dV from P factor. Without dropout none of this runs (the results are those of before).
// The Philox calls run 16 counters at once in vectors (attention_dropout_words); the tests check every element's
// decision against math.hpp's scalar function.
//
// Every product of tiles is one register-blocked loop nest on 64-byte vectors (GCC/Clang vector extensions: AVX-512
// where the compiler targets it, narrower vectors otherwise): the tiles are laid out so that every product broadcasts
// one operand and reads rows of the other (the "transposed" layout S^T (keys, queries) makes the softmax statistics of
// a query a column, i.e. a lane of the vectors).
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numbers>

#include "cpu_common.hpp"
#include "cpu_philox.hpp"
#include "cpu_sequence.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/kernels/math.hpp"

// The 64-byte vector types are passed between this file's internal functions only: the warning that their ABI differs
// without AVX-512 (builds for any x86-64, where each vector is several registers) concerns no caller.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace hpctrain::cpu {
namespace {

// Query rows and keys per tile (equal, so a causal diagonal is one block).
constexpr std::int64_t block = 64;
// The tile product's vectors are one register of the target wide: GCC splits a wider vector-extension type into
// several registers, and 16 accumulators of 64 bytes then spill on AVX2 (this file's attention ran at 0.08-0.12x
// PyTorch's scaled_dot_product_attention on an AMD EPYC with AVX2 before). The results do not depend on the width:
// every operation is per element, in the same order.
constexpr std::size_t simd_bytes = vector_register_bytes;
// Vectors per row of block_rows: 16 accumulators of AVX-512's 32 registers; elsewhere 12 accumulators and the 3 row
// vectors in the 16.
constexpr int max_vectors = simd_bytes == 64 ? 4 : 3;
// Rows of the result computed together by the tile product.
constexpr std::int64_t block_rows = 4;

// One register of the compute type.
template <class C>
struct Simd;
template <>
struct Simd<float> {
  using Vector = float __attribute__((vector_size(simd_bytes)));
  using Integers = std::int32_t __attribute__((vector_size(simd_bytes)));
  static constexpr std::int64_t lanes = simd_bytes / sizeof(float);
};
template <>
struct Simd<double> {
  using Vector = double __attribute__((vector_size(simd_bytes)));
  static constexpr std::int64_t lanes = simd_bytes / sizeof(double);
};

template <class C>
inline typename Simd<C>::Vector load_vector(const C* source) {
  typename Simd<C>::Vector vector;
  std::memcpy(&vector, source, sizeof vector);
  return vector;
}
template <class C>
inline void store_vector(C* destination, const typename Simd<C>::Vector& vector) {
  std::memcpy(destination, &vector, sizeof vector);
}

// c (block_rows x vectors * lanes) (+)= op(a) b over k: a(i, p) = a[i * lda + p], or a[p * lda + i] when a is stored
// transposed; b rows of ldb, c rows of ldc. The accumulators stay in registers for the whole k loop.
template <class C, bool transposed_a, int vectors>
inline void block_product(std::int64_t k, const C* __restrict a, std::int64_t lda, const C* __restrict b,
                          std::int64_t ldb, C* __restrict c, std::int64_t ldc, bool accumulate) {
  using Vector = typename Simd<C>::Vector;
  constexpr std::int64_t lanes = Simd<C>::lanes;
  Vector sums[block_rows][vectors];
  for (std::int64_t r = 0; r < block_rows; ++r)
    for (int v = 0; v < vectors; ++v) sums[r][v] = accumulate ? load_vector(c + r * ldc + v * lanes) : Vector{};
  for (std::int64_t p = 0; p < k; ++p) {
    Vector row[vectors];
    for (int v = 0; v < vectors; ++v) {
      row[v] = load_vector(b + p * ldb + v * lanes);
      // Each row vector is used block_rows times: keep it in a register (left to itself, GCC reloads it from memory
      // for every multiply-add, and the loads, not the multiply-adds, then limit the loop).
#if defined(__AVX512F__)
      __asm__("" : "+v"(row[v]));
#elif defined(__SSE2__)
      __asm__("" : "+x"(row[v]));
#endif
    }
    for (std::int64_t r = 0; r < block_rows; ++r) {
      const C factor = transposed_a ? a[p * lda + r] : a[r * lda + p];
      for (int v = 0; v < vectors; ++v) sums[r][v] += factor * row[v];
    }
  }
  for (std::int64_t r = 0; r < block_rows; ++r)
    for (int v = 0; v < vectors; ++v) store_vector(c + r * ldc + v * lanes, sums[r][v]);
}

// Which part of a product the causal diagonal block needs (the block where keys and queries are the same positions,
// key j visible to query i when j <= i). Rows of the result come in groups of block_rows starting at row r:
enum class Diagonal : std::uint8_t {
  none,               // all of it
  from_row_columns,   // result (keys, queries): columns before r's vector are masked; they are set to zero, not formed
  to_row_products,    // result (queries, ...) summing over keys: keys after r + block_rows - 1 contribute nothing
  from_row_products,  // result (keys, ...) summing over queries: queries before r contribute nothing
};

// c (m x n) (+)= op(a) (m x k) b (k x n), all row-major tiles of the compute type; m a multiple of block_rows, n of
// the vector lanes.
template <class C, bool transposed_a>
void tile_product(std::int64_t m, std::int64_t n, std::int64_t k, const C* a, std::int64_t lda, const C* b,
                  std::int64_t ldb, C* c, std::int64_t ldc, bool accumulate, Diagonal diagonal = Diagonal::none) {
  constexpr std::int64_t lanes = Simd<C>::lanes;
  for (std::int64_t i = 0; i < m; i += block_rows) {
    const std::int64_t first = diagonal == Diagonal::from_row_products ? std::min(i, k) : 0;
    const std::int64_t last = diagonal == Diagonal::to_row_products ? std::min(k, i + block_rows) : k;
    const C* a_rows = transposed_a ? a + first * lda + i : a + i * lda + first;
    const C* b_rows = b + first * ldb;
    std::int64_t j = 0;
    if (diagonal == Diagonal::from_row_columns) {
      j = std::min(n, i / lanes * lanes);
      for (std::int64_t r = 0; r < block_rows; ++r) std::fill_n(c + (i + r) * ldc, j, C(0));
    }
    for (; j < n; j += max_vectors * lanes) {
      C* c_block = c + i * ldc + j;
      switch (std::min<std::int64_t>(max_vectors, (n - j) / lanes)) {
        case 4:
          if constexpr (max_vectors >= 4)
            block_product<C, transposed_a, 4>(last - first, a_rows, lda, b_rows + j, ldb, c_block, ldc, accumulate);
          break;
        case 3:
          block_product<C, transposed_a, 3>(last - first, a_rows, lda, b_rows + j, ldb, c_block, ldc, accumulate);
          break;
        case 2:
          block_product<C, transposed_a, 2>(last - first, a_rows, lda, b_rows + j, ldb, c_block, ldc, accumulate);
          break;
        default:
          block_product<C, transposed_a, 1>(last - first, a_rows, lda, b_rows + j, ldb, c_block, ldc, accumulate);
          break;
      }
    }
  }
}

// 2^x of a vector of floats: a degree-7 polynomial on [-1/2, 1/2] times 2^round(x), vectorised (std::exp2 would be a
// library call per element). Relative error below 3e-7; x <= -127 (and -inf, a masked score) gives exactly 0.
inline void exp2_vector(Simd<float>::Vector& x) {
  using Vector = Simd<float>::Vector;
  using Integers = Simd<float>::Integers;
  const Vector floor_value = Vector{} - 127.0f;
  x = x < floor_value ? floor_value : x;
  const Vector shifter = Vector{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Vector rounded = (x + shifter) - shifter;
  const Vector f = x - rounded;
  // Taylor coefficients of 2^f = e^(f ln 2): (ln 2)^n / n!.
  Vector p = Vector{} + 1.5252733804059840e-5f;
  p = p * f + 1.5403530393381609e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  const Integers exponent = (__builtin_convertvector(rounded, Integers) + 127) << 23;
  x = p * std::bit_cast<Vector>(exponent);
}

// x[i] = 2^x[i] over count (a multiple of the lanes) values.
inline void exp2_in_place(float* x, std::int64_t count) {
  for (std::int64_t i = 0; i < count; i += Simd<float>::lanes) {
    Simd<float>::Vector value = load_vector(x + i);
    exp2_vector(value);
    store_vector(x + i, value);
  }
}
inline void exp2_in_place(double* x, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) x[i] = std::exp2(x[i]);
}

// Scores s (rows x block, one query per column) become s = 2^(s - shift[query]), and sums[query] (when not null) adds
// them, row by row: one pass over the tile.
inline void exp2_shifted(float* s, std::int64_t rows, const float* shift, float* sums) {
  using Vector = Simd<float>::Vector;
  for (std::int64_t i = 0; i < block; i += Simd<float>::lanes) {
    const Vector subtrahend = load_vector(shift + i);
    Vector total = sums != nullptr ? load_vector(sums + i) : Vector{};
    for (std::int64_t j = 0; j < rows; ++j) {
      Vector value = load_vector(s + j * block + i) - subtrahend;
      exp2_vector(value);
      store_vector(s + j * block + i, value);
      total += value;
    }
    if (sums != nullptr) store_vector(sums + i, total);
  }
}
inline void exp2_shifted(double* s, std::int64_t rows, const double* shift, double* sums) {
  for (std::int64_t j = 0; j < rows; ++j)
    for (std::int64_t i = 0; i < block; ++i) {
      s[j * block + i] = std::exp2(s[j * block + i] - shift[i]);
      if (sums != nullptr) sums[i] += s[j * block + i];
    }
}

template <class C>
constexpr C minus_infinity = -std::numeric_limits<C>::infinity();

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Where one head of one sequence lives in the packed rows: qkv (batch * sequence, 3 * width) = [q | k | v], out and
// dout (batch * sequence, width); and the padded sizes of its tiles.

template <class C>
struct HeadLayout {
  std::int64_t qkv_stride = 0, out_stride = 0;  // elements per row
  std::int64_t head_dim = 0, padded_dim = 0;    // padded_dim: head_dim rounded up to the vector lanes (zeros beyond)
  std::int64_t padded_sequence = 0;             // the sequence rounded up to whole blocks

  explicit HeadLayout(const AttentionGeometry& g)
      : qkv_stride(3 * g.width()),
        out_stride(g.width()),
        head_dim(g.head_dim),
        padded_dim(round_up(g.head_dim, Simd<C>::lanes)),
        padded_sequence(round_up(g.sequence, block)) {}
};

// A head's part of a row is head_dim values at a stride of a whole packed row (kilobytes): the hardware prefetchers do
// not follow such strides, so the row `prefetch_rows` ahead is requested while this one is read or written.
constexpr std::int64_t prefetch_rows = 24;

template <int for_writing, class T>
inline void prefetch_row(const T* row, std::int64_t count) {
  const auto* bytes = reinterpret_cast<const char*>(row);
  for (std::size_t offset = 0; offset < static_cast<std::size_t>(count) * sizeof(T); offset += 64)
    __builtin_prefetch(bytes + offset, for_writing);
}

// tile (padded_rows x padded_dim) = the first `count` rows of one head's part (row stride `stride`) in the compute
// type; rows count ... padded_rows - 1 and columns head_dim ... zero.
template <class C, class T>
void load_rows(const T* source, std::int64_t stride, std::int64_t count, std::int64_t padded_rows,
               const HeadLayout<C>& layout, C* tile) {
  const std::int64_t dim = layout.padded_dim;
  for (std::int64_t r = 0; r < std::min(count, prefetch_rows); ++r)
    prefetch_row<0>(source + r * stride, layout.head_dim);
  for (std::int64_t r = 0; r < count; ++r) {
    if (r + prefetch_rows < count) prefetch_row<0>(source + (r + prefetch_rows) * stride, layout.head_dim);
    const T* __restrict in = source + r * stride;
    C* __restrict row = tile + r * dim;
    for (std::int64_t d = 0; d < layout.head_dim; ++d) row[d] = static_cast<C>(load(in[d]));
    std::fill(row + layout.head_dim, row + dim, C(0));
  }
  std::fill(tile + count * dim, tile + padded_rows * dim, C(0));
}

// tile (padded_dim x ld) = rows (count x padded_dim, rows of padded_dim) transposed, times factor.
template <class C>
void transpose_rows(const C* __restrict rows, std::int64_t count, std::int64_t padded_dim, C factor, C* __restrict tile,
                    std::int64_t ld) {
  for (std::int64_t d = 0; d < padded_dim; ++d)
    for (std::int64_t r = 0; r < count; ++r) tile[d * ld + r] = rows[r * padded_dim + d] * factor;
}

// The first `count` rows of one head's part (row stride `stride`) = tile rows (rows of padded_dim) times
// factor(row), rounded to the storage type.
template <class T, class C, class Factor>
void store_rows(const C* tile, std::int64_t count, const HeadLayout<C>& layout, Factor factor, T* destination,
                std::int64_t stride) {
  for (std::int64_t r = 0; r < std::min(count, prefetch_rows); ++r)
    prefetch_row<1>(destination + r * stride, layout.head_dim);
  for (std::int64_t r = 0; r < count; ++r) {
    if (r + prefetch_rows < count) prefetch_row<1>(destination + (r + prefetch_rows) * stride, layout.head_dim);
    const C* __restrict row = tile + r * layout.padded_dim;
    T* __restrict out = destination + r * stride;
    const C row_factor = factor(r);
    for (std::int64_t d = 0; d < layout.head_dim; ++d) out[d] = store<T>(row[d] * row_factor);
  }
}

// Scores s (rows x block, row j = key key_first + j, column i = query query_first + i) at -inf where the key is
// beyond the sequence or, causal, after the query; and for the backward also where the query is beyond the sequence.
template <class C>
void mask_scores(C* s, std::int64_t rows, std::int64_t key_first, std::int64_t query_first, std::int64_t sequence,
                 bool causal, bool mask_queries) {
  for (std::int64_t j = 0; j < rows; ++j) {
    const std::int64_t key = key_first + j;
    C* row = s + j * block;
    if (key >= sequence) {
      std::fill_n(row, block, minus_infinity<C>);
      continue;
    }
    // Queries [query_first, query_first + first_visible) do not see this key.
    const std::int64_t first_visible = causal ? std::clamp<std::int64_t>(key - query_first, 0, block) : 0;
    std::fill_n(row, first_visible, minus_infinity<C>);
    if (mask_queries)
      for (std::int64_t i = std::max<std::int64_t>(first_visible, sequence - query_first); i < block; ++i)
        row[i] = minus_infinity<C>;
  }
}

// Attention dropout's Philox on 16 consecutive counters at once (cpu_philox.hpp; one scalar call per four elements
// would cost more than the tile's products): words[4 g + w] = word w of the bits of group first_group + g, i.e. of
// element index 4 first_group + 4 g + w, exactly what attention_dropout_group_bits gives.
void attention_dropout_words(std::uint64_t key, std::uint32_t layer, std::uint64_t first_group, std::uint32_t* words) {
  philox_words16(key, layer, RngPurpose::attention_dropout, first_group, words);
}

// The dropout keep factors of a tile (rows x block, row j = key key_first + j, column i = query query_first + i, the
// layout of the scores) for head `head` of the sequence whose global sample index is `sample`: keep / (1 - p) or 0 by
// kernels/math.hpp's contract (the keys of a query are consecutive indices: their groups' bits come 16 groups at a
// time), and 0 where the key or the query lies beyond the sequence or (causal) the key after the query.
template <class C>
void dropout_factors(const AttentionGeometry& g, std::uint64_t key, std::int64_t sample, std::int64_t head,
                     std::int64_t key_first, std::int64_t rows, std::int64_t query_first, C* factors) {
  const float p = g.dropout.p;
  const C kept = kernel_math::dropout_scale<C>(p);
  // A query's at most `block` keys start anywhere in a group of four: 17 groups at most, two calls of 16.
  alignas(64) std::uint32_t words[2 * 16 * 4];
  for (std::int64_t i = 0; i < block; ++i) {
    const std::int64_t query = query_first + i;
    std::int64_t key_end = query < g.sequence ? std::min(key_first + rows, g.sequence) : key_first;
    if (g.causal) key_end = std::min(key_end, query + 1);
    const std::int64_t count = std::max<std::int64_t>(key_end - key_first, 0);
    if (count > 0) {
      const std::uint64_t first_index =
          kernel_math::attention_dropout_index(sample, g.heads, head, g.sequence, query, key_first);
      const std::uint64_t offset = first_index & 3u;
      attention_dropout_words(key, g.dropout.layer, first_index >> 2, words);
      if (offset + static_cast<std::uint64_t>(count) > 64)
        attention_dropout_words(key, g.dropout.layer, (first_index >> 2) + 16, words + 64);
      for (std::int64_t j = 0; j < count; ++j)
        factors[j * block + i] = uniform_from_bits(words[offset + static_cast<std::uint64_t>(j)]) >= p ? kept : C(0);
    }
    for (std::int64_t j = count; j < rows; ++j) factors[j * block + i] = C(0);
  }
}

// s (rows x block) *= factors, element by element.
template <class C>
void multiply_tile(C* __restrict s, const C* __restrict factors, std::int64_t rows) {
  for (std::int64_t index = 0; index < rows * block; ++index) s[index] *= factors[index];
}

// Buffers carved from one thread's scratch, each 64-byte aligned.
class Carver {
 public:
  explicit Carver(ScratchBuffer& scratch, std::size_t bytes) : base_(static_cast<char*>(scratch.reserve(bytes))) {}
  template <class C>
  C* take(std::int64_t count) {
    C* taken = reinterpret_cast<C*>(base_ + used_);
    used_ += round_up_to_alignment(static_cast<std::size_t>(count) * sizeof(C));
    return taken;
  }
  template <class C>
  static std::size_t bytes(std::initializer_list<std::int64_t> counts) {
    std::size_t total = 0;
    for (const std::int64_t count : counts) total += round_up_to_alignment(static_cast<std::size_t>(count) * sizeof(C));
    return total;
  }

 private:
  char* base_;
  std::size_t used_ = 0;
};

// Whether a call has enough work to share between threads: a team's start and barrier cost more than the smallest
// calls (and the finite-difference checks make thousands of them).
bool worth_threads(const AttentionGeometry& g) {
  return g.batch * g.heads * g.sequence * g.sequence * g.head_dim > (std::int64_t{1} << 20);
}

template <class T>
void attention_forward_typed(const AttentionGeometry& g, const T* qkv, T* out, compute_t<T>* lse,
                             std::vector<ScratchBuffer>& scratch) {
  using C = compute_t<T>;
  const HeadLayout<C> layout(g);
  const std::int64_t dim = layout.padded_dim, padded_sequence = layout.padded_sequence;
  const std::int64_t query_blocks = padded_sequence / block;
  const std::int64_t tasks = g.batch * g.heads * query_blocks;
  const C score_scale = static_cast<C>(g.scale) * std::numbers::log2e_v<C>;  // scores in base 2
  const std::int64_t whole = padded_sequence * dim;
  const std::size_t bytes = Carver::bytes<C>(
      {whole, whole, dim * block, block * block, block * dim, block, block, block, block, block * block});
  const bool dropout = g.dropout.active();
  const std::uint64_t dropout_key = dropout ? kernel_math::dropout_key(g.dropout.seed, g.dropout.step) : 0;

#pragma omp parallel if (worth_threads(g))
  {
    Carver carver(scratch[static_cast<std::size_t>(omp_get_thread_num())], bytes);
    C* keys = carver.take<C>(whole);            // (padded_sequence, dim): the head's keys
    C* values = carver.take<C>(whole);          // (padded_sequence, dim): the head's values
    C* queries = carver.take<C>(dim * block);   // (dim, block): q^T times score_scale
    C* scores = carver.take<C>(block * block);  // (keys, queries): S^T, then P^T
    C* output = carver.take<C>(block * dim);    // (block, dim): O, unnormalised
    C* running_max = carver.take<C>(block);     // (block) m per query, base 2
    C* running_sum = carver.take<C>(block);     // (block) l per query
    C* block_max = carver.take<C>(block);
    C* rescale = carver.take<C>(block);
    C* keep_factors = carver.take<C>(block * block);  // (keys, queries) dropout's keep / (1 - p) or 0
    std::int64_t loaded_head = -1;                    // the (sequence, head) whose keys and values this thread holds

    // Tasks run head by head, the last (causal: longest) query block of each first, so a thread's consecutive tasks
    // mostly share one head's keys and values, loaded once.
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t query_block = query_blocks - 1 - task % query_blocks;
      const std::int64_t head_index = task / query_blocks;  // sequence * heads + head
      const std::int64_t head = head_index % g.heads;
      const std::int64_t sequence_index = head_index / g.heads;
      const std::int64_t query_first = query_block * block;
      const std::int64_t query_count = std::min(block, g.sequence - query_first);
      const T* head_rows = qkv + sequence_index * g.sequence * layout.qkv_stride + head * g.head_dim;
      if (head_index != loaded_head) {
        load_rows(head_rows + g.width(), layout.qkv_stride, g.sequence, padded_sequence, layout, keys);
        load_rows(head_rows + 2 * g.width(), layout.qkv_stride, g.sequence, padded_sequence, layout, values);
        loaded_head = head_index;
      }
      load_rows(head_rows + query_first * layout.qkv_stride, layout.qkv_stride, query_count, block, layout, output);
      transpose_rows(output, block, dim, score_scale, queries, block);
      std::fill_n(running_max, block, minus_infinity<C>);
      std::fill_n(running_sum, block, C(0));
      std::fill_n(output, block * dim, C(0));

      const std::int64_t key_end = g.causal ? query_first + query_count : g.sequence;
      for (std::int64_t key_first = 0; key_first < key_end; key_first += block) {
        const std::int64_t key_rows = round_up(std::min(block, key_end - key_first), block_rows);
        const C* key_block = keys + key_first * dim;
        // The causal diagonal block: each row group of keys or queries forms only the part it sees.
        const bool diagonal = g.causal && key_first == query_first;
        tile_product<C, false>(key_rows, block, dim, key_block, dim, queries, block, scores, block, false,
                               diagonal ? Diagonal::from_row_columns : Diagonal::none);
        if (key_first + key_rows > g.sequence || (g.causal && key_first + key_rows > query_first + 1))
          mask_scores(scores, key_rows, key_first, query_first, g.sequence, g.causal, false);

        // Online softmax, one query per lane: every query has seen key 0 after the first block, so the maximum is
        // finite from then on and 2^(-inf - m) = 0 for masked scores.
        std::copy_n(scores, block, block_max);
        for (std::int64_t j = 1; j < key_rows; ++j)
          for (std::int64_t i = 0; i < block; ++i) block_max[i] = std::max(block_max[i], scores[j * block + i]);
        for (std::int64_t i = 0; i < block; ++i) {
          const C new_max = std::max(running_max[i], block_max[i]);
          rescale[i] = running_max[i] - new_max;
          running_max[i] = new_max;
        }
        exp2_in_place(rescale, block);
        for (std::int64_t i = 0; i < block; ++i) running_sum[i] *= rescale[i];
        exp2_shifted(scores, key_rows, running_max, running_sum);
        if (dropout) {  // the sums above took the undropped P
          dropout_factors(g, dropout_key, g.dropout.sample_ids[sequence_index], head, key_first, key_rows, query_first,
                          keep_factors);
          multiply_tile(scores, keep_factors, key_rows);
        }
        for (std::int64_t i = 0; i < block; ++i)
          for (std::int64_t d = 0; d < dim; ++d) output[i * dim + d] *= rescale[i];
        // O (queries, dim) += P V, P read from P^T.
        tile_product<C, true>(block, dim, key_rows, scores, block, values + key_first * dim, dim, output, dim, true,
                              diagonal ? Diagonal::to_row_products : Diagonal::none);
      }

      T* out_rows = out + (sequence_index * g.sequence + query_first) * layout.out_stride + head * g.head_dim;
      store_rows(
          output, query_count, layout, [&](std::int64_t i) { return C(1) / running_sum[i]; }, out_rows,
          layout.out_stride);
      C* lse_rows = lse + head_index * g.sequence + query_first;
      for (std::int64_t i = 0; i < query_count; ++i)
        lse_rows[i] = (running_max[i] + std::log2(running_sum[i])) * std::numbers::ln2_v<C>;
    }
  }
}

template <class T>
void attention_backward_typed(const AttentionGeometry& g, const T* qkv, const T* out, const T* dout,
                              const compute_t<T>* lse, T* dqkv, std::vector<ScratchBuffer>& scratch) {
  using C = compute_t<T>;
  const HeadLayout<C> layout(g);
  const std::int64_t dim = layout.padded_dim, padded_sequence = layout.padded_sequence;
  const std::int64_t key_blocks = padded_sequence / block;
  const C scale = static_cast<C>(g.scale);
  const C score_scale = scale * std::numbers::log2e_v<C>;
  const std::int64_t whole = dim * padded_sequence;
  const std::size_t bytes =
      Carver::bytes<C>({whole, whole, whole, whole, whole, padded_sequence, padded_sequence, block * dim, block * dim,
                        block * dim, block * dim, block * block, block * block, block * block});
  const bool dropout = g.dropout.active();
  const std::uint64_t dropout_key = dropout ? kernel_math::dropout_key(g.dropout.seed, g.dropout.step) : 0;

#pragma omp parallel if (worth_threads(g))
  {
    Carver carver(scratch[static_cast<std::size_t>(omp_get_thread_num())], bytes);
    C* queries_scaled = carver.take<C>(whole);         // (dim, padded_sequence): q^T times score_scale
    C* queries = carver.take<C>(whole);                // (padded_sequence, dim)
    C* dout_columns = carver.take<C>(whole);           // (dim, padded_sequence): dO^T
    C* dout_rows = carver.take<C>(whole);              // (padded_sequence, dim)
    C* dquery = carver.take<C>(whole);                 // (dim, padded_sequence): dQ^T / scale, summed over key blocks
    C* lse2 = carver.take<C>(padded_sequence);         // (padded_sequence) lse in base 2
    C* delta = carver.take<C>(padded_sequence);        // (padded_sequence) D_i = rowsum(dO_i * O_i)
    C* keys = carver.take<C>(block * dim);             // (block, dim)
    C* values = carver.take<C>(block * dim);           // (block, dim)
    C* dkey = carver.take<C>(block * dim);             // (block, dim) dK / scale
    C* dvalue = carver.take<C>(block * dim);           // (block, dim)
    C* probabilities = carver.take<C>(block * block);  // (keys, queries) P^T
    C* dscores = carver.take<C>(block * block);        // (keys, queries) dP^T, then dS^T
    C* keep_factors = carver.take<C>(block * block);   // (keys, queries) dropout's keep / (1 - p) or 0

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < g.batch * g.heads; ++task) {
      const std::int64_t head = task % g.heads;
      const std::int64_t sequence_index = task / g.heads;
      const std::int64_t first_row = sequence_index * g.sequence;
      const T* q = qkv + first_row * layout.qkv_stride + head * g.head_dim;
      const T* k = q + g.width();
      const T* v = q + 2 * g.width();
      const std::int64_t out_offset = first_row * layout.out_stride + head * g.head_dim;
      const T* o = out + out_offset;
      const T* gradient = dout + out_offset;

      load_rows(q, layout.qkv_stride, g.sequence, padded_sequence, layout, queries);
      transpose_rows(queries, padded_sequence, dim, score_scale, queries_scaled, padded_sequence);
      load_rows(gradient, layout.out_stride, g.sequence, padded_sequence, layout, dout_rows);
      transpose_rows(dout_rows, padded_sequence, dim, C(1), dout_columns, padded_sequence);
      std::fill_n(dquery, whole, C(0));
      const C* head_lse = lse + (sequence_index * g.heads + head) * g.sequence;
      std::fill_n(delta, padded_sequence, C(0));
      std::fill_n(lse2, padded_sequence, C(0));
      for (std::int64_t i = 0; i < g.sequence; ++i) {
        if (i + prefetch_rows < g.sequence) prefetch_row<0>(o + (i + prefetch_rows) * layout.out_stride, g.head_dim);
        C sum = 0;
        for (std::int64_t d = 0; d < g.head_dim; ++d)
          sum += dout_rows[i * dim + d] * static_cast<C>(load(o[i * layout.out_stride + d]));
        delta[i] = sum;
        lse2[i] = head_lse[i] * std::numbers::log2e_v<C>;
      }

      for (std::int64_t key_block = 0; key_block < key_blocks; ++key_block) {
        const std::int64_t key_first = key_block * block;
        const std::int64_t key_count = std::min(block, g.sequence - key_first);
        const std::int64_t key_rows = round_up(key_count, block_rows);
        load_rows(k + key_first * layout.qkv_stride, layout.qkv_stride, key_count, key_rows, layout, keys);
        load_rows(v + key_first * layout.qkv_stride, layout.qkv_stride, key_count, key_rows, layout, values);
        std::fill_n(dkey, key_rows * dim, C(0));
        std::fill_n(dvalue, key_rows * dim, C(0));
        // Causal: query blocks before this key block see none of its keys.
        for (std::int64_t query_first = g.causal ? key_first : 0; query_first < g.sequence; query_first += block) {
          const bool diagonal = g.causal && key_first == query_first;
          const Diagonal columns = diagonal ? Diagonal::from_row_columns : Diagonal::none;
          tile_product<C, false>(key_rows, block, dim, keys, dim, queries_scaled + query_first, padded_sequence,
                                 probabilities, block, false, columns);
          mask_scores(probabilities, key_rows, key_first, query_first, g.sequence, g.causal, true);
          exp2_shifted(probabilities, key_rows, lse2 + query_first, static_cast<C*>(nullptr));
          tile_product<C, false>(key_rows, block, dim, values, dim, dout_columns + query_first, padded_sequence,
                                 dscores, block, false, columns);
          if (dropout) {
            // dscores holds dP' = dO V^T of the dropped probabilities: dS = P (dP' factor - D), then P' = P factor.
            dropout_factors(g, dropout_key, g.dropout.sample_ids[sequence_index], head, key_first, key_rows,
                            query_first, keep_factors);
            for (std::int64_t j = 0; j < key_rows; ++j)
              for (std::int64_t i = 0; i < block; ++i)
                dscores[j * block + i] =
                    probabilities[j * block + i] *
                    (dscores[j * block + i] * keep_factors[j * block + i] - delta[query_first + i]);
            multiply_tile(probabilities, keep_factors, key_rows);
          } else {
            for (std::int64_t j = 0; j < key_rows; ++j)
              for (std::int64_t i = 0; i < block; ++i)
                dscores[j * block + i] =
                    probabilities[j * block + i] * (dscores[j * block + i] - delta[query_first + i]);
          }
          const Diagonal over_queries = diagonal ? Diagonal::from_row_products : Diagonal::none;
          tile_product<C, false>(key_rows, dim, block, probabilities, block, dout_rows + query_first * dim, dim, dvalue,
                                 dim, true, over_queries);
          tile_product<C, false>(key_rows, dim, block, dscores, block, queries + query_first * dim, dim, dkey, dim,
                                 true, over_queries);
          // dQ (queries, dim) += dS K, dS read from dS^T.
          tile_product<C, true>(block, dim, key_rows, dscores, block, keys, dim, dquery + query_first * dim, dim, true,
                                diagonal ? Diagonal::to_row_products : Diagonal::none);
        }
        T* dk = dqkv + (first_row + key_first) * layout.qkv_stride + g.width() + head * g.head_dim;
        store_rows(
            dkey, key_count, layout, [scale](std::int64_t) { return scale; }, dk, layout.qkv_stride);
        store_rows(
            dvalue, key_count, layout, [](std::int64_t) { return C(1); }, dk + g.width(), layout.qkv_stride);
      }
      store_rows(
          dquery, g.sequence, layout, [scale](std::int64_t) { return scale; },
          dqkv + first_row * layout.qkv_stride + head * g.head_dim, layout.qkv_stride);
    }
  }
}

void check_geometry(const AttentionGeometry& g, const TensorView& qkv, const TensorView& out, const char* what) {
  HPCTRAIN_ASSERT(g.batch >= 0 && g.sequence >= 1 && g.heads >= 1 && g.head_dim >= 1,
                  what << ": geometry batch " << g.batch << ", sequence " << g.sequence << ", heads " << g.heads
                       << ", head_dim " << g.head_dim);
  HPCTRAIN_ASSERT(qkv.rows == g.batch * g.sequence && qkv.cols == 3 * g.width() && out.rows == qkv.rows &&
                      out.cols == g.width() && out.dtype == qkv.dtype,
                  what << ": qkv " << qkv.rows << "x" << qkv.cols << " " << dtype_name(qkv.dtype) << " and out "
                       << out.rows << "x" << out.cols << " " << dtype_name(out.dtype) << " do not match batch "
                       << g.batch << " x sequence " << g.sequence << ", " << g.heads << " heads of " << g.head_dim);
  HPCTRAIN_ASSERT(!g.dropout.active() || (g.dropout.sample_ids != nullptr && g.dropout.p < 1.0f),
                  what << ": dropout p = " << g.dropout.p << " needs sample ids and p < 1");
}

}  // namespace

std::vector<ScratchBuffer>& CpuAttention::thread_scratch() {
  const auto threads = static_cast<std::size_t>(omp_get_max_threads());
  if (thread_scratch_.size() < threads) thread_scratch_.resize(threads);
  return thread_scratch_;
}

void CpuAttention::forward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out, void* lse) {
  check_geometry(geometry, qkv, out, "attention_forward");
  HPCTRAIN_ASSERT(out.data != qkv.data, "attention_forward: out must not alias qkv");
  if (qkv.rows == 0) return;
  auto& scratch = thread_scratch();
  dispatch_dtype(qkv.dtype, [&]<class T>() {
    attention_forward_typed(geometry, static_cast<const T*>(qkv.data), static_cast<T*>(out.data),
                            static_cast<compute_t<T>*>(lse), scratch);
  });
}

void CpuAttention::backward(const AttentionGeometry& geometry, const TensorView& qkv, const TensorView& out,
                            const TensorView& dout, const void* lse, const TensorView& dqkv) {
  check_geometry(geometry, qkv, out, "attention_backward");
  check_geometry(geometry, dqkv, dout, "attention_backward (gradients)");
  HPCTRAIN_ASSERT(dqkv.dtype == qkv.dtype,
                  "attention_backward: dqkv is " << dtype_name(dqkv.dtype) << ", qkv " << dtype_name(qkv.dtype));
  if (qkv.rows == 0) return;
  auto& scratch = thread_scratch();
  dispatch_dtype(qkv.dtype, [&]<class T>() {
    attention_backward_typed(geometry, static_cast<const T*>(qkv.data), static_cast<const T*>(out.data),
                             static_cast<const T*>(dout.data), static_cast<const compute_t<T>*>(lse),
                             static_cast<T*>(dqkv.data), scratch);
  });
}

}  // namespace hpctrain::cpu
