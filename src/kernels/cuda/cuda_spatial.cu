// Pooling and group normalisation of the CUDA backend: own kernels computing the formulas of the CPU backend
// (src/kernels/cpu/cpu_spatial.cpp) in fp32 for f32/bf16/f16 storage.
//
// - Pooling: one thread per output element (forward) or per input element (backward, a gather: no atomics), each
//   running the per-element functions of kernels/spatial_taps.hpp (spatial::pooling_output_at,
//   pooling_input_gradient_at): the CPU's taps, tie rule and addition order, so the results equal the CPU's bit for
//   bit. Max pooling can keep each output's argmax from the forward pass, so the backward reads one index per window
//   instead of recomputing its maximum. The CPU unit tests check those functions against the CPU loops on every machine
//   (tests/unit/spatial_taps_test.cpp). Indices are 32-bit with precomputed divisors (kernel_math::FastDivisor) below
//   2^31 elements, 64-bit beyond.
// - Channels-last rows ((sample, position, channel): the layout of 16-bit conv stacks): pooling runs on them directly
//   (the per-element functions with the channel count as stride); group normalisation addresses each (sample, group)
//   block as strided runs of the group's channels, its parameter gradients are column sums over (sample, position)
//   rows.
// - Group normalisation (channels-first): the (sample, group) blocks are contiguous segments, cut into chunks of a
//   2-D grid (cuda_normalization.cu), so a few large groups still fill the GPU; gamma/beta gradients are two-pass sums
//   over (sample, channel) planes. Fixed-order reductions (deterministic), in a different order than the CPU's loops,
//   so results agree to rounding, not bit for bit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cuda_dispatch.hpp"
#include "cuda_normalization.hpp"
#include "cuda_spatial.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/cuda/launch_plan.hpp"
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

namespace km = kernel_math;

// Divisors of a plane's extents, for decomposing 32-bit indices.
struct PlaneDivisors {
  km::FastDivisor plane, inner, middle;  // by the plane size, by extent[2], by extent[1]
};
PlaneDivisors divisors_of(const std::array<std::int64_t, 3>& extent) {
  return {km::FastDivisor(static_cast<std::uint32_t>(extent[0] * extent[1] * extent[2])),
          km::FastDivisor(static_cast<std::uint32_t>(extent[2])),
          km::FastDivisor(static_cast<std::uint32_t>(extent[1]))};
}

// index -> (plane, d, h, w) of a plane-major layout; 32-bit with the divisors, 64-bit otherwise.
template <class Index>
__device__ __forceinline__ void decompose(Index index, const std::array<std::int64_t, 3>& extent,
                                          const PlaneDivisors& by, std::int64_t& plane, std::int64_t& within,
                                          std::int64_t (&position)[3]) {
  if constexpr (sizeof(Index) == 4) {
    const std::uint32_t p = by.plane.quotient(index), o = by.plane.remainder(index, p);
    const std::uint32_t row = by.inner.quotient(o), d = by.middle.quotient(row);
    plane = p;
    within = o;
    position[0] = d;
    position[1] = by.middle.remainder(row, d);
    position[2] = by.inner.remainder(o, row);
  } else {
    const std::int64_t size = extent[0] * extent[1] * extent[2];
    plane = index / size;
    within = index - plane * size;
    position[0] = within / (extent[2] * extent[1]);
    position[1] = within / extent[2] % extent[1];
    position[2] = within % extent[2];
  }
}

// index -> (rest, channel) of a channels-last layout ((sample, position, channel) order): rest = sample * positions +
// position. channels == 0: channels-first, rest = index, channel = 0.
template <class Index>
__device__ __forceinline__ Index split_channel(Index index, Index channels, const km::FastDivisor& by_channels,
                                               std::int64_t& channel) {
  channel = 0;
  if (channels == 0) return index;
  Index rest;
  if constexpr (sizeof(Index) == 4)
    rest = by_channels.quotient(index);
  else
    rest = index / channels;
  channel = static_cast<std::int64_t>(index - rest * channels);
  return rest;
}

// argmax (may be null): each output's first maximum, an offset in its input plane (-1: the window lies in the padding).
// channels > 0: channels-last rows of that many channels (the plane of a (sample, channel) is strided by channels).
template <class T, class Index>
__global__ void pooling_forward_kernel(bool max_pooling, Box b, const T* x, T* y, std::int32_t* argmax, Index count,
                                       PlaneDivisors by, Index channels, km::FastDivisor by_channels) {
  const std::int64_t in_size = b.in[0] * b.in[1] * b.in[2];
  const std::int64_t stride = channels > 0 ? static_cast<std::int64_t>(channels) : 1;
  for (Index index = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; index < count;
       index += static_cast<Index>(gridDim.x) * blockDim.x) {
    std::int64_t channel, plane, within, position[3];
    decompose(split_channel(index, channels, by_channels, channel), b.out, by, plane, within, position);
    const T* in = x + plane * in_size * stride + channel;
    if (argmax == nullptr) {
      y[index] = spatial::pooling_output_at(max_pooling, b, in, position[0], position[1], position[2], stride);
    } else {
      const std::int64_t best = spatial::window_argmax(b, in, position[0], position[1], position[2], stride);
      argmax[index] = static_cast<std::int32_t>(best);
      y[index] = best >= 0 ? in[best * stride] : store<T>(-std::numeric_limits<float>::infinity());
    }
  }
}

