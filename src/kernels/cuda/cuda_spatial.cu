// Pooling and group normalisation of the CUDA backend: own kernels computing the formulas of the CPU backend
// (src/kernels/cpu/cpu_spatial.cpp) in fp32 for f32/bf16/f16 storage.
//
// - Pooling: one thread per output element (forward) or per input element (backward, a gather: no atomics), each
//   running the per-element functions of kernels/spatial_taps.hpp (spatial::pooling_output, pooling_input_gradient):
//   the CPU's taps, tie rule and addition order, so the results equal the CPU's bit for bit. The CPU unit tests check
//   those functions against the CPU loops on every machine (tests/unit/spatial_taps_test.cpp).
// - Group normalisation: one block per (sample, group) for the statistics and the data gradient, one block per
//   channel for the gamma/beta gradients; block reductions in a fixed order (deterministic, but a different summation
//   order than the CPU's sequential loop, so results agree to rounding, not bit for bit).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cuda_dispatch.hpp"
#include "cuda_spatial.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/math.hpp"
#include "hpctrain/kernels/spatial_taps.hpp"

namespace hpctrain::cuda {
namespace {

constexpr int spatial_threads = 256;
constexpr std::int64_t spatial_max_blocks = 65535;

unsigned blocks_for(std::int64_t items) {
  const std::int64_t blocks = (items + spatial_threads - 1) / spatial_threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, spatial_max_blocks));
}

using spatial::Box;
using spatial::box_of;

template <class T>
__global__ void pooling_forward_kernel(bool max_pooling, Box b, const T* x, T* y, std::int64_t planes) {
  const std::int64_t in_size = b.in[0] * b.in[1] * b.in[2], out_size = b.out[0] * b.out[1] * b.out[2];
  const std::int64_t count = planes * out_size;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < count;
       index += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t plane = index / out_size;
    y[index] = spatial::pooling_output(max_pooling, b, x + plane * in_size, index - plane * out_size);
  }
}

template <class T>
__global__ void pooling_backward_kernel(bool max_pooling, Box b, const T* x, const T* dy, T* dx, std::int64_t planes) {
  const std::int64_t in_size = b.in[0] * b.in[1] * b.in[2], out_size = b.out[0] * b.out[1] * b.out[2];
  const std::int64_t count = planes * in_size;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < count;
       index += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t plane = index / in_size;
    dx[index] = spatial::pooling_input_gradient(max_pooling, b, x + plane * in_size, dy + plane * out_size,
                                                index - plane * in_size);
  }
}

// Sum over the block (blockDim.x a multiple of 32), in a fixed order; every thread gets the total.
__device__ float block_sum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  __syncthreads();  // earlier readers of `shared` are done
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += shared[w];
  return total;
}

// One block per (row, group): the group's channels are contiguous in a row (block elements).
template <class T>
__global__ void groupnorm_forward_kernel(const T* x, const float* gamma, const float* beta, float eps, T* y,
                                         float* mean, float* rstd, std::int64_t groups, std::int64_t group_channels,
                                         std::int64_t spatial) {
  __shared__ float shared[32];
  const std::int64_t index = blockIdx.x, block = group_channels * spatial;
  const T* in = x + index * block;
  T* out = y + index * block;
  float sum = 0.0f;
  for (std::int64_t i = threadIdx.x; i < block; i += blockDim.x) sum += load(in[i]);
  const float average = block_sum(sum, shared) / static_cast<float>(block);
  float squares = 0.0f;
  for (std::int64_t i = threadIdx.x; i < block; i += blockDim.x) {
    const float centred = load(in[i]) - average;
    squares += centred * centred;
  }
  const float inverse = 1.0f / sqrtf(block_sum(squares, shared) / static_cast<float>(block) + eps);
  if (threadIdx.x == 0) {
    mean[index] = average;
    rstd[index] = inverse;
  }
  const std::int64_t first_channel = index % groups * group_channels;
  for (std::int64_t i = threadIdx.x; i < block; i += blockDim.x) {
    const std::int64_t c = first_channel + i / spatial;
    const float a = gamma[c] * inverse;
    const float b = beta[c] - average * a;
    out[i] = store<T>(load(in[i]) * a + b);
  }
}

