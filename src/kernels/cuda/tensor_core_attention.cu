// Flash attention on tensor cores (see tensor_core_attention.hpp and hpctrain/kernels/cuda/attention_plan.hpp): the
// FlashAttention-2 scheme written for this backend's packed qkv, with the reference kernel's contract and results up to
// 16-bit rounding. Storage bf16/fp16; products on tensor cores through mma.sync.m16n8k16 (16-bit operands, fp32
// accumulators); softmax, its running maximum and sum, lse and D = rowsum(dO * O) in fp32. No T x T buffer anywhere:
// scores live in registers, one 16 x 64 (or 16 x 32) slice per warp at a time.
//
// Layout: a block is 4 warps owning 64 rows of one (sequence, head); each warp owns 16 of them. Tiles of 64 (or 32)
// rows of the other side are copied into shared memory as 16-bit values, row stride head_dim + 8 (conflict-free
// fragment loads), zeros past the sequence. Operand fragments are read from shared memory with 32-bit loads where the
// pair of elements is adjacent in a row (Q, K, dO as the A operand or as K^T-style B operands) and with two 16-bit
// loads where it is adjacent in a column (V, dO, Q, K as the B operand of P V, P^T dO, dS^T Q, dS K). The 16 x 8
// accumulator fragments of two neighbouring column tiles are exactly the A fragment of a 16 x 16 product, so P and dS
// go from the accumulators to the next product without shared memory (rounded to the storage type on the way, as in
// FlashAttention-2). Scores are in base 2 (scale * log2(e) folded in); lse is stored in natural-log units.
// - Forward: per query block, key tiles up to its last query when causal (so fully masked tiles are never loaded);
//   online softmax per row (running maximum and sum, the 4 lanes of a row combined by xor shuffles).
// - Backward: D by a small kernel, then one kernel per key block that owns dK and dV of its 64 keys over the query
//   tiles that see them, and one per query block that owns dQ over its key tiles; P = 2^(S - lse2) is recomputed in
//   both. Each gradient element is accumulated by one lane in a fixed order: no atomics, identical bits run to run.
// A fragment's lanes: lane = 4 * group + member; A (16 x 16) rows group and group + 8, columns 2 member (+1) and
// 2 member + 8 (+1); B (16 x 8) rows 2 member (+1) and 2 member + 8 (+1), column group; C (16 x 8) rows group and
// group + 8, columns 2 member (+1) (PTX ISA, "Matrix fragments for mma.m16n8k16").
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "cuda_device.cuh"
#include "hpctrain/kernels/cuda/attention_plan.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "tensor_core_attention.hpp"

namespace hpctrain::cuda {
namespace {

constexpr float log2e = 1.4426950408889634f;
constexpr float ln2 = 0.6931471805599453f;
constexpr float minus_infinity = -std::numeric_limits<float>::infinity();
constexpr unsigned full_warp = 0xffffffffu;

// Where one (sequence, head) lives: qkv rows of 3 * width ([q | k | v]), out/dout rows of width, lse/delta rows.
struct HeadOffsets {
  std::int64_t width, qkv_stride, qkv_offset, out_offset, lse_offset;
  __device__ HeadOffsets(const AttentionGeometry& g, std::int64_t batch_head) {
    width = g.heads * g.head_dim;
    qkv_stride = 3 * width;
    const std::int64_t b = batch_head / g.heads, h = batch_head % g.heads;
    qkv_offset = b * g.sequence * qkv_stride + h * g.head_dim;
    out_offset = b * g.sequence * width + h * g.head_dim;
    lse_offset = batch_head * g.sequence;
  }
};

__device__ __forceinline__ bool visible(const AttentionGeometry& g, std::int64_t query, std::int64_t key) {
  return query < g.sequence && key < g.sequence && (!g.causal || key <= query);
}

struct Lane {
  int group, member;
};
__device__ __forceinline__ Lane lane_of() {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  return {lane / 4, lane % 4};
}
__device__ __forceinline__ int warp_first_row() { return static_cast<int>(threadIdx.x) / 32 * 16; }

// Two fp32 values rounded to T, `low` in the low half (the lower column index).
template <class T>
__device__ __forceinline__ std::uint32_t pack_pair(float low, float high) {
  if constexpr (std::is_same_v<T, bf16>) {
    return static_cast<std::uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(low))) |
           static_cast<std::uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(high))) << 16;
  } else {
    static_assert(std::is_same_v<T, fp16>);
    return static_cast<std::uint32_t>(__half_as_ushort(__float2half_rn(low))) |
           static_cast<std::uint32_t>(__half_as_ushort(__float2half_rn(high))) << 16;
  }
}

