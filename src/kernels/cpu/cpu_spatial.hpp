// Spatial helpers of the CPU backend shared by convolution and pooling, the pooling, group-normalisation and
// layout-conversion kernels (OpenMP loops over one (sample, channel) plane or (sample, group) block per thread).
// Private to src/kernels/cpu.
#pragma once

#include <cstdint>

#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/spatial_taps.hpp"

namespace hpctrain::cpu {

// The window arithmetic, shared with the CUDA kernels (kernels/spatial_taps.hpp).
using spatial::Box;
using spatial::box_of;
using spatial::for_each_output;
using spatial::for_each_tap;
using spatial::window_argmax;

// The contracts of Backend::pooling_* and Backend::groupnorm_*.
void pooling_forward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& y);
void pooling_backward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                      const TensorView& dx);
void groupnorm_forward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                       const void* gamma, const void* beta, float eps, const TensorView& y, void* mean, void* rstd);
void groupnorm_backward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                        const TensorView& dy, const void* gamma, const void* mean, const void* rstd,
                        const TensorView& dx, void* dgamma, void* dbeta, bool accumulate);
// Backend::convert_spatial_layout (also used by the f64 convolution loops, which run channels-first).
void convert_layout(std::int64_t channels, SpatialLayout from, const TensorView& x, const TensorView& y);

}  // namespace hpctrain::cpu
