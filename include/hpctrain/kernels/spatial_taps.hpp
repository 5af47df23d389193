// The window arithmetic of convolution and pooling, shared by the CPU loops (src/kernels/cpu) and the CUDA kernels
// (src/kernels/cuda): the same taps in the same order on both, so max pooling (first maximum) agrees bit for bit.
// HPCTRAIN_HD functions: nvcc compiles them for the device too (std::array's constexpr accessors need
// --expt-relaxed-constexpr, which the CUDA build passes).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/half.hpp"
#include "hpctrain/core/host_device.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::spatial {

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
HPCTRAIN_HD void tap_range(std::int64_t start, std::int64_t extent, std::int64_t kernel, std::int64_t dilation,
                           std::int64_t& first, std::int64_t& last) {
  if (dilation == 1) {  // the usual case, without the divisions (they dominate small windows' cost)
    first = start < 0 ? -start : 0;
    last = start >= extent ? 0 : (kernel < extent - start ? kernel : extent - start);
    return;
  }
  first = start < 0 ? (-start + dilation - 1) / dilation : 0;
  const std::int64_t reach = (extent - start + dilation - 1) / dilation;
  last = start >= extent ? 0 : (kernel < reach ? kernel : reach);
}

// Calls visit(input_offset, kernel_offset) for every kernel tap of output position (od, oh, ow) that lands inside the
// input (offsets within one channel), in kernel order. The taps are clipped per axis first, so the inner loop has no
// bounds checks.
template <class Visit>
HPCTRAIN_HD void for_each_tap(const Box& b, std::int64_t od, std::int64_t oh, std::int64_t ow, Visit visit) {
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
HPCTRAIN_HD void for_each_output(const Box& b, Visit visit) {
  std::int64_t o = 0;
  for (std::int64_t od = 0; od < b.out[0]; ++od)
    for (std::int64_t oh = 0; oh < b.out[1]; ++oh)
      for (std::int64_t ow = 0; ow < b.out[2]; ++ow) visit(o++, od, oh, ow);
}

// The first largest input of a window (a NaN counts as largest, so NaN propagates as in PyTorch); -1 when no tap
// lands inside the input. Max pooling's forward and its backward (which recomputes it instead of storing indices).
// stride: elements between neighbouring positions of one channel (1 channels-first; the channel count channels-last,
// `in` then pointing at the channel's first element); offsets stay in positions.
template <class T>
HPCTRAIN_HD std::int64_t window_argmax(const Box& b, const T* in, std::int64_t od, std::int64_t oh, std::int64_t ow,
                                       std::int64_t stride = 1) {
  std::int64_t best = -1;
  compute_t<T> best_value = 0;
  for_each_tap(b, od, oh, ow, [&](std::int64_t i, std::int64_t) {
    const auto value = load(in[i * stride]);
    const bool value_is_nan = value != value, best_is_nan = best_value != best_value;
    if (best < 0 || (!best_is_nan && (value > best_value || value_is_nan))) {
      best = i;
      best_value = value;
    }
  });
  return best;
}

// Pooling of output element o of one plane, as the CPU loops compute it (max: the window's first maximum, -inf when
// the window lies in the padding; average: the taps inside the input summed in kernel order, divided by the whole
// kernel size). The CUDA forward kernel runs this per output element.
template <class T>
HPCTRAIN_HD T pooling_output_at(bool max_pooling, const Box& b, const T* in, std::int64_t od, std::int64_t oh,
                                std::int64_t ow, std::int64_t stride = 1) {
  using C = compute_t<T>;
  if (max_pooling) {
    const std::int64_t best = window_argmax(b, in, od, oh, ow, stride);
    return best >= 0 ? in[best * stride] : store<T>(-std::numeric_limits<C>::infinity());
  }
  C sum = 0;
  for_each_tap(b, od, oh, ow, [&](std::int64_t i, std::int64_t) { sum += load(in[i * stride]); });
  return store<T>(sum / static_cast<C>(b.kernel[0] * b.kernel[1] * b.kernel[2]));
}
// The same for output element o of one plane (its position decomposed here; the CUDA kernel passes it decomposed).
template <class T>
HPCTRAIN_HD T pooling_output(bool max_pooling, const Box& b, const T* in, std::int64_t o) {
  return pooling_output_at(max_pooling, b, in, o / (b.out[2] * b.out[1]), o / b.out[2] % b.out[1], o % b.out[2]);
}

// The gradient of input element i of one plane: the outputs whose windows contain it, visited in output (memory)
// order, each adding its gradient (max: only where i is the window's first maximum; average: divided by the kernel
// size), rounded once. The CPU loops scatter every output's gradient in output order, so this gather makes the same
// additions in the same order; the CUDA backward kernel runs it per input element (no atomics).
// position: i's (d, h, w) in the plane. winner(od, oh, ow): the input offset a max window chose (its first maximum).
// stride: as window_argmax's, for the gradient (channels-last: `gradient` points at the channel's first element).
template <class T, class Winner>
HPCTRAIN_HD T pooling_input_gradient_at(bool max_pooling, const Box& b, const T* gradient, std::int64_t i,
                                        const std::int64_t (&position)[3], Winner winner, std::int64_t stride = 1) {
  using C = compute_t<T>;
  const C divisor = static_cast<C>(b.kernel[0] * b.kernel[1] * b.kernel[2]);
  // Along an axis, output o reads tap k at o * stride - padding + k * dilation: for each tap k, descending so that o
  // ascends, the output is (position + padding - k * dilation) / stride when that divides and is in range.
  const auto output_of = [&](std::size_t axis, std::int64_t k) -> std::int64_t {
    const std::int64_t t = position[axis] + b.padding[axis] - k * b.dilation[axis];
    if (t < 0 || t % b.stride[axis] != 0 || t / b.stride[axis] >= b.out[axis]) return -1;
    return t / b.stride[axis];
  };
  C sum = 0;
  for (std::int64_t kd = b.kernel[0] - 1; kd >= 0; --kd) {
    const std::int64_t od = output_of(0, kd);
    if (od < 0) continue;
    for (std::int64_t kh = b.kernel[1] - 1; kh >= 0; --kh) {
      const std::int64_t oh = output_of(1, kh);
      if (oh < 0) continue;
      for (std::int64_t kw = b.kernel[2] - 1; kw >= 0; --kw) {
        const std::int64_t ow = output_of(2, kw);
        if (ow < 0) continue;
        const C upstream = load(gradient[((od * b.out[1] + oh) * b.out[2] + ow) * stride]);
        if (!max_pooling)
          sum += upstream / divisor;
        else if (winner(od, oh, ow) == i)
          sum += upstream;
      }
    }
  }
  return store<T>(sum);
}
// The same, recomputing each window's first maximum from the input (the CPU loops' rule).
template <class T>
HPCTRAIN_HD T pooling_input_gradient(bool max_pooling, const Box& b, const T* in, const T* gradient, std::int64_t i) {
  const std::int64_t position[3] = {i / (b.in[2] * b.in[1]), i / b.in[2] % b.in[1], i % b.in[2]};
  return pooling_input_gradient_at(
      max_pooling, b, gradient, i, position,
      [&](std::int64_t od, std::int64_t oh, std::int64_t ow) { return window_argmax(b, in, od, oh, ow); });
}

// Mixes a geometry into a hash (boost::hash_combine's recipe): the convolution caches' keys on both backends.
inline void hash_geometry(std::size_t& hash, const SpatialGeometry& g) {
  const auto mix = [&hash](std::int64_t value) {
    hash ^= static_cast<std::size_t>(value) + 0x9e3779b97f4a7c15ull + (hash << 6) + (hash >> 2);
  };
  mix(g.dimensions);
  mix(g.in_channels);
  mix(g.out_channels);
  mix(g.groups);
  mix(static_cast<std::int64_t>(g.layout));
  for (const auto* extents : {&g.input, &g.output, &g.kernel, &g.stride, &g.padding, &g.dilation})
    for (auto value : *extents) mix(value);
}

// The contracts of Backend::convolution_*: a valid geometry, and operands of its shapes: `in` on the input side (x or
// dx), `out` on the output side (y or dy), of one dtype.
inline void check_convolution(const SpatialGeometry& g, const TensorView& in, const TensorView& out,
                              const TensorView& weight, const char* what) {
  HPCTRAIN_ASSERT((g.dimensions == 2 || g.dimensions == 3) && g.groups >= 1 && g.in_channels % g.groups == 0 &&
                      g.out_channels % g.groups == 0,
                  what << ": bad geometry (" << g.dimensions << "-D, " << g.in_channels << " -> " << g.out_channels
                       << " channels, " << g.groups << " groups)");
  HPCTRAIN_ASSERT(in.dtype == out.dtype && in.rows == out.rows && in.cols == g.in_channels * g.input_size() &&
                      out.cols == g.out_channels * g.output_size() &&
                      weight.size() == g.out_channels * g.in_channels / g.groups * g.kernel_size(),
                  what << ": shapes/dtypes do not match the geometry");
}

}  // namespace hpctrain::spatial