// c += a b on tensor cores: a 16 x 16, b 16 x 8 (16-bit T), c 16 x 8 fp32.
template <class T>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, bf16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  __trap();  // choose_attention_kernel never picks these kernels below compute capability 8.0
#endif
}

// Two 16-bit elements of a shared tile: (row, col) and (row, col + 1), or (row, col) and (row + 1, col).
template <int Stride>
__device__ __forceinline__ std::uint32_t pair_in_row(const std::uint16_t* tile, int row, int col) {
  return *reinterpret_cast<const std::uint32_t*>(tile + row * Stride + col);
}
template <int Stride>
__device__ __forceinline__ std::uint32_t pair_in_column(const std::uint16_t* tile, int row, int col) {
  return static_cast<std::uint32_t>(tile[row * Stride + col]) |
         static_cast<std::uint32_t>(tile[(row + 1) * Stride + col]) << 16;
}

// A operand: rows first_row.. and columns first_col.. of a row-major tile (A[r][k] = tile[r][k]).
template <int Stride>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const std::uint16_t* tile, int first_row, int first_col,
                                       Lane lane) {
  const int r = first_row + lane.group, c = first_col + 2 * lane.member;
  a[0] = pair_in_row<Stride>(tile, r, c);
  a[1] = pair_in_row<Stride>(tile, r + 8, c);
  a[2] = pair_in_row<Stride>(tile, r, c + 8);
  a[3] = pair_in_row<Stride>(tile, r + 8, c + 8);
}
// B operand of a product with a tile's transpose: B[k][n] = tile[first_n + n][first_k + k] (K in Q K^T).
template <int Stride>
__device__ __forceinline__ void load_b_of_transpose(std::uint32_t (&b)[2], const std::uint16_t* tile, int first_n,
                                                    int first_k, Lane lane) {
  const int n = first_n + lane.group, k = first_k + 2 * lane.member;
  b[0] = pair_in_row<Stride>(tile, n, k);
  b[1] = pair_in_row<Stride>(tile, n, k + 8);
}
// B operand of a product with the tile itself: B[k][n] = tile[first_k + k][first_n + n] (V in P V).
template <int Stride>
__device__ __forceinline__ void load_b(std::uint32_t (&b)[2], const std::uint16_t* tile, int first_k, int first_n,
                                       Lane lane) {
  const int k = first_k + 2 * lane.member, n = first_n + lane.group;
  b[0] = pair_in_column<Stride>(tile, k, n);
  b[1] = pair_in_column<Stride>(tile, k + 8, n);
}
// The A operand (16 x 16) made of the accumulators of two neighbouring 16 x 8 column tiles, rounded to T.
template <class T>
__device__ __forceinline__ void accumulators_to_a(std::uint32_t (&a)[4], const float (&left)[4],
                                                  const float (&right)[4]) {
  a[0] = pack_pair<T>(left[0], left[1]);
  a[1] = pack_pair<T>(left[2], left[3]);
  a[2] = pack_pair<T>(right[0], right[1]);
  a[3] = pack_pair<T>(right[2], right[3]);
}

// c[n] (+)= A B over the columns of a tile pair: A rows [first_row, +16) of `a_tile` (k = 0..D-1), B the transpose of
// rows [0, 8 * N) of `b_tile` (c = A b_tile^T: scores Q K^T, K Q^T, dO V^T, V dO^T).
template <class T, int D, int N>
__device__ __forceinline__ void product_with_transpose(float (&c)[N][4], const std::uint16_t* a_tile, int first_row,
                                                       const std::uint16_t* b_tile, Lane lane) {
  constexpr int Stride = tc_row_stride(D);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[4];
    load_a<Stride>(a, a_tile, first_row, 16 * kk, lane);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      std::uint32_t b[2];
      load_b_of_transpose<Stride>(b, b_tile, 8 * n, 16 * kk, lane);
      mma_16x8x16<T>(c[n], a, b);
    }
  }
}

