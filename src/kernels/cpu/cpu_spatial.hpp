// Spatial helpers of the CPU backend shared by convolution and pooling, the pooling, group-normalisation and
// layout-conversion kernels (OpenMP loops over one (sample, channel) plane or (sample, group) block per thread).
// Private to src/kernels/cpu.
#pragma once

#include <algorithm>
#include <cstdint>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/spatial_taps.hpp"

namespace hpctrain::cpu {

// The window arithmetic, shared with the CUDA kernels (kernels/spatial_taps.hpp).
using spatial::Box;
using spatial::box_of;
using spatial::for_each_output;
using spatial::for_each_tap;
using spatial::window_argmax;

inline void check_pooling(const SpatialGeometry& g, const TensorView& x, const TensorView& y, const char* what) {
  HPCTRAIN_ASSERT(g.in_channels == g.out_channels && x.dtype == y.dtype && x.rows == y.rows &&
                      x.cols == g.in_channels * g.input_size() && y.cols == g.out_channels * g.output_size(),
                  what << ": shapes/dtypes do not match the geometry");
}

// Windows that tile the input without overlap (stride = kernel, no padding: the usual 2x2(x2) pooling): every input
// position gets the gradient of at most one output, so each window writes its own part of dx directly and no scatter
// or accumulation buffer is needed.
inline bool windows_tile_the_input(const Box& b) {
  for (std::size_t a = 0; a < 3; ++a)
    if (b.stride[a] != b.kernel[a] || b.padding[a] != 0 || b.dilation[a] != 1) return false;
  return true;
}

// The channels-last windows run the per-channel rule of spatial::window_argmax as selects over a vector of channels
// (no branches, so the channel loops vectorise): a value replaces the best so far when the best is not NaN and the
// value is larger or NaN (a NaN counts as largest and sticks; the first maximum wins a tie).
template <class C>
bool replaces_best(C best, C value) {
  return best == best && (value > best || value != value);
}

// Each channel's first maximum of the window at output position (od, oh, ow), as a position within the sample (-1:
// none). best_index, best_value: (channels).
template <class T, class C>
void window_argmax_channels_last(const Box& b, std::int64_t channels, const T* in, std::int64_t od, std::int64_t oh,
                                 std::int64_t ow, std::int32_t* __restrict best_index, C* __restrict best_value) {
  std::fill_n(best_index, channels, -1);
  std::fill_n(best_value, channels, C(0));
  for_each_tap(b, od, oh, ow, [&](std::int64_t i, std::int64_t) {
    const T* __restrict values = in + i * channels;
    const auto tap = static_cast<std::int32_t>(i);
#pragma omp simd
    for (std::int64_t c = 0; c < channels; ++c) {
      const C value = load(values[c]);
      const bool take = best_index[c] < 0 || replaces_best(best_value[c], value);
      best_index[c] = take ? tap : best_index[c];
      best_value[c] = take ? value : best_value[c];
    }
  });
}

// The contracts of Backend::pooling_* and Backend::groupnorm_*.
void pooling_forward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& y);
void pooling_backward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                      const TensorView& dx);
void groupnorm_forward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                       const void* gamma, const void* beta, float eps, const TensorView& y, void* mean, void* rstd);
void groupnorm_backward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                        const TensorView& dy, const void* gamma, const void* mean, const void* rstd,
                        const TensorView& dx, void* dgamma, void* dbeta, bool accumulate);
// Backend::max_pooling_forward/backward (cpu_max_pooling.cpp): argmax null runs the plain operations.
void max_pooling_forward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& y,
                         std::int32_t* argmax);
void max_pooling_backward(const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                          const std::int32_t* argmax, const TensorView& dx);
// Backend::convert_spatial_layout (also used by the f64 convolution loops, which run channels-first).
void convert_layout(std::int64_t channels, SpatialLayout from, const TensorView& x, const TensorView& y);

}  // namespace hpctrain::cpu
