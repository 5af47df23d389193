// Max pooling of the CPU backend, bit for bit against the per-element definition (kernels/spatial_taps.hpp: the first
// maximum of each window, a NaN counting as largest and the first NaN sticking), in both layouts, for the plain
// operations and for the argmax-keeping ones a training step calls (max_pooling_forward/backward), on inputs full of
// ties, NaNs, infinities and signed zeros. Outputs and the argmax are poisoned before every call.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "hpctrain/core/half.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/spatial_taps.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

constexpr std::int64_t rows = 3, channels = 5;  // 5 channels: no whole vector of any width

SpatialGeometry window(int dimensions, std::array<std::int64_t, 3> input, std::int64_t kernel, std::int64_t stride,
                       std::int64_t padding, std::int64_t dilation) {
  const auto same = [dimensions](std::int64_t value) {
    return std::array<std::int64_t, 3>{value, value, dimensions == 3 ? value : 0};
  };
  return test_support::make_geometry(dimensions, channels, channels, 1, input, same(kernel), same(stride),
                                     same(padding), same(dilation));
}

// Values on a coarse grid (ties in most windows) with NaNs, infinities and both zeros mixed in.
template <class T>
std::vector<T> awkward_values(std::size_t count, std::uint32_t seed, bool specials) {
  std::vector<T> out(count);
  std::uint32_t state = seed;
  for (auto& value : out) {
    state = state * 1664525u + 1013904223u;
    const std::uint32_t pick = state >> 24;
    float v = std::round((static_cast<float>(state >> 8 & 0xffff) / 65536.0f * 4.0f - 2.0f) * 2.0f) / 2.0f;
    if (specials) {
      if (pick < 20)
        v = std::numeric_limits<float>::quiet_NaN();
      else if (pick < 30)
        v = -std::numeric_limits<float>::infinity();
      else if (pick < 36)
        v = std::numeric_limits<float>::infinity();
      else if (pick < 60)
        v = pick % 2 == 0 ? 0.0f : -0.0f;
    }
    value = store<T>(v);
  }
  return out;
}

// (rows, C, S) <-> (rows, S, C).
template <class T>
std::vector<T> transpose(const std::vector<T>& in, std::int64_t positions, bool to_channels_last) {
  std::vector<T> out(in.size());
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t c = 0; c < channels; ++c)
      for (std::int64_t s = 0; s < positions; ++s) {
        const std::int64_t first = (n * channels + c) * positions + s, last = (n * positions + s) * channels + c;
        out[static_cast<std::size_t>(to_channels_last ? last : first)] =
            in[static_cast<std::size_t>(to_channels_last ? first : last)];
      }
  return out;
}

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& values) {  // exact comparison, NaN-safe
  std::vector<unsigned char> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <class T>
void check(const SpatialGeometry& geometry, bool specials, const std::string& where) {
  const std::int64_t in_size = geometry.input_size(), out_size = geometry.output_size();
  const auto x = awkward_values<T>(static_cast<std::size_t>(rows * channels * in_size), 17, specials);
  auto dy = awkward_values<T>(static_cast<std::size_t>(rows * channels * out_size), 23, false);
  for (std::size_t i = 0; i < dy.size(); i += 7) dy[i] = store<T>(-0.0f);  // 0 + (-0) is +0 in dx
  // The definition, per channels-first plane.
  const spatial::Box b = spatial::box_of(geometry);
  std::vector<T> y_reference(dy.size()), dx_reference(x.size());
  for (std::int64_t plane = 0; plane < rows * channels; ++plane) {
    for (std::int64_t o = 0; o < out_size; ++o)
      y_reference[static_cast<std::size_t>(plane * out_size + o)] =
          spatial::pooling_output(true, b, x.data() + plane * in_size, o);
    for (std::int64_t i = 0; i < in_size; ++i)
      dx_reference[static_cast<std::size_t>(plane * in_size + i)] =
          spatial::pooling_input_gradient(true, b, x.data() + plane * in_size, dy.data() + plane * out_size, i);
  }
  const DType type = dtype_of<T>();
  for (const SpatialLayout layout : {SpatialLayout::channels_first, SpatialLayout::channels_last}) {
    const bool last = layout == SpatialLayout::channels_last;
    SpatialGeometry g = geometry;
    g.layout = layout;
    const auto backend = make_cpu_backend(layout);
    std::vector<T> xl = last ? transpose(x, in_size, true) : x, dyl = last ? transpose(dy, out_size, true) : dy;
    const TensorView xv{xl.data(), type, rows, channels * in_size}, dyv{dyl.data(), type, rows, channels * out_size};
    for (const bool keep_argmax : {false, true}) {
      const std::string what = where + (last ? " channels-last" : " channels-first") +
                               (keep_argmax ? " max_pooling_forward/backward" : " pooling_forward/backward");
      std::vector<T> y(dy.size(), store<T>(std::numeric_limits<float>::quiet_NaN())),
          dx(x.size(), store<T>(std::numeric_limits<float>::quiet_NaN()));
      std::vector<std::int32_t> argmax(dy.size(), -7);
      const TensorView yv{y.data(), type, rows, channels * out_size}, dxv{dx.data(), type, rows, channels * in_size};
      if (keep_argmax) {
        backend->max_pooling_forward(g, xv, yv, argmax.data());
        backend->max_pooling_backward(g, xv, dyv, argmax.data(), dxv);
      } else {
        backend->pooling_forward(PoolingKind::max, g, xv, yv);
        backend->pooling_backward(PoolingKind::max, g, xv, dyv, dxv);
      }
      EXPECT_EQ(bytes_of(last ? transpose(y, out_size, false) : y), bytes_of(y_reference)) << what << ": y";
      EXPECT_EQ(bytes_of(last ? transpose(dx, in_size, false) : dx), bytes_of(dx_reference)) << what << ": dx";
    }
  }
}

const SpatialGeometry geometries[] = {
    window(2, {8, 8, 0}, 2, 2, 0, 1),  window(2, {7, 9, 0}, 2, 2, 0, 1), window(3, {4, 6, 4}, 2, 2, 0, 1),
    window(3, {5, 5, 7}, 2, 2, 0, 1),  window(2, {9, 8, 0}, 3, 2, 1, 1), window(2, {8, 9, 0}, 3, 1, 1, 1),
    window(2, {10, 9, 0}, 3, 2, 2, 2), window(3, {5, 4, 5}, 3, 2, 1, 1), window(3, {6, 5, 7}, 2, 1, 1, 2),
    window(2, {4, 4, 0}, 2, 2, 2, 1)};  // the last: corner windows wholly in the padding

TEST(MaxPooling, TiesAndFirstMaximumInBothLayoutsBitForBit) {
  for (const SpatialGeometry& g : geometries) {
    const std::string where = test_support::describe(g);
    check<float>(g, false, where + " f32");
    check<bf16>(g, false, where + " bf16");
  }
}

TEST(MaxPooling, NansInfinitiesAndSignedZerosInBothLayoutsBitForBit) {
  for (const SpatialGeometry& g : geometries) {
    const std::string where = test_support::describe(g);
    check<float>(g, true, where + " f32");
    check<bf16>(g, true, where + " bf16");
    check<fp16>(g, true, where + " fp16");
    check<double>(g, true, where + " f64");
  }
}

}  // namespace
}  // namespace hpctrain