// c += P B: P the warp's 16 x (16 K) fp32 accumulators (rounded to T), B = rows [0, 16 K) of `b_tile`, D columns
// (P V, P^T dO, dS^T Q, dS K).
template <class T, int D, int K>
__device__ __forceinline__ void accumulate_product(float (&c)[D / 8][4], const float (&p)[2 * K][4],
                                                   const std::uint16_t* b_tile, Lane lane) {
  constexpr int Stride = tc_row_stride(D);
#pragma unroll
  for (int kk = 0; kk < K; ++kk) {
    std::uint32_t a[4];
    accumulators_to_a<T>(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      std::uint32_t b[2];
      load_b<Stride>(b, b_tile, 16 * kk, 8 * n, lane);
      mma_16x8x16<T>(c[n], a, b);
    }
  }
}

// Rows [first, first + Rows) of a head's part (row stride `stride` elements, D columns from `source`) into a shared
// tile, zeros past the sequence. 16-byte pieces; every thread of the block takes part.
template <class T, int D, int Rows>
__device__ __forceinline__ void load_tile(const T* source, std::int64_t stride, std::int64_t first,
                                          std::int64_t sequence, std::uint16_t* tile) {
  constexpr int pieces = D / 8;
  for (int index = static_cast<int>(threadIdx.x); index < Rows * pieces; index += tc_threads) {
    const int r = index / pieces, piece = index % pieces;
    const std::int64_t position = first + r;
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (position < sequence) value = *reinterpret_cast<const uint4*>(source + position * stride + piece * 8);
    *reinterpret_cast<uint4*>(tile + r * tc_row_stride(D) + piece * 8) = value;
  }
}

// Writes the warp's 16 x D accumulators times `factor` to rows own[0] (c[.][0..1]) and own[1] (c[.][2..3]) of a
// head's part (row stride `stride`), rows past the sequence skipped.
template <class T, int D>
__device__ __forceinline__ void store_rows(const float (&c)[D / 8][4], const float (&factor)[2], T* destination,
                                           std::int64_t stride, const std::int64_t (&own)[2], std::int64_t sequence,
                                           Lane lane) {
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    if (own[row] >= sequence) continue;
    T* target = destination + own[row] * stride + 2 * lane.member;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<std::uint32_t*>(target + 8 * n) =
          pack_pair<T>(c[n][2 * row] * factor[row], c[n][2 * row + 1] * factor[row]);
  }
}

template <class T, int D>
__global__ void __launch_bounds__(tc_threads)
    tc_attention_forward_kernel(AttentionGeometry g, const T* qkv, T* out, float* lse) {
  constexpr int Keys = tc_forward_stream_rows(D), Stride = tc_row_stride(D);
  extern __shared__ uint4 shared_memory[];
  auto* queries = reinterpret_cast<std::uint16_t*>(shared_memory);
  auto* keys = queries + tc_block_rows * Stride;
  auto* values = keys + Keys * Stride;
  const Lane lane = lane_of();
  const int warp_row = warp_first_row();
  const HeadOffsets head(g, blockIdx.x);
  const std::int64_t query_first = static_cast<std::int64_t>(blockIdx.y) * tc_block_rows;
  const std::int64_t own[2] = {query_first + warp_row + lane.group, query_first + warp_row + lane.group + 8};
  const T* q = qkv + head.qkv_offset;
  const float score_scale = g.scale * log2e;
  load_tile<T, D, tc_block_rows>(q, head.qkv_stride, query_first, g.sequence, queries);

  float output[D / 8][4] = {};
  float running_max[2] = {minus_infinity, minus_infinity}, running_sum[2] = {0.0f, 0.0f};
  const std::int64_t end = g.causal ? std::min<std::int64_t>(g.sequence, query_first + tc_block_rows) : g.sequence;
  for (std::int64_t key_first = 0; key_first < end; key_first += Keys) {
    __syncthreads();  // the previous tiles are read (and the query tile is stored)
    load_tile<T, D, Keys>(q + head.width, head.qkv_stride, key_first, g.sequence, keys);
    load_tile<T, D, Keys>(q + 2 * head.width, head.qkv_stride, key_first, g.sequence, values);
    __syncthreads();
    float scores[Keys / 8][4] = {};
    product_with_transpose<T, D, Keys / 8>(scores, queries, warp_row, keys, lane);
    float tile_max[2] = {minus_infinity, minus_infinity};
#pragma unroll
    for (int n = 0; n < Keys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const std::int64_t key = key_first + 8 * n + 2 * lane.member + (e & 1);
        const float score = visible(g, own[e / 2], key) ? scores[n][e] * score_scale : minus_infinity;
        scores[n][e] = score;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], score);
      }
    float base[2];
