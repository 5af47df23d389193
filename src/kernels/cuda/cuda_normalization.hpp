// Layer and group normalisation over contiguous segments, cut into chunks of a 2-D grid (kernels/cuda/launch_plan.hpp):
// layernorm rows too long or too few for a warp each, and groupnorm (sample, group) blocks (channels-first: contiguous;
// channels-last: strided runs of a group's channels). Statistics
// are two-pass (mean, then centred squares), added in a fixed order. Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_memory.hpp"
#include "hpctrain/core/tensor.hpp"

namespace hpctrain::cuda {

// `segments` segments of `length` contiguous elements. Element i of segment s uses parameter (gamma, beta) i for a
// layernorm (groups == 0), else channel (s % groups) * group_channels + i / spatial of a channels-first groupnorm.
// channels_last (groupnorm only): segment s is the (row, group) block of a (rows, spatial, channels) layout, element
// i its position i / group_channels and channel (s % groups) * group_channels + i % group_channels (strided runs of
// group_channels contiguous elements).
struct SegmentShape {
  std::int64_t segments = 0, length = 0;
  std::int64_t groups = 0, group_channels = 0, spatial = 1;
  bool channels_last = false;
};

// y = normalised x (gamma/beta may be null for a layernorm); mean, rstd: (segments) fp32, kept for the backward.
void normalize_forward(cudaStream_t stream, DeviceScratch& scratch, const SegmentShape& shape, const TensorView& x,
                       const float* gamma, const float* beta, float eps, const TensorView& y, float* mean, float* rstd);
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma; dx may alias dy.
void normalize_backward_data(cudaStream_t stream, DeviceScratch& scratch, const SegmentShape& shape,
                             const TensorView& x, const TensorView& dy, const float* gamma, const float* mean,
                             const float* rstd, const TensorView& dx);
// Per-channel parameter gradients of a channels-first (rows, channels, spatial) or channels-last (rows, spatial,
// channels) layout: dgamma[c] (+)= sum dy * xhat, dbeta[c] (+)= sum dy over rows and positions (either may be null).
// xhat from the (row, group) statistics.
void channel_parameter_gradients(cudaStream_t stream, DeviceScratch& scratch, std::int64_t rows, std::int64_t channels,
                                 std::int64_t groups, const TensorView& x, const TensorView& dy, const float* mean,
                                 const float* rstd, float* dgamma, float* dbeta, bool accumulate, bool channels_last);
// dbias[c] (+)= sum of dy over rows and positions of a channels-first (rows, channels, spatial) layout.
void channel_sums(cudaStream_t stream, DeviceScratch& scratch, std::int64_t rows, std::int64_t channels,
                  const TensorView& dy, float* dbias, bool accumulate);

}  // namespace hpctrain::cuda