// One block per channel: gamma and beta gradients over every row's plane of that channel.
template <class T>
__global__ void groupnorm_parameter_kernel(const T* x, const T* dy, const float* mean, const float* rstd, float* dgamma,
                                           float* dbeta, bool accumulate, std::int64_t rows, std::int64_t cols,
                                           std::int64_t groups, std::int64_t group_channels, std::int64_t spatial) {
  __shared__ float shared[32];
  const std::int64_t c = blockIdx.x;
  float gamma_sum = 0.0f, beta_sum = 0.0f;
  for (std::int64_t e = threadIdx.x; e < rows * spatial; e += blockDim.x) {
    const std::int64_t row = e / spatial, s = e - row * spatial;
    const std::int64_t index = row * groups + c / group_channels;
    const std::int64_t offset = row * cols + c * spatial + s;
    const float upstream = load(dy[offset]);
    gamma_sum += upstream * (load(x[offset]) - mean[index]) * rstd[index];
    beta_sum += upstream;
  }
  gamma_sum = block_sum(gamma_sum, shared);
  beta_sum = block_sum(beta_sum, shared);
  if (threadIdx.x == 0) {
    if (dgamma != nullptr) dgamma[c] = gamma_sum + (accumulate ? dgamma[c] : 0.0f);
    if (dbeta != nullptr) dbeta[c] = beta_sum + (accumulate ? dbeta[c] : 0.0f);
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, per (row, group) block.
template <class T>
__global__ void groupnorm_data_kernel(const T* x, const T* dy, const float* gamma, const float* mean, const float* rstd,
                                      T* dx, std::int64_t groups, std::int64_t group_channels, std::int64_t spatial) {
  __shared__ float shared[32];
  const std::int64_t index = blockIdx.x, block = group_channels * spatial;
  const T* in = x + index * block;
  const T* gradient = dy + index * block;
  T* out = dx + index * block;
  const std::int64_t first_channel = index % groups * group_channels;
  const float average = mean[index], inverse = rstd[index];
  float sum = 0.0f, weighted = 0.0f;
  for (std::int64_t i = threadIdx.x; i < block; i += blockDim.x) {
    const float g = load(gradient[i]) * gamma[first_channel + i / spatial];
    sum += g;
    weighted += g * (load(in[i]) - average) * inverse;
  }
  const float mean_g = block_sum(sum, shared) / static_cast<float>(block);
  const float mean_gx = block_sum(weighted, shared) / static_cast<float>(block);
  for (std::int64_t i = threadIdx.x; i < block; i += blockDim.x) {
    const float g = load(gradient[i]) * gamma[first_channel + i / spatial];
    const float normalised = (load(in[i]) - average) * inverse;
    out[i] = store<T>(inverse * (g - mean_g - normalised * mean_gx));
  }
}

void check_pooling(const SpatialGeometry& g, const TensorView& x, const TensorView& y, const char* what) {
  HPCTRAIN_ASSERT((g.dimensions == 2 || g.dimensions == 3) && g.in_channels == g.out_channels && x.dtype == y.dtype &&
                      x.rows == y.rows && x.cols == g.in_channels * g.input_size() &&
                      y.cols == g.out_channels * g.output_size(),
                  what << ": shapes/dtypes do not match the geometry");
}

void check_groups(std::int64_t channels, std::int64_t groups, const TensorView& x, const char* what) {
  HPCTRAIN_ASSERT(channels > 0 && groups > 0 && channels % groups == 0 && x.cols % channels == 0,
                  what << ": " << channels << " channels in " << groups << " groups, rows of " << x.cols);
}

}  // namespace

bool have_convolutions() {
#if defined(HPCTRAIN_HAVE_CUDNN)
  return true;
#else
  return false;
#endif
}

void pooling_forward(cudaStream_t stream, PoolingKind kind, const SpatialGeometry& g, const TensorView& x,
                     const TensorView& y) {
  check_pooling(g, x, y, "pooling_forward");
  const std::int64_t planes = x.rows * g.in_channels, count = planes * g.output_size();
  if (count == 0) return;
  dispatch_storage(x.dtype, "pooling_forward", [&]<class T>() {
    pooling_forward_kernel<<<blocks_for(count), spatial_threads, 0, stream>>>(
        kind == PoolingKind::max, box_of(g), static_cast<const T*>(x.data), static_cast<T*>(y.data), planes);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void pooling_backward(cudaStream_t stream, PoolingKind kind, const SpatialGeometry& g, const TensorView& x,
                      const TensorView& dy, const TensorView& dx) {
  check_pooling(g, x, dy, "pooling_backward");
  HPCTRAIN_ASSERT(dx.dtype == x.dtype && dx.rows == x.rows && dx.cols == x.cols, "pooling_backward: dx shape");
  const std::int64_t planes = x.rows * g.in_channels, count = planes * g.input_size();
  if (count == 0) return;
  dispatch_storage(x.dtype, "pooling_backward", [&]<class T>() {
    pooling_backward_kernel<<<blocks_for(count), spatial_threads, 0, stream>>>(
        kind == PoolingKind::max, box_of(g), static_cast<const T*>(x.data), static_cast<const T*>(dy.data),
        static_cast<T*>(dx.data), planes);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void groupnorm_forward(cudaStream_t stream, std::int64_t channels, std::int64_t groups, const TensorView& x,
                       const float* gamma, const float* beta, float eps, const TensorView& y, float* mean,
                       float* rstd) {
  check_groups(channels, groups, x, "groupnorm_forward");
  HPCTRAIN_ASSERT(x.dtype == y.dtype && x.rows == y.rows && x.cols == y.cols, "groupnorm_forward: y shape");
  if (x.rows == 0) return;
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  dispatch_storage(x.dtype, "groupnorm_forward", [&]<class T>() {
    groupnorm_forward_kernel<<<static_cast<unsigned>(x.rows * groups), spatial_threads, 0, stream>>>(
        static_cast<const T*>(x.data), gamma, beta, eps, static_cast<T*>(y.data), mean, rstd, groups, group_channels,
        spatial);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void groupnorm_backward(cudaStream_t stream, std::int64_t channels, std::int64_t groups, const TensorView& x,
                        const TensorView& dy, const float* gamma, const float* mean, const float* rstd,
                        const TensorView& dx, float* dgamma, float* dbeta, bool accumulate) {
  check_groups(channels, groups, x, "groupnorm_backward");
  HPCTRAIN_ASSERT(x.dtype == dy.dtype && x.rows == dy.rows && x.cols == dy.cols && dx.data != dy.data,
                  "groupnorm_backward: shapes, or dx aliasing dy");
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  dispatch_storage(x.dtype, "groupnorm_backward", [&]<class T>() {
    if (dgamma != nullptr || dbeta != nullptr) {
      groupnorm_parameter_kernel<<<static_cast<unsigned>(channels), spatial_threads, 0, stream>>>(
          static_cast<const T*>(x.data), static_cast<const T*>(dy.data), mean, rstd, dgamma, dbeta, accumulate, x.rows,
          x.cols, groups, group_channels, spatial);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    }
    if (dx.data == nullptr || x.rows == 0) return;
    groupnorm_data_kernel<<<static_cast<unsigned>(x.rows * groups), spatial_threads, 0, stream>>>(
        static_cast<const T*>(x.data), static_cast<const T*>(dy.data), gamma, mean, rstd, static_cast<T*>(dx.data),
        groups, group_channels, spatial);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace hpctrain::cuda
