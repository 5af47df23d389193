// One-query attention over a key/value cache (Backend::cached_attention) for incremental decoding: a few new positions
// per call, each attending to every cached position up to itself.
// - The new positions' k and v go into the cache with one strided device-to-device copy (cudaMemcpy2DAsync) before
//   the attention kernel runs, on the same stream, so every block sees the whole cache it reads.
// - One block of cached_threads threads per (new position, head). The query (pre-scaled, scores in base 2 as in the
//   fused kernel) and the output accumulators (fp32) live in shared memory; the keys are taken in chunks of
//   cached_threads, a thread per key computing its score, with an online softmax across chunks (running maximum and
//   sum, the accumulators rescaled when the maximum grows); the threads then sweep the head's elements, each adding
//   the chunk's weighted values of its elements. Any cache length; head_dim up to max_cached_head_dim (the shared
//   memory). Every sum has a fixed order: results are identical run to run.
#include <cstdint>
#include <limits>
#include <string>

#include "cuda_cached_attention.hpp"
#include "cuda_device.cuh"
#include "cuda_dispatch.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"

namespace hpctrain::cuda {
namespace {

constexpr int cached_threads = 128;  // keys per chunk, and the threads sweeping head_dim
constexpr int cached_warps = cached_threads / warp_threads;
constexpr std::int64_t max_cached_head_dim = 4096;  // 2 x 16 KiB of fp32 in shared memory
constexpr float log2e = 1.4426950408889634f;
constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

// The maximum or the sum of one value per thread over the block, in a fixed order; the result in every thread.
// `partials` holds cached_warps values.
template <bool Maximum>
__device__ float block_reduce(float value, float* partials) {
  for (int offset = warp_threads / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = Maximum ? fmaxf(value, other) : value + other;
  }
  __syncthreads();  // earlier readers of `partials` are done
  if (threadIdx.x % warp_threads == 0) partials[threadIdx.x / warp_threads] = value;
  __syncthreads();
  float result = partials[0];
  for (int w = 1; w < cached_warps; ++w) result = Maximum ? fmaxf(result, partials[w]) : result + partials[w];
  return result;
}

// Block (blockIdx.x = new position i, blockIdx.y = head h). Shared: q[head_dim], accumulators[head_dim],
// p[cached_threads], partials[cached_warps].
template <class T>
__global__ void __launch_bounds__(cached_threads)
    cached_attention_kernel(AttentionGeometry g, const T* qkv, const T* cache, std::int64_t first, T* out) {
  extern __shared__ float shared[];
  const std::int64_t d = g.head_dim, width = g.heads * d, i = blockIdx.x, h = blockIdx.y;
  float* q = shared;
  float* accumulators = q + d;
  float* p = accumulators + d;
  float* partials = p + cached_threads;
  const float score_scale = g.scale * log2e;
  const T* q_row = qkv + i * 3 * width + h * d;
  for (std::int64_t c = threadIdx.x; c < d; c += cached_threads) {
    q[c] = load(q_row[c]) * score_scale;
    accumulators[c] = 0.0f;
  }
  __syncthreads();
  const std::int64_t keys = first + i + 1;  // causal: positions [0, first + i]
  const T* k_rows = cache + h * d;          // (2C) cache rows: k, v
  const T* v_rows = cache + width + h * d;
  float running_max = minus_infinity, running_sum = 0.0f;
  for (std::int64_t chunk = 0; chunk < keys; chunk += cached_threads) {
    const std::int64_t j = chunk + threadIdx.x;
    const int in_chunk = keys - chunk < cached_threads ? static_cast<int>(keys - chunk) : cached_threads;
    float score = minus_infinity;
    if (j < keys) {
      const T* k = k_rows + j * 2 * width;
      float dot = 0.0f;
      for (std::int64_t c = 0; c < d; ++c) dot = fmaf(q[c], load(k[c]), dot);
      score = dot;
    }
    const float new_max = fmaxf(running_max, block_reduce<true>(score, partials));  // finite: the chunk has a key
    const float weight = j < keys ? exp2f(score - new_max) : 0.0f;
    p[threadIdx.x] = weight;
    const float correction = exp2f(running_max - new_max);                           // 0 on the first chunk
    running_sum = running_sum * correction + block_reduce<false>(weight, partials);  // also publishes p
    running_max = new_max;
    for (std::int64_t c = threadIdx.x; c < d; c += cached_threads) {
      float sum = accumulators[c] * correction;
      const T* v = v_rows + chunk * 2 * width + c;
      for (int r = 0; r < in_chunk; ++r) sum = fmaf(p[r], load(v[r * 2 * width]), sum);
      accumulators[c] = sum;
    }
    __syncthreads();  // p is read before the next chunk writes it
  }
  T* out_row = out + i * width + h * d;
  const float inverse = 1.0f / running_sum;
  for (std::int64_t c = threadIdx.x; c < d; c += cached_threads) out_row[c] = store<T>(accumulators[c] * inverse);
}

}  // namespace

void cached_attention(cudaStream_t stream, const AttentionGeometry& geometry, const TensorView& qkv, void* cache,
                      std::int64_t first, const TensorView& out) {
  check_cached_attention(geometry, qkv, first, out);
  require_device_storage(qkv.dtype, "cached attention (hpctrain generate)");
  if (geometry.head_dim > max_cached_head_dim)
    throw NotSupported("cached attention with head_dim " + std::to_string(geometry.head_dim) +
                       " on the CUDA backend (at most " + std::to_string(max_cached_head_dim) + ")");
  HPCTRAIN_ASSERT(out.data != cache, "cached attention: out must not alias the cache");
  const std::int64_t width = geometry.width(), count = qkv.rows;
  const auto size = static_cast<std::size_t>(dtype_size(qkv.dtype));
  // k and v of the new positions (columns [C, 3C) of their qkv rows) into cache rows [first, first + count)
  HPCTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(cache) + static_cast<std::size_t>(first * 2 * width) * size,
                                        static_cast<std::size_t>(2 * width) * size,
                                        static_cast<const char*>(qkv.data) + static_cast<std::size_t>(width) * size,
                                        static_cast<std::size_t>(3 * width) * size,
                                        static_cast<std::size_t>(2 * width) * size, static_cast<std::size_t>(count),
                                        cudaMemcpyDeviceToDevice, stream));
  const auto shared_bytes =
      static_cast<std::size_t>(2 * geometry.head_dim + cached_threads + cached_warps) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(geometry.heads));
  dispatch_storage(qkv.dtype, "cached attention (hpctrain generate)", [&]<class T>() {
    cached_attention_kernel<T><<<grid, cached_threads, shared_bytes, stream>>>(
        geometry, static_cast<const T*>(qkv.data), static_cast<const T*>(cache), first, static_cast<T*>(out.data));
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hpctrain::cuda
