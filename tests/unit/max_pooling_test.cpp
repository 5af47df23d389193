// Max pooling of the CPU backend, bit for bit against the per-element definition (kernels/spatial_taps.hpp: the first
// maximum of each window, a NaN counting as largest and the first NaN sticking), in both layouts, for the plain
// operations and for the argmax-keeping ones a training step calls (max_pooling_forward/backward), on inputs full of
// ties, NaNs, infinities and signed zeros, and on fine-grained random values. Channel counts and widths cover the
// vector loops of the windows that tile the input (whole vectors, partial ones, a scalar tail) in every dtype. NaNs of
// every kind (signalling, quiet, negative, with payloads) keep today's rule: channels-first outputs are the winning
// input itself; channels-last ones too in f32 and f64, the canonical NaN in bf16 and fp16 (store()), as the plain
// loops store them. The rule holds in every build (the sanitizer builds included: a round trip through double that
// the compiler may or may not fold would break it). Outputs and the argmax are poisoned before every call.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "hpctrain/core/half.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/spatial_taps.hpp"
#include "kernel_test_support.hpp"

namespace hpctrain {
namespace {

constexpr std::int64_t rows = 3;

// 5 channels by default: no whole vector of any width.
SpatialGeometry window(int dimensions, std::array<std::int64_t, 3> input, std::int64_t kernel, std::int64_t stride,
                       std::int64_t padding, std::int64_t dilation, std::int64_t channels = 5) {
  const auto same = [dimensions](std::int64_t value) {
    return std::array<std::int64_t, 3>{value, value, dimensions == 3 ? value : 0};
  };
  return test_support::make_geometry(dimensions, channels, channels, 1, input, same(kernel), same(stride),
                                     same(padding), same(dilation));
}

enum class Values { ties, specials, fine, nan_kinds };

// The storage bits of NaNs of every kind: signalling, quiet, negative, with payloads.
template <class T>
T nan_of_kind(std::uint32_t kind) {
  T value{};
  if constexpr (std::is_same_v<T, float>) {
    const std::uint32_t bits[] = {0x7f800001u, 0xffa00000u, 0x7fc00123u, 0xffc00000u};
    std::memcpy(&value, &bits[kind % 4], sizeof value);
  } else if constexpr (std::is_same_v<T, double>) {
    const std::uint64_t bits[] = {0x7ff0000000000001u, 0xfff4000000000000u, 0x7ff8000000000123u, 0xfff8000000000000u};
    std::memcpy(&value, &bits[kind % 4], sizeof value);
  } else {
    const bool brain = std::is_same_v<T, bf16>;
    const std::uint16_t bits[] = {
        static_cast<std::uint16_t>(brain ? 0x7f81u : 0x7c01u), static_cast<std::uint16_t>(brain ? 0xffa0u : 0xfd00u),
        static_cast<std::uint16_t>(brain ? 0x7fc3u : 0x7e03u), static_cast<std::uint16_t>(brain ? 0xffc0u : 0xfe00u)};
    value.bits = bits[kind % 4];
  }
  return value;
}

// Values on a coarse grid (ties in most windows) with NaNs, infinities and both zeros mixed in (specials, nan_kinds:
// NaNs of every kind), or fine-grained ones (few ties).
template <class T>
std::vector<T> awkward_values(std::size_t count, std::uint32_t seed, Values kind) {
  std::vector<T> out(count);
  std::uint32_t state = seed;
  for (auto& value : out) {
    state = state * 1664525u + 1013904223u;
    const std::uint32_t pick = state >> 24;
    float v = std::round((static_cast<float>(state >> 8 & 0xffff) / 65536.0f * 4.0f - 2.0f) * 2.0f) / 2.0f;
    if (kind == Values::fine) v = static_cast<float>(state >> 8) / 16777216.0f * 4.0f - 2.0f;
    if (kind == Values::nan_kinds && pick < 24) {
      value = nan_of_kind<T>(state >> 4);
      continue;
    }
    if (kind == Values::specials || kind == Values::nan_kinds) {
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

// The channels-last loops store a window's winner as the plain loops do: f32 and f64 as they are (a signalling NaN
// too), bf16 and fp16 through store() (their canonical NaN).
template <class T>
T stored_channels_last(T winner) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    return winner;
  else
    return store<T>(load(winner));
}

// (rows, C, S) <-> (rows, S, C).
template <class T>
std::vector<T> transpose(const std::vector<T>& in, std::int64_t channels, std::int64_t positions,
                         bool to_channels_last) {
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
void check(const SpatialGeometry& geometry, Values values, const std::string& where) {
  const std::int64_t in_size = geometry.input_size(), out_size = geometry.output_size();
  const std::int64_t channels = geometry.in_channels;
  const auto x = awkward_values<T>(static_cast<std::size_t>(rows * channels * in_size), 17, values);
  auto dy = awkward_values<T>(static_cast<std::size_t>(rows * channels * out_size), 23,
                              values == Values::fine ? Values::fine : Values::ties);
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
    std::vector<T> xl = last ? transpose(x, channels, in_size, true) : x,
                   dyl = last ? transpose(dy, channels, out_size, true) : dy;
    std::vector<T> y_expected = y_reference;
    if (last)
      for (T& value : y_expected) value = stored_channels_last(value);
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
      EXPECT_EQ(bytes_of(last ? transpose(y, channels, out_size, false) : y), bytes_of(y_expected)) << what << ": y";
      EXPECT_EQ(bytes_of(last ? transpose(dx, channels, in_size, false) : dx), bytes_of(dx_reference))
          << what << ": dx";
    }
  }
}

const SpatialGeometry geometries[] = {
    window(2, {8, 8, 0}, 2, 2, 0, 1),  window(2, {7, 9, 0}, 2, 2, 0, 1), window(3, {4, 6, 4}, 2, 2, 0, 1),
    window(3, {5, 5, 7}, 2, 2, 0, 1),  window(2, {9, 8, 0}, 3, 2, 1, 1), window(2, {8, 9, 0}, 3, 1, 1, 1),
    window(2, {10, 9, 0}, 3, 2, 2, 2), window(3, {5, 4, 5}, 3, 2, 1, 1), window(3, {6, 5, 7}, 2, 1, 1, 2),
    window(2, {4, 4, 0}, 2, 2, 2, 1)};  // the last: corner windows wholly in the padding

// Windows that tile the input (the fast loops), with channel counts of whole and partial vectors in every dtype, rows
// of whole and partial vectors, uncovered edges, and kernels of other sizes and shapes.
const SpatialGeometry tiling_geometries[] = {
    window(2, {16, 16, 0}, 2, 2, 0, 1, 8),
    window(2, {8, 8, 0}, 2, 2, 0, 1, 16),
    window(3, {4, 4, 6}, 2, 2, 0, 1, 16),
    window(3, {5, 3, 9}, 2, 2, 0, 1, 24),
    window(2, {6, 70, 0}, 2, 2, 0, 1, 3),
    window(2, {5, 67, 0}, 2, 2, 0, 1, 1),
    window(3, {3, 4, 66}, 2, 2, 0, 1, 2),
    window(2, {4, 36, 0}, 2, 2, 0, 1, 64),
    window(3, {4, 6, 21}, 2, 2, 0, 1, 4),
    window(2, {6, 18, 0}, 2, 2, 0, 1, 8),
    window(2, {9, 20, 0}, 3, 3, 0, 1, 8),
    window(3, {6, 7, 8}, 3, 3, 0, 1, 17),
    test_support::make_geometry(2, 8, 8, 1, {6, 12, 0}, {2, 3, 0}, {2, 3, 0}, {0, 0, 0}, {1, 1, 0}),
    test_support::make_geometry(3, 16, 16, 1, {3, 4, 34}, {3, 1, 2}, {3, 1, 2}, {0, 0, 0}, {1, 1, 1}),
    test_support::make_geometry(2, 8, 8, 1, {4, 8, 0}, {1, 1, 0}, {1, 1, 0}, {0, 0, 0}, {1, 1, 0})};

TEST(MaxPooling, TiesAndFirstMaximumInBothLayoutsBitForBit) {
  for (const SpatialGeometry& g : geometries) {
    const std::string where = test_support::describe(g);
    check<float>(g, Values::ties, where + " f32");
    check<bf16>(g, Values::ties, where + " bf16");
  }
}

TEST(MaxPooling, NansInfinitiesAndSignedZerosInBothLayoutsBitForBit) {
  for (const SpatialGeometry& g : geometries) {
    const std::string where = test_support::describe(g);
    check<float>(g, Values::specials, where + " f32");
    check<bf16>(g, Values::specials, where + " bf16");
    check<fp16>(g, Values::specials, where + " fp16");
    check<double>(g, Values::specials, where + " f64");
  }
}

template <class T>
void check_every_kind(const SpatialGeometry& g, const std::string& where) {
  for (const Values values : {Values::ties, Values::specials, Values::fine, Values::nan_kinds})
    check<T>(g, values, where + " values " + std::to_string(static_cast<int>(values)));
}

TEST(MaxPooling, TilingWindowsInEveryDtypeBitForBit) {
  for (const SpatialGeometry& g : tiling_geometries) {
    const std::string where = test_support::describe(g);
    check_every_kind<float>(g, where + " f32");
    check_every_kind<bf16>(g, where + " bf16");
    check_every_kind<fp16>(g, where + " fp16");
    check_every_kind<double>(g, where + " f64");
  }
}

TEST(MaxPooling, NansOfEveryKindInOverlappingAndPaddedWindows) {
  for (const SpatialGeometry& g : geometries) {
    const std::string where = test_support::describe(g);
    check<float>(g, Values::nan_kinds, where + " f32");
    check<bf16>(g, Values::nan_kinds, where + " bf16");
    check<fp16>(g, Values::nan_kinds, where + " fp16");
    check<double>(g, Values::nan_kinds, where + " f64");
  }
}

}  // namespace
}  // namespace hpctrain
