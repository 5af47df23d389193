// Max pooling that keeps each output's first maximum for its backward (Backend::max_pooling_forward/backward, what a
// training step calls): the backward then reads the argmax instead of recomputing every window, and with windows that
// tile the input (stride = kernel, no padding: the usual 2x2(x2) pooling) it writes each dx element once, with no
// scatter buffer. The results are bit for bit those of pooling_forward/pooling_backward (cpu_spatial.cpp): the same
// first-maximum and NaN rules, the same additions in the same order.
//
// Gradients are stored straight from the compute type: they are sums that start at 0, so never a signalling NaN, and
// the round trip through double of the plain loops changes nothing for them. (The forward keeps that round trip: it
// stores input values, whose signalling NaNs the plain loops quiet.)
//
// argmax has y's shape and layout (int32): the winning input position within the sample's plane, -1 for a window
// wholly in the padding. Threads own whole output rows (sample, depth, height) or planes, so no result depends on the
// thread count.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_common.hpp"
#include "cpu_spatial.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {
namespace {

// Output rows (sample, od, oh) of a batch: the unit of work of the channels-last loops (the position arithmetic is
// done once per row, not per output).
struct OutputRow {
  std::int64_t n, d, h;
};
OutputRow output_row(const Box& b, std::int64_t row) {
  return {row / (b.out[0] * b.out[1]), row / b.out[1] % b.out[0], row % b.out[1]};
}

void forward_channels_last(const SpatialGeometry& g, const TensorView& x, const TensorView& y, std::int32_t* argmax) {
  const Box b = box_of(g);
  const std::int64_t channels = g.in_channels, in_size = g.input_size();
  const std::int64_t rows = x.rows * b.out[0] * b.out[1];
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
#pragma omp parallel
    {
      std::vector<C> best_value(static_cast<std::size_t>(channels));
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < rows; ++row) {
        const OutputRow r = output_row(b, row);
        const T* in = x.as<T>() + r.n * channels * in_size;
        const std::int64_t first = row * b.out[2];  // the row's first output in the batch
        for (std::int64_t ow = 0; ow < b.out[2]; ++ow) {
          std::int32_t* index = argmax + (first + ow) * channels;
          window_argmax_channels_last(b, channels, in, r.d, r.h, ow, index, best_value.data());
          T* out = y.as<T>() + (first + ow) * channels;
          for (std::int64_t c = 0; c < channels; ++c)
            out[c] = index[c] >= 0 ? store_from_double<T>(static_cast<double>(best_value[static_cast<std::size_t>(c)]))
                                   : store_from_double<T>(-std::numeric_limits<double>::infinity());
        }
      }
    }
  });
}

// Every input position gets the gradient of at most one window: 0 + the gradient at each window's first maximum, +0
// elsewhere, as the accumulating loops compute it (-0 becomes +0).
void backward_disjoint_channels_last(const SpatialGeometry& g, const TensorView& dy, const std::int32_t* argmax,
                                     const TensorView& dx) {
  const Box b = box_of(g);
  const std::int64_t channels = g.in_channels, in_size = g.input_size();
  const std::int64_t rows = dx.rows * b.out[0] * b.out[1];
  dispatch_dtype(dx.dtype, [&]<class T>() {
    using C = compute_t<T>;
    // Zero the input rows the output row's windows cover (contiguous), then write each window's winners: cheaper
    // than a select per input element at every channel count bench/spatial_kernels times.
#pragma omp parallel for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const OutputRow r = output_row(b, row);
      T* out = dx.as<T>() + r.n * channels * in_size;
      const T* upstream = dy.as<T>() + row * b.out[2] * channels;
      const std::int32_t* index = argmax + row * b.out[2] * channels;
      for (std::int64_t kd = 0; kd < b.kernel[0]; ++kd)
        for (std::int64_t kh = 0; kh < b.kernel[1]; ++kh) {
          const std::int64_t first = ((r.d * b.kernel[0] + kd) * b.in[1] + r.h * b.kernel[1] + kh) * b.in[2];
          std::memset(out + first * channels, 0, static_cast<std::size_t>(b.in[2] * channels) * sizeof(T));
        }
      for (std::int64_t k = 0; k < b.out[2] * channels; ++k)
        out[index[k] * channels + k % channels] = store<T>(C(0) + load(upstream[k]));
    }
  });
}

// Overlapping windows: one thread per sample adds every output's gradient at its window's first maximum in output
// order (the order of pooling_backward), into dx itself when the storage is the compute type, else into a
// compute-type copy rounded once at the end.
void backward_scatter_channels_last(const SpatialGeometry& g, const TensorView& dy, const std::int32_t* argmax,
                                    const TensorView& dx) {
  const std::int64_t channels = g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(dx.dtype, [&]<class T>() {
    using C = compute_t<T>;
    constexpr bool in_place = std::is_same_v<T, C>;
#pragma omp parallel
    {
      std::vector<C> copy(in_place ? 0 : static_cast<std::size_t>(channels * in_size));
#pragma omp for schedule(static)
      for (std::int64_t n = 0; n < dx.rows; ++n) {
        C* sums = nullptr;
        if constexpr (in_place)
          sums = dx.as<T>() + n * channels * in_size;
        else
          sums = copy.data();
        std::fill_n(sums, channels * in_size, C(0));
        for (std::int64_t o = n * out_size; o < (n + 1) * out_size; ++o) {
          const T* upstream = dy.as<T>() + o * channels;
          const std::int32_t* index = argmax + o * channels;
          for (std::int64_t c = 0; c < channels; ++c)
            if (index[c] >= 0) sums[index[c] * channels + c] += load(upstream[c]);
        }
        if constexpr (!in_place) {
          T* out = dx.as<T>() + n * channels * in_size;
          for (std::int64_t i = 0; i < channels * in_size; ++i) out[i] = store<T>(sums[i]);
        }
      }
    }
  });
}

