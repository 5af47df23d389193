// The per-element pooling functions the CUDA kernels run (kernels/spatial_taps.hpp: one output, or the gathered
// gradient of one input) against the CPU backend's loops, on the host: bit for bit, for 2-D and 3-D windows with
// stride, padding and dilation, ties in every window, both dtypes the kernels see most (f32, bf16). So the GPU's
// pooling arithmetic is checked on every machine, not only where a GPU is.
#include "hpctrain/kernels/spatial_taps.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpctrain/core/half.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

// A pooling window over 2 channels, the same extent on every axis.
SpatialGeometry window(int dimensions, std::array<std::int64_t, 3> input, std::int64_t kernel, std::int64_t stride,
                       std::int64_t padding, std::int64_t dilation) {
  const auto same = [dimensions](std::int64_t value) {
    return std::array<std::int64_t, 3>{value, value, dimensions == 3 ? value : 0};
  };
  return test_support::make_geometry(dimensions, 2, 2, 1, input, same(kernel), same(stride), same(padding),
                                     same(dilation));
}

template <class T>
std::vector<T> values(std::size_t count, std::uint32_t seed, bool quantised) {
  std::vector<T> out(count);
  std::uint32_t state = seed;
  for (auto& value : out) {
    state = state * 1664525u + 1013904223u;
    float v = static_cast<float>(state >> 8) / 16777216.0f * 4.0f - 2.0f;
    if (quantised) v = std::round(v * 4.0f) / 4.0f;  // ties in the windows
    value = store<T>(v);
  }
  return out;
}

template <class T>
std::vector<std::uint16_t> bits(const std::vector<T>& data) {  // compare storage exactly (NaN-safe)
  std::vector<std::uint16_t> out;
  const auto* raw = reinterpret_cast<const std::uint16_t*>(data.data());
  out.assign(raw, raw + data.size() * sizeof(T) / 2);
  return out;
}

template <class T>
void check(Backend& cpu, const SpatialGeometry& g, PoolingKind kind, const std::string& where) {
  const std::int64_t rows = 3, in_size = g.input_size(), out_size = g.output_size();
  const std::int64_t planes = rows * g.in_channels;
  const auto x = values<T>(static_cast<std::size_t>(planes * in_size), 7, true);
  const auto dy = values<T>(static_cast<std::size_t>(planes * out_size), 11, false);
  std::vector<T> y_cpu(dy.size()), dx_cpu(x.size()), y_element(dy.size()), dx_element(x.size());
  const DType type = dtype_of<T>();
  const TensorView xv{const_cast<T*>(x.data()), type, rows, g.in_channels * in_size};
  const TensorView dyv{const_cast<T*>(dy.data()), type, rows, g.out_channels * out_size};
  cpu.pooling_forward(kind, g, xv, {y_cpu.data(), type, rows, g.out_channels * out_size});
  cpu.pooling_backward(kind, g, xv, dyv, {dx_cpu.data(), type, rows, g.in_channels * in_size});
  const spatial::Box b = spatial::box_of(g);
  const bool max_pooling = kind == PoolingKind::max;
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    for (std::int64_t o = 0; o < out_size; ++o)
      y_element[static_cast<std::size_t>(plane * out_size + o)] =
          spatial::pooling_output(max_pooling, b, x.data() + plane * in_size, o);
    for (std::int64_t i = 0; i < in_size; ++i)
      dx_element[static_cast<std::size_t>(plane * in_size + i)] =
          spatial::pooling_input_gradient(max_pooling, b, x.data() + plane * in_size, dy.data() + plane * out_size, i);
  }
  EXPECT_EQ(bits(y_element), bits(y_cpu)) << where;
  EXPECT_EQ(bits(dx_element), bits(dx_cpu)) << where;
}

