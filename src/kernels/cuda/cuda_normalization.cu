// Segmented layer/group normalisation and per-channel sums of the CUDA backend (see cuda_normalization.hpp).
#include "cuda_dispatch.hpp"
#include "cuda_normalization.hpp"
#include "cuda_reductions.cuh"
#include "hpctrain/kernels/math.hpp"

namespace hpctrain::cuda {
namespace {

namespace km = kernel_math;

// Where element i of segment s lies (see SegmentShape): s * length + i, or in a channels-last groupnorm block
// (position p = i / group_channels, channel j = i % group_channels of group g = s % groups) at
// (s - g) * length + p * channels + g * group_channels + j, since a row holds groups * length = spatial * channels.
struct Address {
  std::int64_t length = 0, groups = 1, group_channels = 1, channels = 0;
  bool channels_last = false;
  km::FastDivisor by_group_channels;
  __device__ __forceinline__ std::int64_t operator()(std::int64_t segment, std::int64_t i) const {
    if (!channels_last) return segment * length + i;
    const std::int64_t g = segment % groups;
    const std::int64_t p = by_group_channels.quotient(static_cast<std::uint32_t>(i));
    return (segment - g) * length + p * channels + g * group_channels + (i - p * group_channels);
  }
};

// Which gamma/beta element i of segment s uses (see SegmentShape).
struct ParameterOf {
  std::int64_t groups = 0, group_channels = 0;
  bool channels_last = false;
  km::FastDivisor spatial, by_group_channels;
  __device__ __forceinline__ std::int64_t operator()(std::int64_t segment, std::int64_t i) const {
    if (groups == 0) return i;
    const auto index = static_cast<std::uint32_t>(i);
    const std::int64_t within =
        channels_last ? index - by_group_channels.quotient(index) * group_channels : spatial.quotient(index);
    return segment % groups * group_channels + within;
  }
};

ParameterOf parameter_of(const SegmentShape& shape) {
  ParameterOf of;
  of.groups = shape.groups;
  of.group_channels = shape.group_channels;
  of.channels_last = shape.channels_last;
  if (shape.groups > 0) {
    HPCTRAIN_ASSERT(fits_32bit_indexing(shape.length), "normalisation: groups of " << shape.length << " elements");
    of.spatial = km::FastDivisor(static_cast<std::uint32_t>(shape.spatial));
    of.by_group_channels = km::FastDivisor(static_cast<std::uint32_t>(shape.group_channels));
  }
  return of;
}

Address address_of(const SegmentShape& shape) {
  Address address;
  address.length = shape.length;
  if (shape.channels_last) {
    HPCTRAIN_ASSERT(shape.groups > 0 && fits_32bit_indexing(shape.length),
                    "normalisation: channels-last groups of " << shape.length << " elements");
    address.channels_last = true;
    address.groups = shape.groups;
    address.group_channels = shape.group_channels;
    address.channels = shape.groups * shape.group_channels;
    address.by_group_channels = km::FastDivisor(static_cast<std::uint32_t>(shape.group_channels));
  }
  return address;
}
// Contiguous segments of `length` (layernorm rows, channel planes).
Address contiguous(std::int64_t length) {
  Address address;
  address.length = length;
  return address;
}

template <class T>
struct Value {
  const T* x;
  Address at;
  __device__ Sums<1> operator()(std::int64_t s, std::int64_t i) const { return {{load(x[at(s, i)])}}; }
};
template <class T>
struct CentredSquare {
  const T* x;
  Address at;
  const float* mean;
  __device__ Sums<1> operator()(std::int64_t s, std::int64_t i) const {
    const float centred = load(x[at(s, i)]) - mean[s];
    return {{centred * centred}};
  }
};
// (g, g * xhat) with g = dy * gamma.
template <class T>
struct GradientTerms {
  const T* x;
  const T* dy;
  const float* gamma;
  const float* mean;
  const float* rstd;
  Address address;
  ParameterOf parameter;
  __device__ Sums<2> operator()(std::int64_t s, std::int64_t i) const {
    const std::int64_t at = address(s, i);
    const float xhat = (load(x[at]) - mean[s]) * rstd[s];
    const float g = gamma != nullptr ? load(dy[at]) * gamma[parameter(s, i)] : load(dy[at]);
    return {{g, g * xhat}};
  }
};

// mean[s] = total / length.
__global__ void segment_mean_kernel(const float* partials, std::int64_t segments, std::int64_t chunks,
                                    std::int64_t length, float* mean) {
  for (std::int64_t s = global_thread(); s < segments; s += grid_threads())
    mean[s] = segment_total<1>(partials, s, chunks, 0) / static_cast<float>(length);
}
__global__ void segment_rstd_kernel(const float* partials, std::int64_t segments, std::int64_t chunks,
                                    std::int64_t length, float eps, float* rstd) {
  for (std::int64_t s = global_thread(); s < segments; s += grid_threads())
    rstd[s] = 1.0f / km::square_root(segment_total<1>(partials, s, chunks, 0) / static_cast<float>(length) + eps);
}
// means[2 s + k] = total_k / length.
__global__ void segment_means2_kernel(const float* partials, std::int64_t segments, std::int64_t chunks,
                                      std::int64_t length, float* means) {
  for (std::int64_t s = global_thread(); s < segments; s += grid_threads())
    for (int k = 0; k < 2; ++k)
      means[2 * s + k] = segment_total<2>(partials, s, chunks, k) / static_cast<float>(length);
}

// One block per (segment, chunk), as the partials.
template <class T>
__global__ void normalize_kernel(const T* x, const float* gamma, const float* beta, T* y, const float* mean,
                                 const float* rstd, std::int64_t length, std::int64_t chunk_length, std::int64_t chunks,
                                 Address address, ParameterOf parameter) {
  const std::int64_t block = blockIdx.x, s = block / chunks, chunk = block - s * chunks;
  const std::int64_t begin = chunk * chunk_length, end = begin + chunk_length < length ? begin + chunk_length : length;
  const float average = mean[s], inverse = rstd[s];
  for (std::int64_t i = begin + threadIdx.x; i < end; i += block_threads) {
    const std::int64_t at = address(s, i);
    if (parameter.groups == 0) {  // layernorm, in the CPU backend's order
      const float normalised = (load(x[at]) - average) * inverse;
      const float scaled = gamma != nullptr ? normalised * gamma[i] : normalised;
      y[at] = store<T>(beta != nullptr ? scaled + beta[i] : scaled);
    } else {  // groupnorm, as the CPU backend: x * a + b
      const std::int64_t c = parameter(s, i);
      const float a = gamma[c] * inverse;
      y[at] = store<T>(load(x[at]) * a + (beta[c] - average * a));
    }
  }
}

template <class T>
__global__ void normalize_backward_kernel(const T* x, const T* dy, const float* gamma, const float* mean,
                                          const float* rstd, const float* means, T* dx, std::int64_t length,
                                          std::int64_t chunk_length, std::int64_t chunks, Address address,
                                          ParameterOf parameter) {
  const std::int64_t block = blockIdx.x, s = block / chunks, chunk = block - s * chunks;
  const std::int64_t begin = chunk * chunk_length, end = begin + chunk_length < length ? begin + chunk_length : length;
  const float average = mean[s], inverse = rstd[s], mean_g = means[2 * s], mean_g_xhat = means[2 * s + 1];
  for (std::int64_t i = begin + threadIdx.x; i < end; i += block_threads) {
    const std::int64_t at = address(s, i);
    const float xhat = (load(x[at]) - average) * inverse;
    const float g = gamma != nullptr ? load(dy[at]) * gamma[parameter(s, i)] : load(dy[at]);
    dx[at] = store<T>(inverse * (g - mean_g - xhat * mean_g_xhat));
  }
}

// Per (row, channel) plane of a channels-first layout: (dy * xhat, dy), xhat from the plane's group statistics.
template <class T>
struct PlaneParameterTerms {
  const T* x;
  const T* dy;
  const float* mean;
  const float* rstd;
  std::int64_t spatial, channels, groups, group_channels;
  __device__ Sums<2> operator()(std::int64_t plane, std::int64_t i) const {
    const std::int64_t row = plane / channels, c = plane - row * channels;
    const std::int64_t statistics = row * groups + c / group_channels;
    const std::int64_t at = plane * spatial + i;
    const float upstream = load(dy[at]);
    return {{upstream * ((load(x[at]) - mean[statistics]) * rstd[statistics]), upstream}};
  }
};

// Channels-last (rows x positions, channels) view: dy * xhat at (r, c), xhat from the (row, group) statistics.
template <class T>
struct ChannelsLastXhatGradient {
  const T* x;
  const T* dy;
  const float* mean;
  const float* rstd;
  std::int64_t spatial, channels, groups, group_channels;
  __device__ float operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t statistics = r / spatial * groups + c / group_channels;
    const std::int64_t at = r * channels + c;
    return load(dy[at]) * ((load(x[at]) - mean[statistics]) * rstd[statistics]);
  }
};
template <class T>
struct ChannelsLastValue {
  const T* dy;
  std::int64_t channels;
  __device__ float operator()(std::int64_t r, std::int64_t c) const { return load(dy[r * channels + c]); }
};

}  // namespace

