// Deterministic two-pass reductions of the CUDA backend over 2-D grids (plans in kernels/cuda/launch_plan.hpp): column
// sums and segment sums of a value functor. Every partial is added in a fixed order, so results do not depend on
// scheduling, only on the shape. Private to src/kernels/cuda; templates instantiated by the .cu files that use them.
#pragma once

#include <cstdint>

#include "cuda_device.cuh"
#include "cuda_memory.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/cuda/launch_plan.hpp"

namespace hpctrain::cuda {

constexpr int column_slices = 8;  // blockDim (32 columns, column_slices row slices)

// ---- column sums: out[j] (+)= sum_i value(i, j) ----
// Grid (column tiles, row chunks). With one chunk the block writes the result; otherwise partials[chunk][j].
template <class Value>
__global__ void column_sums_kernel(std::int64_t rows, std::int64_t cols, std::int64_t rows_per_chunk, float* out,
                                   float* partials, bool accumulate, Value value) {
  __shared__ float partial[column_slices][warp_threads + 1];
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * warp_threads + threadIdx.x;
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0.0f;
  if (j < cols)
    for (std::int64_t i = begin + threadIdx.y; i < end; i += column_slices) sum += value(i, j);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  float total = 0.0f;
  for (int slice = 0; slice < column_slices; ++slice) total += partial[slice][threadIdx.x];
  if (partials != nullptr)
    partials[static_cast<std::int64_t>(blockIdx.y) * cols + j] = total;
  else
    out[j] = accumulate ? out[j] + total : total;
}

// Second pass: out[j] (+)= sum over chunks, in chunk order.
template <class = void>  // a template: this header is included by several files
__global__ void column_partials_kernel(const float* partials, std::int64_t chunks, std::int64_t cols, float* out,
                                       bool accumulate) {
  for (std::int64_t j = global_thread(); j < cols; j += grid_threads()) {
    float total = 0.0f;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) total += partials[chunk * cols + j];
    out[j] = accumulate ? out[j] + total : total;
  }
}

template <class Value>
void launch_column_sums(cudaStream_t stream, DeviceScratch& scratch, std::int64_t rows, std::int64_t cols, float* out,
                        bool accumulate, Value value) {
  if (cols == 0) return;
  const ColumnSumPlan plan = plan_column_sums(rows, cols);
  float* partials =
      plan.two_pass() ? scratch.reserve_elements<float>(static_cast<std::size_t>(plan.row_chunks * cols)) : nullptr;
  const dim3 grid(static_cast<unsigned>(plan.column_tiles), static_cast<unsigned>(plan.row_chunks));
  column_sums_kernel<<<grid, dim3(warp_threads, column_slices), 0, stream>>>(rows, cols, plan.rows_per_chunk, out,
                                                                             partials, accumulate, value);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
  if (!plan.two_pass()) return;
  column_partials_kernel<>
      <<<grid_for(cols), block_threads, 0, stream>>>(partials, plan.row_chunks, cols, out, accumulate);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

// ---- segment sums: K sums per (segment, chunk) of value(segment, index) over the chunk's indices ----
template <int K>
struct Sums {
  float v[K];
};

// Block b = segment * chunks + chunk (a 1-D grid: segments may exceed a grid's y extent). partials[b * K + k].
template <int K, class Value>
__global__ void segment_partials_kernel(std::int64_t length, std::int64_t chunk_length, std::int64_t chunks,
                                        float* partials, Value value) {
  __shared__ float shared[block_threads];
  const std::int64_t block = blockIdx.x;
  const std::int64_t segment = block / chunks, chunk = block - segment * chunks;
  const std::int64_t begin = chunk * chunk_length;
  const std::int64_t end = begin + chunk_length < length ? begin + chunk_length : length;
  Sums<K> sums{};
  for (std::int64_t i = begin + threadIdx.x; i < end; i += block_threads) {
    const Sums<K> here = value(segment, i);
#pragma unroll
    for (int k = 0; k < K; ++k) sums.v[k] += here.v[k];
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float total = block_tree_sum(sums.v[k], shared);
    if (threadIdx.x == 0) partials[block * K + k] = total;
  }
}

// Sum k of a segment: its chunks' partials in chunk order (the same order for every reader).
template <int K>
__device__ __forceinline__ float segment_total(const float* partials, std::int64_t segment, std::int64_t chunks,
                                               int k) {
  float total = 0.0f;
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) total += partials[(segment * chunks + chunk) * K + k];
  return total;
}

template <int K, class Value>
void launch_segment_partials(cudaStream_t stream, std::int64_t segments, std::int64_t length, const SegmentPlan& plan,
                             float* partials, Value value) {
  if (segments == 0) return;
  segment_partials_kernel<K><<<static_cast<unsigned>(segments * plan.chunks), block_threads, 0, stream>>>(
      length, plan.chunk_length, plan.chunks, partials, value);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

// Per-channel totals from per-(row, channel) segment partials: out_k[c] (+)= sum over rows (in order) of the segment
// (row, c)'s total k. For convolution bias and groupnorm parameter gradients.
template <int K>
__global__ void channel_totals_kernel(const float* partials, std::int64_t rows, std::int64_t channels,
                                      std::int64_t chunks, float* out0, float* out1, bool accumulate) {
  for (std::int64_t c = global_thread(); c < channels; c += grid_threads()) {
    float totals[K] = {};
    for (std::int64_t row = 0; row < rows; ++row)
#pragma unroll
      for (int k = 0; k < K; ++k) totals[k] += segment_total<K>(partials, row * channels + c, chunks, k);
    float* outs[2] = {out0, out1};
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (outs[k] != nullptr) outs[k][c] = accumulate ? outs[k][c] + totals[k] : totals[k];
  }
}

}  // namespace hpctrain::cuda
