// Flash attention on tensor cores (see tensor_core_attention.hpp and hpctrain/kernels/cuda/attention_plan.hpp; the
// kernels' bodies are in tensor_core_attention_kernels.inc, which a CPU emulation test runs too): the
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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cuda_device.cuh"
#include "hpctrain/core/half.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda/attention_plan.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "tensor_core_attention.hpp"

namespace hpctrain::cuda {
namespace {

// The primitives tensor_core_attention_kernels.inc is written against, for the GPU.
#define TC_INLINE __device__ __forceinline__
#define TC_UNROLL _Pragma("unroll")
TC_INLINE int tc_thread() { return static_cast<int>(threadIdx.x); }
TC_INLINE std::int64_t tc_block_x() { return blockIdx.x; }
TC_INLINE std::int64_t tc_block_y() { return blockIdx.y; }
TC_INLINE void tc_sync_block() { __syncthreads(); }
TC_INLINE float tc_shuffle_xor(float value, int lane_mask) { return __shfl_xor_sync(0xffffffffu, value, lane_mask); }
using TcChunk = uint4;

// Two fp32 values rounded to T, `low` in the low half (the lower column index).
template <class T>
TC_INLINE std::uint32_t pack_pair(float low, float high) {
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
TC_INLINE void mma_16x8x16(float (&c)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
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

#include "tensor_core_attention_kernels.inc"
#undef TC_INLINE
#undef TC_UNROLL

// The kernels: a block of tc_threads threads per (batch x head, 64-row block), the tiles in dynamic shared memory.
template <class T, int D>
__global__ void __launch_bounds__(tc_threads)
    tc_attention_forward_kernel(AttentionGeometry g, const T* qkv, T* out, float* lse) {
  extern __shared__ uint4 shared_memory[];
  tc_forward_block<T, D>(g, qkv, out, lse, reinterpret_cast<std::uint16_t*>(shared_memory));
}

template <class T, int D>
__global__ void tc_attention_delta_kernel(AttentionGeometry g, const T* out, const T* dout, float* delta) {
  const std::int64_t total = g.batch * g.heads * g.sequence;
  for (std::int64_t index = global_thread(); index < total; index += grid_threads())
    tc_delta_row<T, D>(g, out, dout, delta, index);
}

template <class T, int D>
__global__ void __launch_bounds__(tc_threads) tc_attention_dkdv_kernel(AttentionGeometry g, const T* qkv, const T* dout,
                                                                       const float* lse, const float* delta, T* dqkv) {
  extern __shared__ uint4 shared_memory[];
  tc_dkdv_block<T, D>(g, qkv, dout, lse, delta, dqkv, reinterpret_cast<std::uint16_t*>(shared_memory));
}

template <class T, int D>
__global__ void __launch_bounds__(tc_threads) tc_attention_dq_kernel(AttentionGeometry g, const T* qkv, const T* dout,
                                                                     const float* lse, const float* delta, T* dqkv) {
  extern __shared__ uint4 shared_memory[];
  tc_dq_block<T, D>(g, qkv, dout, lse, delta, dqkv, reinterpret_cast<std::uint16_t*>(shared_memory));
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
  HPCTRAIN_ASSERT(!attention_dropout_active(g), what << ": attention dropout is the reference kernels' only");
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