void normalize_forward(cudaStream_t stream, DeviceScratch& scratch, const SegmentShape& shape, const TensorView& x,
                       const float* gamma, const float* beta, float eps, const TensorView& y, float* mean,
                       float* rstd) {
  if (shape.segments == 0) return;
  const SegmentPlan plan = plan_segments(shape.segments, shape.length);
  const ParameterOf parameter = parameter_of(shape);
  const Address address = address_of(shape);
  auto* partials = scratch.reserve_elements<float>(static_cast<std::size_t>(shape.segments * plan.chunks));
  const unsigned per_segment = grid_for(shape.segments);
  dispatch_storage(x.dtype, "normalisation", [&]<class T>() {
    const auto* in = static_cast<const T*>(x.data);
    launch_segment_partials<1>(stream, shape.segments, shape.length, plan, partials, Value<T>{in, address});
    segment_mean_kernel<<<per_segment, block_threads, 0, stream>>>(partials, shape.segments, plan.chunks, shape.length,
                                                                   mean);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
    launch_segment_partials<1>(stream, shape.segments, shape.length, plan, partials,
                               CentredSquare<T>{in, address, mean});
    segment_rstd_kernel<<<per_segment, block_threads, 0, stream>>>(partials, shape.segments, plan.chunks, shape.length,
                                                                   eps, rstd);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
    normalize_kernel<<<static_cast<unsigned>(shape.segments * plan.chunks), block_threads, 0, stream>>>(
        in, gamma, beta, static_cast<T*>(y.data), mean, rstd, shape.length, plan.chunk_length, plan.chunks, address,
        parameter);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void normalize_backward_data(cudaStream_t stream, DeviceScratch& scratch, const SegmentShape& shape,
                             const TensorView& x, const TensorView& dy, const float* gamma, const float* mean,
                             const float* rstd, const TensorView& dx) {
  if (shape.segments == 0 || dx.data == nullptr) return;
  const SegmentPlan plan = plan_segments(shape.segments, shape.length);
  const ParameterOf parameter = parameter_of(shape);
  const Address address = address_of(shape);
  // (segments, chunks, 2) partials, then (segments, 2) means.
  const std::size_t partial_count = static_cast<std::size_t>(shape.segments * plan.chunks * 2);
  auto* partials = scratch.reserve_elements<float>(partial_count + static_cast<std::size_t>(2 * shape.segments));
  float* means = partials + partial_count;
  dispatch_storage(x.dtype, "normalisation backward", [&]<class T>() {
    const auto* in = static_cast<const T*>(x.data);
    const auto* gradient = static_cast<const T*>(dy.data);
    launch_segment_partials<2>(stream, shape.segments, shape.length, plan, partials,
                               GradientTerms<T>{in, gradient, gamma, mean, rstd, address, parameter});
    segment_means2_kernel<<<grid_for(shape.segments), block_threads, 0, stream>>>(partials, shape.segments, plan.chunks,
                                                                                  shape.length, means);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
    normalize_backward_kernel<<<static_cast<unsigned>(shape.segments * plan.chunks), block_threads, 0, stream>>>(
        in, gradient, gamma, mean, rstd, means, static_cast<T*>(dx.data), shape.length, plan.chunk_length, plan.chunks,
        address, parameter);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void channel_parameter_gradients(cudaStream_t stream, DeviceScratch& scratch, std::int64_t rows, std::int64_t channels,
                                 std::int64_t groups, const TensorView& x, const TensorView& dy, const float* mean,
                                 const float* rstd, float* dgamma, float* dbeta, bool accumulate, bool channels_last) {
  if (dgamma == nullptr && dbeta == nullptr) return;
  const std::int64_t planes = rows * channels, spatial = x.cols / channels;
  if (channels_last) {  // column sums over the (row, position) rows of channels
    dispatch_storage(x.dtype, "groupnorm parameter gradients", [&]<class T>() {
      const auto* in = static_cast<const T*>(x.data);
      const auto* gradient = static_cast<const T*>(dy.data);
      if (dgamma != nullptr)
        launch_column_sums(
            stream, scratch, rows * spatial, channels, dgamma, accumulate,
            ChannelsLastXhatGradient<T>{in, gradient, mean, rstd, spatial, channels, groups, channels / groups});
      if (dbeta != nullptr)
        launch_column_sums(stream, scratch, rows * spatial, channels, dbeta, accumulate,
                           ChannelsLastValue<T>{gradient, channels});
    });
    return;
  }
  const SegmentPlan plan = plan_segments(planes, spatial);
  auto* partials =
      scratch.reserve_elements<float>(static_cast<std::size_t>(std::max<std::int64_t>(planes, 1) * plan.chunks * 2));
  dispatch_storage(x.dtype, "groupnorm parameter gradients", [&]<class T>() {
    if (planes > 0)
      launch_segment_partials<2>(stream, planes, spatial, plan, partials,
                                 PlaneParameterTerms<T>{static_cast<const T*>(x.data), static_cast<const T*>(dy.data),
                                                        mean, rstd, spatial, channels, groups, channels / groups});
  });
  channel_totals_kernel<2><<<grid_for(channels), block_threads, 0, stream>>>(partials, rows, channels, plan.chunks,
                                                                             dgamma, dbeta, accumulate);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

void channel_sums(cudaStream_t stream, DeviceScratch& scratch, std::int64_t rows, std::int64_t channels,
                  const TensorView& dy, float* dbias, bool accumulate) {
  const std::int64_t planes = rows * channels, spatial = dy.cols / channels;
  const SegmentPlan plan = plan_segments(planes, spatial);
  auto* partials =
      scratch.reserve_elements<float>(static_cast<std::size_t>(std::max<std::int64_t>(planes, 1) * plan.chunks));
  dispatch_storage(dy.dtype, "channel sums", [&]<class T>() {
    if (planes > 0)
      launch_segment_partials<1>(stream, planes, spatial, plan, partials,
                                 Value<T>{static_cast<const T*>(dy.data), contiguous(spatial)});
  });
  channel_totals_kernel<1><<<grid_for(channels), block_threads, 0, stream>>>(partials, rows, channels, plan.chunks,
                                                                             dbias, nullptr, accumulate);
  HPCTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace hpctrain::cuda