#pragma unroll
    for (int row = 0; row < 2; ++row) {  // the 4 lanes of a row hold its 64 scores: combine their maxima
      tile_max[row] = fmaxf(tile_max[row], __shfl_xor_sync(full_warp, tile_max[row], 1));
      tile_max[row] = fmaxf(tile_max[row], __shfl_xor_sync(full_warp, tile_max[row], 2));
      const float new_max = fmaxf(running_max[row], tile_max[row]);
      base[row] = new_max == minus_infinity ? 0.0f : new_max;  // a row past the sequence: every p is 0
      const float rescale = exp2f(running_max[row] - base[row]);
      running_sum[row] *= rescale;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        output[n][2 * row] *= rescale;
        output[n][2 * row + 1] *= rescale;
      }
      running_max[row] = new_max;
    }
#pragma unroll
    for (int n = 0; n < Keys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(scores[n][e] - base[e / 2]);
        scores[n][e] = p;
        running_sum[e / 2] += p;
      }
    accumulate_product<T, D, Keys / 16>(output, scores, values, lane);
  }
  float inverse[2];
#pragma unroll
  for (int row = 0; row < 2; ++row) {  // each lane summed its own columns: add the 4 lanes' sums
    running_sum[row] += __shfl_xor_sync(full_warp, running_sum[row], 1);
    running_sum[row] += __shfl_xor_sync(full_warp, running_sum[row], 2);
    inverse[row] = 1.0f / running_sum[row];
    if (lane.member == 0 && own[row] < g.sequence)
      lse[head.lse_offset + own[row]] = (running_max[row] + log2f(running_sum[row])) * ln2;
  }
  store_rows<T, D>(output, inverse, out + head.out_offset, head.width, own, g.sequence, lane);
}

// delta[(batch * heads + head) * sequence + t] = sum_d dout * out of that row's head, in d order.
template <class T, int D>
__global__ void tc_attention_delta_kernel(AttentionGeometry g, const T* out, const T* dout, float* delta) {
  const std::int64_t total = g.batch * g.heads * g.sequence, width = g.heads * D;
  for (std::int64_t index = global_thread(); index < total; index += grid_threads()) {
    const std::int64_t t = index % g.sequence, batch_head = index / g.sequence;
    const std::int64_t offset = (batch_head / g.heads * g.sequence + t) * width + batch_head % g.heads * D;
    float sum = 0.0f;
#pragma unroll
    for (int piece = 0; piece < D / 8; ++piece) {
      const auto o = *reinterpret_cast<const Pack<T, 8>*>(out + offset + 8 * piece);
      const auto d = *reinterpret_cast<const Pack<T, 8>*>(dout + offset + 8 * piece);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += load(d.v[i]) * load(o.v[i]);
    }
    delta[index] = sum;
  }
}

