// Argmax and top-5 hits of rows of class scores on the CUDA backend (see cuda_class_hits.hpp): one warp per row, each
// lane scanning a strided part of the row once; a block's hits are summed as integers and added to the counts with one
// atomic per counter. The counts are integers (exact in double), so the order of the atomics does not matter.
#include <cstdint>

#include "cuda_class_hits.hpp"
#include "cuda_device.cuh"
#include "cuda_dispatch.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"

namespace hpctrain::cuda {
namespace {

constexpr int warps_per_block = block_threads / warp_threads;

// The CPU backend's sequential rule (kernel_math::row_argmax: the first score, then strictly greater only) in
// parallel: a NaN after the first score never wins, so each lane keeps the first maximum of its non-NaN scores (index
// `cols`: none yet), the lanes combine by value then lowest index, and a NaN first score is the argmax. Every lane
// gets the row's argmax and its maximum.
template <class T>
__device__ std::int64_t warp_first_maximum(const T* in, std::int64_t cols, int lane, float* maximum) {
  float largest = 0.0f;
  std::int64_t argmax = cols;
  for (std::int64_t j = lane; j < cols; j += warp_threads) {
    const float value = load(in[j]);
    if (value == value && (argmax == cols || value > largest)) {
      largest = value;
      argmax = j;
    }
  }
  for (int offset = warp_threads / 2; offset > 0; offset /= 2) {
    const float other_value = __shfl_xor_sync(0xffffffffu, largest, offset);
    const std::int64_t other_index = __shfl_xor_sync(0xffffffffu, argmax, offset);
    if (other_index != cols &&
        (argmax == cols || other_value > largest || (other_value == largest && other_index < argmax))) {
      largest = other_value;
      argmax = other_index;
    }
  }
  const float first = load(in[0]);
  if (first != first || argmax == cols) {
    argmax = 0;
    largest = first;
  }
  *maximum = largest;
  return argmax;
}

// Argmax and top-5 hits, a warp per row (grid-stride over the rows); one atomic per counter and block.
template <class T>
__global__ void count_class_hits_kernel(const T* scores, const std::int32_t* targets, std::int64_t rows,
                                        std::int64_t cols, double* counts) {
  __shared__ unsigned long long block_hits[2][warps_per_block];
  const int lane = static_cast<int>(threadIdx.x % warp_threads), warp = static_cast<int>(threadIdx.x / warp_threads);
  unsigned long long argmax_hits = 0, top5_hits = 0;  // lane 0's, for this warp's rows
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * warps_per_block + warp; row < rows;
       row += static_cast<std::int64_t>(gridDim.x) * warps_per_block) {
    const std::int32_t target = targets[row];
    if (target < 0 || target >= cols) continue;  // the whole warp skips: ignored (or not a class), never a hit
    const T* in = scores + row * cols;
    const float target_score = load(in[target]);
    unsigned above = 0;
    for (std::int64_t j = lane; j < cols; j += warp_threads) above += load(in[j]) > target_score ? 1u : 0u;
    for (int offset = warp_threads / 2; offset > 0; offset /= 2) above += __shfl_xor_sync(0xffffffffu, above, offset);
    float maximum = 0.0f;
    const std::int64_t argmax = warp_first_maximum(in, cols, lane, &maximum);
    argmax_hits += argmax == target ? 1u : 0u;
    top5_hits += above < 5u ? 1u : 0u;
  }
  if (lane == 0) {
    block_hits[0][warp] = argmax_hits;
    block_hits[1][warp] = top5_hits;
  }
  __syncthreads();
  if (threadIdx.x >= 2) return;
  unsigned long long hits = 0;
  for (int w = 0; w < warps_per_block; ++w) hits += block_hits[threadIdx.x][w];
  if (hits > 0) atomicAdd(counts + threadIdx.x, static_cast<double>(hits));
}

// predict's per-row scores, a warp per row: the first maximum, then the sum of exp(x - max) in double over the lanes.
template <class T>
__global__ void score_targets_kernel(const T* logits, const std::int32_t* targets, std::int32_t* argmax_out,
                                     float* target_log_probability, std::int64_t rows, std::int64_t cols) {
  const int lane = static_cast<int>(threadIdx.x % warp_threads), warp = static_cast<int>(threadIdx.x / warp_threads);
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * warps_per_block + warp; row < rows;
       row += static_cast<std::int64_t>(gridDim.x) * warps_per_block) {
    const T* in = logits + row * cols;
    float maximum = 0.0f;
    const std::int64_t argmax = warp_first_maximum(in, cols, lane, &maximum);
    const std::int32_t target = targets[row];
    const bool scored = target >= 0 && target < cols;
    double total = 0.0;
    if (scored)
      for (std::int64_t j = lane; j < cols; j += warp_threads)
        total += exp(static_cast<double>(load(in[j])) - static_cast<double>(maximum));
    for (int offset = warp_threads / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
    if (lane != 0) continue;
    argmax_out[row] = static_cast<std::int32_t>(argmax);
    target_log_probability[row] =
        scored ? static_cast<float>(static_cast<double>(load(in[target])) - static_cast<double>(maximum) - log(total))
               : __int_as_float(0x7fc00000);  // NaN
  }
}

}  // namespace

void count_class_hits(cudaStream_t stream, const TensorView& scores, const std::int32_t* targets, double* counts,
                      bool accumulate) {
  HPCTRAIN_ASSERT(scores.cols > 0 || scores.rows == 0, "count_class_hits: no classes");
  require_device_storage(scores.dtype, "count_class_hits");
  if (!accumulate) HPCTRAIN_CUDA_CHECK(cudaMemsetAsync(counts, 0, 2 * sizeof(double), stream));
  if (scores.rows == 0) return;
  dispatch_storage(scores.dtype, "count_class_hits", [&]<class T>() {
    count_class_hits_kernel<T><<<grid_for(scores.rows, warps_per_block), block_threads, 0, stream>>>(
        static_cast<const T*>(scores.data), targets, scores.rows, scores.cols, counts);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hpctrain::cuda

namespace hpctrain::cuda {

void score_targets(cudaStream_t stream, const TensorView& logits, const std::int32_t* targets, std::int32_t* argmax,
                   float* target_log_probability) {
  HPCTRAIN_ASSERT(logits.cols > 0 || logits.rows == 0, "score_targets: no classes");
  require_device_storage(logits.dtype, "score_targets");
  if (logits.rows == 0) return;
  dispatch_storage(logits.dtype, "score_targets", [&]<class T>() {
    score_targets_kernel<T><<<grid_for(logits.rows, warps_per_block), block_threads, 0, stream>>>(
        static_cast<const T*>(logits.data), targets, argmax, target_log_probability, logits.rows, logits.cols);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hpctrain::cuda