// Channels-first: one thread per (sample, channel) plane, its outputs in memory order.
void forward_channels_first(const SpatialGeometry& g, const TensorView& x, const TensorView& y, std::int32_t* argmax) {
  const Box b = box_of(g);
  const std::int64_t planes = x.rows * g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(x.dtype, [&]<class T>() {
#pragma omp parallel for schedule(static)
    for (std::int64_t plane = 0; plane < planes; ++plane) {
      const T* in = x.as<T>() + plane * in_size;
      T* out = y.as<T>() + plane * out_size;
      std::int32_t* index = argmax + plane * out_size;
      for_each_output(b, [&](std::int64_t o, std::int64_t od, std::int64_t oh, std::int64_t ow) {
        const std::int64_t best = window_argmax(b, in, od, oh, ow);
        index[o] = static_cast<std::int32_t>(best);
        out[o] = best >= 0 ? in[best] : store_from_double<T>(-std::numeric_limits<double>::infinity());
      });
    }
  });
}

// Channels-first backward: disjoint windows write 0 + the gradient at each first maximum into a zeroed plane;
// overlapping ones add in output order into a compute-type plane rounded once (as pooling_backward).
void backward_channels_first(const SpatialGeometry& g, const TensorView& dy, const std::int32_t* argmax,
                             const TensorView& dx) {
  const Box b = box_of(g);
  const bool disjoint = windows_tile_the_input(b);
  const std::int64_t planes = dx.rows * g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(dx.dtype, [&]<class T>() {
    using C = compute_t<T>;
#pragma omp parallel
    {
      std::vector<C> sums(disjoint ? 0 : static_cast<std::size_t>(in_size));
#pragma omp for schedule(static)
      for (std::int64_t plane = 0; plane < planes; ++plane) {
        const T* gradient = dy.as<T>() + plane * out_size;
        const std::int32_t* index = argmax + plane * out_size;
        T* out = dx.as<T>() + plane * in_size;
        if (disjoint) {
          std::memset(out, 0, static_cast<std::size_t>(in_size) * sizeof(T));  // all-zero bits: +0 in every dtype
          for (std::int64_t o = 0; o < out_size; ++o) out[index[o]] = store<T>(C(0) + load(gradient[o]));
          continue;
        }
        std::fill(sums.begin(), sums.end(), C(0));
        for (std::int64_t o = 0; o < out_size; ++o)
          if (index[o] >= 0) sums[static_cast<std::size_t>(index[o])] += load(gradient[o]);
        for (std::int64_t i = 0; i < in_size; ++i) out[i] = store<T>(sums[static_cast<std::size_t>(i)]);
      }
    }
  });
}

}  // namespace

void max_pooling_forward(const SpatialGeometry& g, const TensorView& x, const TensorView& y, std::int32_t* argmax) {
  if (argmax == nullptr) {
    pooling_forward(PoolingKind::max, g, x, y);
    return;
  }
  check_pooling(g, x, y, "max_pooling_forward");
  HPCTRAIN_ASSERT(g.input_size() < std::numeric_limits<std::int32_t>::max(),
                  "max_pooling_forward: " << g.input_size() << " positions per plane (int32 argmax)");
  if (g.layout == SpatialLayout::channels_last)
    forward_channels_last(g, x, y, argmax);
  else
    forward_channels_first(g, x, y, argmax);
}

void max_pooling_backward(const SpatialGeometry& g, const TensorView& x, const TensorView& dy,
                          const std::int32_t* argmax, const TensorView& dx) {
  if (argmax == nullptr) {
    pooling_backward(PoolingKind::max, g, x, dy, dx);
    return;
  }
  check_pooling(g, x, dy, "max_pooling_backward");
  HPCTRAIN_ASSERT(dx.dtype == x.dtype && dx.rows == x.rows && dx.cols == x.cols, "max_pooling_backward: dx shape");
  const Box b = box_of(g);
  if (g.layout == SpatialLayout::channels_first) {
    backward_channels_first(g, dy, argmax, dx);
  } else if (windows_tile_the_input(b)) {
    bool covered = true;  // input positions past the last whole window get no gradient: zero them first
    for (std::size_t a = 0; a < 3; ++a) covered = covered && b.out[a] * b.stride[a] == b.in[a];
    if (!covered) std::memset(dx.data, 0, dx.bytes());
    backward_disjoint_channels_last(g, dy, argmax, dx);
  } else {
    backward_scatter_channels_last(g, dy, argmax, dx);
  }
}

}  // namespace hpctrain::cpu
