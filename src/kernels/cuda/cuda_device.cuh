// Device-side helpers shared by the CUDA backend's kernel files: thread indexing, warp and block sums in a fixed order,
// 16-byte packs, storage conversions, launch sizes. Private to src/kernels/cuda; included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hpctrain/core/half.hpp"

namespace hpctrain::cuda {

constexpr int block_threads = 256;
constexpr int warp_threads = 32;
constexpr std::int64_t max_blocks = 8192;  // grid-stride loops beyond this

inline unsigned grid_for(std::int64_t work_items, std::int64_t per_block = block_threads) {
  const std::int64_t blocks = (work_items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, max_blocks));
}

inline bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_threads() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = warp_threads / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Tree sum of one value per thread over a block of block_threads threads, in a fixed order; the total in every
// thread. `shared` holds block_threads values; the caller may reuse it after the call.
template <class T>
__device__ T block_tree_sum(T value, T* shared) {
  __syncthreads();  // earlier readers of `shared` are done
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = block_threads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

// N elements of T moved as one access (16 bytes for N = 16 / sizeof(T)).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <class T>
constexpr int pack_width = static_cast<int>(16 / sizeof(T));

template <class TD, class TS>
__device__ __forceinline__ TD convert(TS value) {
  if constexpr (std::is_same_v<TD, TS>) {
    return value;
  } else {
    return store<TD>(load(value));
  }
}

}  // namespace hpctrain::cuda