// argmax (may be null, then the windows are recomputed from x): the forward's first maxima, in y's layout.
template <class T, class Index>
__global__ void pooling_backward_kernel(bool max_pooling, Box b, const T* x, const T* dy, const std::int32_t* argmax,
                                        T* dx, Index count, PlaneDivisors by, Index channels,
                                        km::FastDivisor by_channels) {
  const std::int64_t in_size = b.in[0] * b.in[1] * b.in[2], out_size = b.out[0] * b.out[1] * b.out[2];
  const std::int64_t stride = channels > 0 ? static_cast<std::int64_t>(channels) : 1;
  for (Index index = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; index < count;
       index += static_cast<Index>(gridDim.x) * blockDim.x) {
    std::int64_t channel, plane, within, position[3];
    decompose(split_channel(index, channels, by_channels, channel), b.in, by, plane, within, position);
    const T* in = x + plane * in_size * stride + channel;
    const std::int32_t* kept = argmax != nullptr ? argmax + plane * out_size * stride + channel : nullptr;
    dx[index] = spatial::pooling_input_gradient_at(
        max_pooling, b, dy + plane * out_size * stride + channel, within, position,
        [&](std::int64_t od, std::int64_t oh, std::int64_t ow) -> std::int64_t {
          if (kept != nullptr) return kept[((od * b.out[1] + oh) * b.out[2] + ow) * stride];
          return spatial::window_argmax(b, in, od, oh, ow, stride);
        },
        stride);
  }
}

km::FastDivisor channel_divisor(std::int64_t channels) {
  return channels > 0 ? km::FastDivisor(static_cast<std::uint32_t>(channels)) : km::FastDivisor();
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

// y row r (b, a) = x row r (a, b) transposed; accumulate: y += (f32).
template <class T, class Index>
__global__ void transpose_rows_kernel(const T* x, T* y, Index count, Index a, Index b, bool accumulate) {
  const Index row_size = a * b;
  for (Index index = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; index < count;
       index += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index row = index / row_size, within = index - row * row_size;
    const Index j = within / a, i = within - j * a;  // y (j, i) = x (i, j)
    const T value = x[row * row_size + i * b + j];
    y[index] = accumulate ? store<T>(load(y[index]) + load(value)) : value;
  }
}

}  // namespace

