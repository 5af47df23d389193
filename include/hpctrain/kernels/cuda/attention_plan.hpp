// Which attention kernel the CUDA backend runs, and how the tensor-core kernels are cut into blocks, as pure functions
// of the shapes and the setting (host-only, tested on the CPU in tests/unit/cuda_host_logic_test.cpp). The kernels in
// src/kernels/cuda/tensor_core_attention.cu take their tile sizes from the same constants.
//
// Two kernels compute the same contract (Backend::attention_forward/backward: packed qkv, lse in natural-log units):
// - reference: src/kernels/cuda/cuda_attention.cu, fp32 FMAs on CUDA cores, any storage dtype, head_dim <= 64.
// - tensor_core: mma.sync m16n8k16 on bf16/fp16 with fp32 accumulation, head_dim 32, 64 or 128, compute capability
//   8.0 or newer, 16-byte aligned buffers, no attention dropout.
// HPCTRAIN_CUDA_ATTENTION=reference|tensor_core picks one (read when the backend is made); unset: reference, since the
// tensor-core kernels have not yet been run on a GPU (tools/gpu-check.sh compares them). A call the tensor-core
// kernels do not cover runs the reference kernel whatever the setting.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "hpctrain/core/dtype.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cuda {

enum class AttentionKernel : std::uint8_t { reference, tensor_core };

inline constexpr const char* attention_kernel_variable = "HPCTRAIN_CUDA_ATTENTION";

inline const char* attention_kernel_name(AttentionKernel kernel) {
  return kernel == AttentionKernel::tensor_core ? "tensor_core" : "reference";
}

// The setting from the variable's value (null or empty: the default, reference).
inline AttentionKernel parse_attention_kernel(const char* value) {
  const std::string text = value == nullptr ? "" : value;
  if (text.empty() || text == "reference") return AttentionKernel::reference;
  if (text == "tensor_core") return AttentionKernel::tensor_core;
  throw InputError(std::string(attention_kernel_variable) + "=\"" + text + "\" is not a CUDA attention kernel",
                   "set it to reference or tensor_core, or unset it (docs/build-options.md)");
}

// ---- the tensor-core kernels' tiles ----
// A block is 4 warps; each warp owns 16 rows (queries in the forward and dQ kernels, keys in the dK/dV kernel), so a
// block owns 64 rows and streams tiles of the other side through shared memory.
inline constexpr int tc_warps = 4;
inline constexpr int tc_threads = tc_warps * 32;
inline constexpr int tc_block_rows = tc_warps * 16;

constexpr bool tc_head_dim_supported(std::int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128;
}
// Rows of the streamed tile: 64, or 32 for head_dim 128 in the backward (its 4 accumulators of 16 x 128 per warp
// leave no registers for wider score tiles).
constexpr int tc_forward_stream_rows(int /*head_dim*/) { return 64; }
constexpr int tc_backward_stream_rows(int head_dim) { return head_dim >= 128 ? 32 : 64; }
// Shared-memory row stride in 16-bit elements: 8 more than the row (16 bytes), so that the 8 rows a fragment load
// touches start in different banks.
constexpr int tc_row_stride(int head_dim) { return head_dim + 8; }

// Dynamic shared memory of each kernel, in bytes: 16-bit tiles of tc_row_stride elements per row, plus the backward's
// per-row fp32 values (lse in base 2 and D = rowsum(dO * O)) of the streamed tile in the dK/dV kernel.
constexpr std::size_t tc_forward_shared_bytes(int head_dim) {
  return static_cast<std::size_t>(tc_block_rows + 2 * tc_forward_stream_rows(head_dim)) * tc_row_stride(head_dim) * 2;
}
constexpr std::size_t tc_backward_shared_bytes(int head_dim) {
  const int stream = tc_backward_stream_rows(head_dim);
  return static_cast<std::size_t>(2 * tc_block_rows + 2 * stream) * tc_row_stride(head_dim) * 2 +
         static_cast<std::size_t>(2 * stream) * sizeof(float);
}
// Above this a kernel must opt in to more shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize).
inline constexpr std::size_t tc_default_shared_limit = 48 * 1024;

// Grid of every tensor-core kernel: x = batch * heads, y = the 64-row blocks of the sequence.
struct TensorCoreGrid {
  std::int64_t x = 0, y = 0;
};
inline TensorCoreGrid tc_grid(std::int64_t batch, std::int64_t heads, std::int64_t sequence) {
  return {batch * heads, (sequence + tc_block_rows - 1) / tc_block_rows};
}
// Whether the grid fits CUDA's limits (x < 2^31, y < 65536).
inline bool tc_grid_fits(const TensorCoreGrid& grid) {
  return grid.x >= 1 && grid.x < (std::int64_t{1} << 31) && grid.y >= 1 && grid.y < 65536;
}
// Streamed tiles a block visits: the forward's key tiles of query block `block` (causal: up to its last query), the
// dK/dV kernel's query tiles of key block `block` (causal: from its first key on), the dQ kernel's key tiles.
inline std::int64_t tc_forward_key_tiles(std::int64_t sequence, bool causal, std::int64_t block, int head_dim) {
  const std::int64_t end = causal ? std::min(sequence, (block + 1) * tc_block_rows) : sequence;
  const int rows = tc_forward_stream_rows(head_dim);
  return (end + rows - 1) / rows;
}
inline std::int64_t tc_dkdv_query_tiles(std::int64_t sequence, bool causal, std::int64_t block, int head_dim) {
  const std::int64_t first = causal ? block * tc_block_rows : 0;
  const int rows = tc_backward_stream_rows(head_dim);
  return first >= sequence ? 0 : (sequence - first + rows - 1) / rows;
}
inline std::int64_t tc_dq_key_tiles(std::int64_t sequence, bool causal, std::int64_t block, int head_dim) {
  const std::int64_t end = causal ? std::min(sequence, (block + 1) * tc_block_rows) : sequence;
  const int rows = tc_backward_stream_rows(head_dim);
  return (end + rows - 1) / rows;
}

// ---- the choice ----
struct AttentionCall {
  DType dtype = DType::f32;
  std::int64_t head_dim = 0;
  std::int64_t batch = 0, heads = 0, sequence = 0;
  bool dropout = false;         // attention dropout on: only the reference kernel has it
  int compute_major = 0;        // the device's compute capability (major)
  bool buffers_aligned = true;  // every buffer of the call starts on 16 bytes (the kernels' 16-byte loads)
};

// Whether a geometry asks for attention dropout: geometry.dropout.active() where the geometry has that member
// (AttentionGeometry::dropout), else false, so the choice stays right on either side of that member's arrival.
template <class Geometry>
bool attention_dropout_active(const Geometry& geometry) {
  if constexpr (requires { geometry.dropout.active(); })
    return geometry.dropout.active();
  else
    return false;
}

inline AttentionKernel choose_attention_kernel(AttentionKernel setting, const AttentionCall& call) {
  if (setting != AttentionKernel::tensor_core) return AttentionKernel::reference;
  const bool sixteen_bit = call.dtype == DType::bf16 || call.dtype == DType::f16;
  const bool covered = sixteen_bit && tc_head_dim_supported(call.head_dim) && !call.dropout &&
                       call.compute_major >= 8 && call.buffers_aligned &&
                       tc_grid_fits(tc_grid(call.batch, call.heads, call.sequence));
  return covered ? AttentionKernel::tensor_core : AttentionKernel::reference;
}

}  // namespace hpctrain::cuda
