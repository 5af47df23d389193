// Spatial helpers of the CPU backend shared by convolution and pooling, and the pooling and group-normalisation
// kernels (OpenMP loops over one (sample, channel) plane or (sample, group) block per thread). Private to
// src/kernels/cpu.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cpu {

// A geometry seen as 3-D: a 2-D one gets a depth axis of extent 1 in front, so one loop nest serves both.
struct Box {
  std::array<std::int64_t, 3> in{}, out{}, kernel{}, stride{}, padding{}, dilation{};
};

inline Box box_of(const SpatialGeometry& geometry) {
  Box box;
  const int missing = 3 - geometry.dimensions;
  for (int axis = 0; axis < 3; ++axis) {
    const auto a = static_cast<std::size_t>(axis);
    if (axis < missing) {
      box.in[a] = box.out[a] = box.kernel[a] = box.stride[a] = box.dilation[a] = 1;
      box.padding[a] = 0;
      continue;
    }
    const auto g = static_cast<std::size_t>(axis - missing);
    box.in[a] = geometry.input[g];
    box.out[a] = geometry.output[g];
    box.kernel[a] = geometry.kernel[g];
    box.stride[a] = geometry.stride[g];
    box.padding[a] = geometry.padding[g];
    box.dilation[a] = geometry.dilation[g];
  }
  return box;
}

// The taps k in [first, last) of one axis whose input position start + k * dilation lies in [0, extent).
inline void tap_range(std::int64_t start, std::int64_t extent, std::int64_t kernel, std::int64_t dilation,
                      std::int64_t& first, std::int64_t& last) {
  first = start < 0 ? (-start + dilation - 1) / dilation : 0;
  last = start >= extent ? 0 : std::min(kernel, (extent - start + dilation - 1) / dilation);
}

// Calls visit(input_offset, kernel_offset) for every kernel tap of output position (od, oh, ow) that lands inside the
// input (offsets within one channel), in kernel order. The taps are clipped per axis first, so the inner loop has no
// bounds checks.
template <class Visit>
void for_each_tap(const Box& b, std::int64_t od, std::int64_t oh, std::int64_t ow, Visit visit) {
  const std::int64_t start[3] = {od * b.stride[0] - b.padding[0], oh * b.stride[1] - b.padding[1],
                                 ow * b.stride[2] - b.padding[2]};
  std::int64_t first[3], last[3];
  for (std::size_t a = 0; a < 3; ++a) tap_range(start[a], b.in[a], b.kernel[a], b.dilation[a], first[a], last[a]);
  for (std::int64_t kd = first[0]; kd < last[0]; ++kd) {
    const std::int64_t id = start[0] + kd * b.dilation[0];
    for (std::int64_t kh = first[1]; kh < last[1]; ++kh) {
      const std::int64_t ih = start[1] + kh * b.dilation[1];
      const std::int64_t input_row = (id * b.in[1] + ih) * b.in[2] + start[2];
      const std::int64_t kernel_row = (kd * b.kernel[1] + kh) * b.kernel[2];
      for (std::int64_t kw = first[2]; kw < last[2]; ++kw) visit(input_row + kw * b.dilation[2], kernel_row + kw);
    }
  }
}

// Calls visit(output_offset, od, oh, ow) for every output position of one channel, in memory order.
template <class Visit>
void for_each_output(const Box& b, Visit visit) {
  std::int64_t o = 0;
  for (std::int64_t od = 0; od < b.out[0]; ++od)
    for (std::int64_t oh = 0; oh < b.out[1]; ++oh)
      for (std::int64_t ow = 0; ow < b.out[2]; ++ow) visit(o++, od, oh, ow);
}

// The contracts of Backend::pooling_* and Backend::groupnorm_*.
void pooling_forward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& y);
void pooling_backward(PoolingKind kind, const SpatialGeometry& geometry, const TensorView& x, const TensorView& dy,
                      const TensorView& dx);
void groupnorm_forward(std::int64_t channels, std::int64_t groups, const TensorView& x, const void* gamma,
                       const void* beta, float eps, const TensorView& y, void* mean, void* rstd);
void groupnorm_backward(std::int64_t channels, std::int64_t groups, const TensorView& x, const TensorView& dy,
                        const void* gamma, const void* mean, const void* rstd, const TensorView& dx, void* dgamma,
                        void* dbeta, bool accumulate);

}  // namespace hpctrain::cpu