void transpose_rows(cudaStream_t stream, std::int64_t rows, std::int64_t a, std::int64_t b, DType dtype, const void* x,
                    void* y, bool accumulate) {
  const std::int64_t count = rows * a * b;
  if (count == 0) return;
  HPCTRAIN_ASSERT(x != y, "transpose_rows: y must not alias x");
  dispatch_storage(dtype, "transpose_rows", [&]<class T>() {
    const auto* in = static_cast<const T*>(x);
    auto* out = static_cast<T*>(y);
    if (fits_32bit_indexing(count))
      transpose_rows_kernel<T, std::uint32_t><<<blocks_for(count), spatial_threads, 0, stream>>>(
          in, out, static_cast<std::uint32_t>(count), static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(b),
          accumulate);
    else
      transpose_rows_kernel<T, std::int64_t>
          <<<blocks_for(count), spatial_threads, 0, stream>>>(in, out, count, a, b, accumulate);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void convert_spatial_layout(cudaStream_t stream, std::int64_t channels, SpatialLayout from, const TensorView& x,
                            const TensorView& y) {
  HPCTRAIN_ASSERT(channels > 0 && x.cols % channels == 0 && x.dtype == y.dtype && x.rows == y.rows && x.cols == y.cols,
                  "convert_spatial_layout: " << channels << " channels, rows of " << x.cols << " and " << y.cols);
  const std::int64_t positions = x.cols / channels;
  if (from == SpatialLayout::channels_first)
    transpose_rows(stream, x.rows, channels, positions, x.dtype, x.data, y.data, false);
  else
    transpose_rows(stream, x.rows, positions, channels, x.dtype, x.data, y.data, false);
}

bool have_convolutions() {
#if defined(HPCTRAIN_HAVE_CUDNN)
  return true;
#else
  return false;
#endif
}

void pooling_forward(cudaStream_t stream, PoolingKind kind, const SpatialGeometry& g, const TensorView& x,
                     const TensorView& y, std::int32_t* argmax) {
  check_pooling(g, x, y, "pooling_forward");
  HPCTRAIN_ASSERT(argmax == nullptr || (kind == PoolingKind::max && fits_32bit_indexing(g.input_size())),
                  "pooling_forward: argmax for max pooling of planes below 2^31 elements");
  const std::int64_t count = x.rows * g.in_channels * g.output_size();
  if (count == 0) return;
  const Box b = box_of(g);
  const std::int64_t channels = g.layout == SpatialLayout::channels_last ? g.in_channels : 0;
  dispatch_storage(x.dtype, "pooling_forward", [&]<class T>() {
    const auto* in = static_cast<const T*>(x.data);
    auto* out = static_cast<T*>(y.data);
    if (fits_32bit_indexing(count))
      pooling_forward_kernel<T, std::uint32_t><<<blocks_for(count), spatial_threads, 0, stream>>>(
          kind == PoolingKind::max, b, in, out, argmax, static_cast<std::uint32_t>(count), divisors_of(b.out),
          static_cast<std::uint32_t>(channels), channel_divisor(channels));
    else
      pooling_forward_kernel<T, std::int64_t><<<blocks_for(count), spatial_threads, 0, stream>>>(
          kind == PoolingKind::max, b, in, out, argmax, count, PlaneDivisors{}, channels, km::FastDivisor());
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void pooling_backward(cudaStream_t stream, PoolingKind kind, const SpatialGeometry& g, const TensorView& x,
                      const TensorView& dy, const TensorView& dx, const std::int32_t* argmax) {
  check_pooling(g, x, dy, "pooling_backward");
  HPCTRAIN_ASSERT(dx.dtype == x.dtype && dx.rows == x.rows && dx.cols == x.cols, "pooling_backward: dx shape");
  const std::int64_t count = x.rows * g.in_channels * g.input_size();
  if (count == 0) return;
  const Box b = box_of(g);
  const std::int64_t channels = g.layout == SpatialLayout::channels_last ? g.in_channels : 0;
  dispatch_storage(x.dtype, "pooling_backward", [&]<class T>() {
    const auto* in = static_cast<const T*>(x.data);
    const auto* gradient = static_cast<const T*>(dy.data);
    auto* out = static_cast<T*>(dx.data);
    if (fits_32bit_indexing(count))
      pooling_backward_kernel<T, std::uint32_t><<<blocks_for(count), spatial_threads, 0, stream>>>(
          kind == PoolingKind::max, b, in, gradient, argmax, out, static_cast<std::uint32_t>(count), divisors_of(b.in),
          static_cast<std::uint32_t>(channels), channel_divisor(channels));
    else
      pooling_backward_kernel<T, std::int64_t><<<blocks_for(count), spatial_threads, 0, stream>>>(
          kind == PoolingKind::max, b, in, gradient, argmax, out, count, PlaneDivisors{}, channels, km::FastDivisor());
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void groupnorm_forward(cudaStream_t stream, DeviceScratch& scratch, std::int64_t channels, std::int64_t groups,
                       SpatialLayout layout, const TensorView& x, const float* gamma, const float* beta, float eps,
                       const TensorView& y, float* mean, float* rstd) {
  check_groups(channels, groups, x, "groupnorm_forward");
  HPCTRAIN_ASSERT(x.dtype == y.dtype && x.rows == y.rows && x.cols == y.cols, "groupnorm_forward: y shape");
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  normalize_forward(stream, scratch,
                    {x.rows * groups, group_channels * spatial, groups, group_channels, spatial,
                     layout == SpatialLayout::channels_last},
                    x, gamma, beta, eps, y, mean, rstd);
}

void groupnorm_backward(cudaStream_t stream, DeviceScratch& scratch, std::int64_t channels, std::int64_t groups,
                        SpatialLayout layout, const TensorView& x, const TensorView& dy, const float* gamma,
                        const float* mean, const float* rstd, const TensorView& dx, float* dgamma, float* dbeta,
                        bool accumulate) {
  check_groups(channels, groups, x, "groupnorm_backward");
  HPCTRAIN_ASSERT(x.dtype == dy.dtype && x.rows == dy.rows && x.cols == dy.cols && dx.data != dy.data,
                  "groupnorm_backward: shapes, or dx aliasing dy");
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  const bool channels_last = layout == SpatialLayout::channels_last;
  channel_parameter_gradients(stream, scratch, x.rows, channels, groups, x, dy, mean, rstd, dgamma, dbeta, accumulate,
                              channels_last);
  if (dx.data == nullptr || x.rows == 0) return;
  normalize_backward_data(stream, scratch,
                          {x.rows * groups, group_channels * spatial, groups, group_channels, spatial, channels_last},
                          x, dy, gamma, mean, rstd, dx);
}

}  // namespace hpctrain::cuda