// dK and dV of one block of 64 keys (a warp per 16) over the query tiles that see them.
template <class T, int D>
__global__ void __launch_bounds__(tc_threads) tc_attention_dkdv_kernel(AttentionGeometry g, const T* qkv, const T* dout,
                                                                       const float* lse, const float* delta, T* dqkv) {
  constexpr int Queries = tc_backward_stream_rows(D), Stride = tc_row_stride(D);
  extern __shared__ uint4 shared_memory[];
  auto* keys = reinterpret_cast<std::uint16_t*>(shared_memory);
  auto* values = keys + tc_block_rows * Stride;
  auto* queries = values + tc_block_rows * Stride;
  auto* gradients = queries + Queries * Stride;
  auto* lse2 = reinterpret_cast<float*>(gradients + Queries * Stride);
  auto* deltas = lse2 + Queries;
  const Lane lane = lane_of();
  const int warp_row = warp_first_row();
  const HeadOffsets head(g, blockIdx.x);
  const std::int64_t key_first = static_cast<std::int64_t>(blockIdx.y) * tc_block_rows;
  const std::int64_t own[2] = {key_first + warp_row + lane.group, key_first + warp_row + lane.group + 8};
  const T* q = qkv + head.qkv_offset;
  const T* gradient = dout + head.out_offset;
  const float score_scale = g.scale * log2e;
  load_tile<T, D, tc_block_rows>(q + head.width, head.qkv_stride, key_first, g.sequence, keys);
  load_tile<T, D, tc_block_rows>(q + 2 * head.width, head.qkv_stride, key_first, g.sequence, values);

  float dkey[D / 8][4] = {}, dvalue[D / 8][4] = {};
  // Causal: query tiles before this key block see none of its keys (key_first is a multiple of Queries).
  for (std::int64_t query_first = g.causal ? key_first : 0; query_first < g.sequence; query_first += Queries) {
    __syncthreads();  // the previous tiles are read (and the key and value tiles are stored)
    load_tile<T, D, Queries>(q, head.qkv_stride, query_first, g.sequence, queries);
    load_tile<T, D, Queries>(gradient, head.width, query_first, g.sequence, gradients);
    for (int i = static_cast<int>(threadIdx.x); i < Queries; i += tc_threads) {
      const std::int64_t position = query_first + i;
      lse2[i] = position < g.sequence ? lse[head.lse_offset + position] * log2e : 0.0f;
      deltas[i] = position < g.sequence ? delta[head.lse_offset + position] : 0.0f;
    }
    __syncthreads();
    // P^T (16 keys x Queries) = 2^(scale log2(e) K Q^T - lse2), 0 where masked.
    float probabilities[Queries / 8][4] = {};
    product_with_transpose<T, D, Queries / 8>(probabilities, keys, warp_row, queries, lane);
#pragma unroll
    for (int n = 0; n < Queries / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = 8 * n + 2 * lane.member + (e & 1);
        probabilities[n][e] = visible(g, query_first + column, own[e / 2])
                                  ? exp2f(probabilities[n][e] * score_scale - lse2[column])
                                  : 0.0f;
      }
    accumulate_product<T, D, Queries / 16>(dvalue, probabilities, gradients, lane);  // dV += P^T dO
    // dS^T = P^T (dP^T - D), dP^T = V dO^T.
    float dscores[Queries / 8][4] = {};
    product_with_transpose<T, D, Queries / 8>(dscores, values, warp_row, gradients, lane);
#pragma unroll
    for (int n = 0; n < Queries / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = 8 * n + 2 * lane.member + (e & 1);
        dscores[n][e] = probabilities[n][e] * (dscores[n][e] - deltas[column]);
      }
    accumulate_product<T, D, Queries / 16>(dkey, dscores, queries, lane);  // dK += dS^T Q (scale applied at the end)
  }
  const float key_factor[2] = {g.scale, g.scale}, value_factor[2] = {1.0f, 1.0f};
  store_rows<T, D>(dkey, key_factor, dqkv + head.qkv_offset + head.width, head.qkv_stride, own, g.sequence, lane);
  store_rows<T, D>(dvalue, value_factor, dqkv + head.qkv_offset + 2 * head.width, head.qkv_stride, own, g.sequence,
                   lane);
}