// Channels-last rows (the CUDA backend's 16-bit conv stacks): the same functions with the channel count as stride,
// pointed at a channel's first element, against the CPU backend's channels-last loops.
template <class T>
void check_channels_last(Backend& cpu, SpatialGeometry g, PoolingKind kind, const std::string& where) {
  g.layout = SpatialLayout::channels_last;
  const std::int64_t rows = 3, channels = g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  const auto x = values<T>(static_cast<std::size_t>(rows * channels * in_size), 13, true);
  const auto dy = values<T>(static_cast<std::size_t>(rows * channels * out_size), 17, false);
  std::vector<T> y_cpu(dy.size()), dx_cpu(x.size()), y_element(dy.size()), dx_element(x.size());
  const DType type = dtype_of<T>();
  const TensorView xv{const_cast<T*>(x.data()), type, rows, channels * in_size};
  const TensorView dyv{const_cast<T*>(dy.data()), type, rows, channels * out_size};
  cpu.pooling_forward(kind, g, xv, {y_cpu.data(), type, rows, channels * out_size});
  cpu.pooling_backward(kind, g, xv, dyv, {dx_cpu.data(), type, rows, channels * in_size});
  const spatial::Box b = spatial::box_of(g);
  const bool max_pooling = kind == PoolingKind::max;
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t c = 0; c < channels; ++c) {
      const T* in = x.data() + n * in_size * channels + c;
      const T* gradient = dy.data() + n * out_size * channels + c;
      for (std::int64_t o = 0; o < out_size; ++o)
        y_element[static_cast<std::size_t>((n * out_size + o) * channels + c)] = spatial::pooling_output_at(
            max_pooling, b, in, o / (b.out[2] * b.out[1]), o / b.out[2] % b.out[1], o % b.out[2], channels);
      for (std::int64_t i = 0; i < in_size; ++i) {
        const std::int64_t position[3] = {i / (b.in[2] * b.in[1]), i / b.in[2] % b.in[1], i % b.in[2]};
        dx_element[static_cast<std::size_t>((n * in_size + i) * channels + c)] = spatial::pooling_input_gradient_at(
            max_pooling, b, gradient, i, position,
            [&](std::int64_t od, std::int64_t oh, std::int64_t ow) {
              return spatial::window_argmax(b, in, od, oh, ow, channels);
            },
            channels);
      }
    }
  EXPECT_EQ(bits(y_element), bits(y_cpu)) << where << " channels-last";
  EXPECT_EQ(bits(dx_element), bits(dx_cpu)) << where << " channels-last";
}

TEST(SpatialTaps, PoolingElementsEqualTheCpuLoopsBitForBit) {
  const auto cpu = make_cpu_backend();
  const SpatialGeometry geometries[] = {
      window(2, {9, 8, 0}, 3, 2, 1, 1),  window(2, {7, 7, 0}, 2, 2, 0, 1), window(2, {8, 9, 0}, 3, 1, 1, 1),
      window(2, {10, 9, 0}, 3, 2, 2, 2), window(2, {5, 6, 0}, 2, 3, 1, 1), window(3, {4, 4, 6}, 2, 2, 0, 1),
      window(3, {5, 4, 5}, 3, 2, 1, 1),  window(3, {6, 5, 7}, 2, 1, 1, 2), window(2, {6, 5, 0}, 1, 1, 0, 1)};
  for (const SpatialGeometry& g : geometries)
    for (PoolingKind kind : {PoolingKind::max, PoolingKind::average}) {
      const std::string where = test_support::describe(g) + (kind == PoolingKind::max ? " max" : " average");
      check<float>(*cpu, g, kind, where + " f32");
      check<bf16>(*cpu, g, kind, where + " bf16");
      check_channels_last<float>(*cpu, g, kind, where + " f32");
      check_channels_last<bf16>(*cpu, g, kind, where + " bf16");
    }
}

TEST(SpatialTaps, GlobalAveragePoolingAndWindowsInThePadding) {
  const auto cpu = make_cpu_backend();
  SpatialGeometry global = window(2, {6, 5, 0}, 1, 1, 0, 1);
  global.kernel = {6, 5, 0};
  global.output = {1, 1, 0};
  check<float>(*cpu, global, PoolingKind::average, "global average");
  // Padding as large as the kernel: the corner windows hold no input (max gives -inf, average 0).
  const SpatialGeometry padded = window(2, {4, 4, 0}, 2, 2, 2, 1);
  check<float>(*cpu, padded, PoolingKind::max, "padding = kernel, max");
  check<float>(*cpu, padded, PoolingKind::average, "padding = kernel, average");
}

}  // namespace
}  // namespace hpctrain