// dQ of one block of 64 queries (a warp per 16) over the key tiles they see.
template <class T, int D>
__global__ void __launch_bounds__(tc_threads) tc_attention_dq_kernel(AttentionGeometry g, const T* qkv, const T* dout,
                                                                     const float* lse, const float* delta, T* dqkv) {
  constexpr int Keys = tc_backward_stream_rows(D), Stride = tc_row_stride(D);
  extern __shared__ uint4 shared_memory[];
  auto* queries = reinterpret_cast<std::uint16_t*>(shared_memory);
  auto* gradients = queries + tc_block_rows * Stride;
  auto* keys = gradients + tc_block_rows * Stride;
  auto* values = keys + Keys * Stride;
  const Lane lane = lane_of();
  const int warp_row = warp_first_row();
  const HeadOffsets head(g, blockIdx.x);
  const std::int64_t query_first = static_cast<std::int64_t>(blockIdx.y) * tc_block_rows;
  const std::int64_t own[2] = {query_first + warp_row + lane.group, query_first + warp_row + lane.group + 8};
  const T* q = qkv + head.qkv_offset;
  const float score_scale = g.scale * log2e;
  load_tile<T, D, tc_block_rows>(q, head.qkv_stride, query_first, g.sequence, queries);
  load_tile<T, D, tc_block_rows>(dout + head.out_offset, head.width, query_first, g.sequence, gradients);
  float own_lse2[2], own_delta[2];
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    const bool inside = own[row] < g.sequence;
    own_lse2[row] = inside ? lse[head.lse_offset + own[row]] * log2e : 0.0f;
    own_delta[row] = inside ? delta[head.lse_offset + own[row]] : 0.0f;
  }

  float dquery[D / 8][4] = {};
  const std::int64_t end = g.causal ? std::min<std::int64_t>(g.sequence, query_first + tc_block_rows) : g.sequence;
  for (std::int64_t key_first = 0; key_first < end; key_first += Keys) {
    __syncthreads();  // the previous tiles are read (and the query and gradient tiles are stored)
    load_tile<T, D, Keys>(q + head.width, head.qkv_stride, key_first, g.sequence, keys);
    load_tile<T, D, Keys>(q + 2 * head.width, head.qkv_stride, key_first, g.sequence, values);
    __syncthreads();
    float probabilities[Keys / 8][4] = {};
    product_with_transpose<T, D, Keys / 8>(probabilities, queries, warp_row, keys, lane);
#pragma unroll
    for (int n = 0; n < Keys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const std::int64_t key = key_first + 8 * n + 2 * lane.member + (e & 1);
        probabilities[n][e] =
            visible(g, own[e / 2], key) ? exp2f(probabilities[n][e] * score_scale - own_lse2[e / 2]) : 0.0f;
      }
    float dscores[Keys / 8][4] = {};
    product_with_transpose<T, D, Keys / 8>(dscores, gradients, warp_row, values, lane);  // dP = dO V^T
#pragma unroll
    for (int n = 0; n < Keys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dscores[n][e] = probabilities[n][e] * (dscores[n][e] - own_delta[e / 2]);
    accumulate_product<T, D, Keys / 16>(dquery, dscores, keys, lane);  // dQ += dS K (scale applied at the end)
  }
  const float query_factor[2] = {g.scale, g.scale};
  store_rows<T, D>(dquery, query_factor, dqkv + head.qkv_offset, head.qkv_stride, own, g.sequence, lane);
}

// f.template operator()<T, D>() for the 16-bit storage type and supported head_dim.
template <class F>
void dispatch_tensor_core(DType dtype, std::int64_t head_dim, F&& f) {
  const auto by_head_dim = [&]<class T>() {
    switch (head_dim) {
      case 32:
        return f.template operator()<T, 32>();
      case 64:
        return f.template operator()<T, 64>();
      case 128:
        return f.template operator()<T, 128>();
      default:
        HPCTRAIN_ASSERT(false, "tensor-core attention: head_dim " << head_dim);
    }
  };
  if (dtype == DType::bf16) return by_head_dim.template operator()<bf16>();
  HPCTRAIN_ASSERT(dtype == DType::f16, "tensor-core attention: " << dtype_name(dtype) << " storage");
  by_head_dim.template operator()<fp16>();
}

// Kernels over the default 48 KiB of shared memory must ask for it (head_dim 128 in the backward). Called at every
// launch: cheap, and valid while a stream is captured.
template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
  if (bytes > tc_default_shared_limit)
    HPCTRAIN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

void check_call(const AttentionGeometry& g, const TensorView& qkv, const TensorView& out, const char* what) {
  HPCTRAIN_ASSERT(g.batch >= 0 && g.sequence >= 1 && g.heads >= 1 && tc_head_dim_supported(g.head_dim) &&
                      qkv.rows == g.batch * g.sequence && qkv.cols == 3 * g.width() && out.rows == qkv.rows &&
                      out.cols == g.width() && out.dtype == qkv.dtype && aligned16(qkv.data) && aligned16(out.data),
                  what << ": qkv " << qkv.rows << "x" << qkv.cols << " and out " << out.rows << "x" << out.cols
                       << " (16-byte aligned) for batch " << g.batch << " x sequence " << g.sequence << ", " << g.heads
                       << " heads of " << g.head_dim);
  HPCTRAIN_ASSERT(tc_grid_fits(tc_grid(g.batch, g.heads, g.sequence)) || g.batch == 0,
                  what << ": " << g.batch * g.heads << " heads, sequence " << g.sequence << ": too large a grid");
}

dim3 grid_of(const AttentionGeometry& g) {
  const TensorCoreGrid grid = tc_grid(g.batch, g.heads, g.sequence);
  return {static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y)};
}

}  // namespace

void tensor_core_attention_forward(cudaStream_t stream, const AttentionGeometry& geometry, const TensorView& qkv,
                                   const TensorView& out, float* lse) {
  check_call(geometry, qkv, out, "tensor_core_attention_forward");
  HPCTRAIN_ASSERT(out.data != qkv.data, "tensor_core_attention_forward: out must not alias qkv");
  if (qkv.rows == 0) return;
  dispatch_tensor_core(qkv.dtype, geometry.head_dim, [&]<class T, int D>() {
    const std::size_t bytes = tc_forward_shared_bytes(D);
    allow_shared_memory(tc_attention_forward_kernel<T, D>, bytes);
    tc_attention_forward_kernel<T, D><<<grid_of(geometry), tc_threads, bytes, stream>>>(
        geometry, static_cast<const T*>(qkv.data), static_cast<T*>(out.data), lse);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void tensor_core_attention_backward(cudaStream_t stream, SequenceScratch& scratch, const AttentionGeometry& geometry,
                                    const TensorView& qkv, const TensorView& out, const TensorView& dout,
                                    const float* lse, const TensorView& dqkv) {
  check_call(geometry, qkv, out, "tensor_core_attention_backward");
  check_call(geometry, dqkv, dout, "tensor_core_attention_backward (gradients)");
  HPCTRAIN_ASSERT(dqkv.dtype == qkv.dtype, "tensor_core_attention_backward: dqkv and qkv differ in dtype");
  if (qkv.rows == 0) return;
  const std::int64_t rows = geometry.batch * geometry.heads * geometry.sequence;
  auto* delta = scratch.delta.reserve_elements<float>(static_cast<std::size_t>(rows));
  dispatch_tensor_core(qkv.dtype, geometry.head_dim, [&]<class T, int D>() {
    const auto* q = static_cast<const T*>(qkv.data);
    const auto* gradient = static_cast<const T*>(dout.data);
    auto* result = static_cast<T*>(dqkv.data);
    tc_attention_delta_kernel<T, D>
        <<<grid_for(rows), block_threads, 0, stream>>>(geometry, static_cast<const T*>(out.data), gradient, delta);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
    const std::size_t bytes = tc_backward_shared_bytes(D);
    allow_shared_memory(tc_attention_dkdv_kernel<T, D>, bytes);
    tc_attention_dkdv_kernel<T, D>
        <<<grid_of(geometry), tc_threads, bytes, stream>>>(geometry, q, gradient, lse, delta, result);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
    allow_shared_memory(tc_attention_dq_kernel<T, D>, bytes);
    tc_attention_dq_kernel<T, D>
        <<<grid_of(geometry), tc_threads, bytes, stream>>>(geometry, q, gradient, lse, delta, result);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hpctrain::cuda
