// A conv feature map turned into a sequence on the CPU (a vision transformer's patch tokens): rows of (C, S) or (S, C)
// values to rows of (S (+1), C) positions, with a learned class token and position table; and the backward, whose
// parameter gradients are column sums over the rows taken in row order (the CUDA kernel adds in the same order).
#include <algorithm>
#include <cstdint>

#include "cpu_sequence.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {
namespace {

// The spatial positions S of x, checked against the sequence rows of y.
std::int64_t spatial_positions(std::int64_t channels, const TensorView& map, const TensorView& sequence,
                               bool class_token, const char* what) {
  HPCTRAIN_ASSERT(
      channels >= 1 && map.cols % channels == 0 && sequence.cols == map.cols + (class_token ? channels : 0) &&
          sequence.rows == map.rows && sequence.dtype == map.dtype && sequence.data != map.data,
      what << ": " << map.rows << " x " << map.cols << " maps of " << channels << " channels against " << sequence.rows
           << " x " << sequence.cols << " sequences" << (class_token ? " with a class token" : ""));
  return map.cols / channels;
}

}  // namespace

void to_sequence_forward(std::int64_t channels, SpatialLayout layout, const TensorView& x, const void* class_token,
                         const void* positions, const TensorView& y) {
  const std::int64_t spatial = spatial_positions(channels, x, y, class_token != nullptr, "to_sequence_forward");
  const std::int64_t first = class_token != nullptr ? 1 : 0;  // the first spatial position's index
  const std::int64_t sequence = spatial + first;
  const bool channels_last = layout == SpatialLayout::channels_last;
  dispatch_dtype(y.dtype, [&]<class T>() {
    using Master = compute_t<T>;  // f32, or f64 for f64 activations
    const T* in = static_cast<const T*>(x.data);
    const auto* token = static_cast<const Master*>(class_token);  // (C) or null
    const auto* added = static_cast<const Master*>(positions);    // (sequence, C) or null
    T* out = static_cast<T*>(y.data);
#pragma omp parallel for collapse(2) schedule(static) if (y.size() > 16384)
    for (std::int64_t r = 0; r < y.rows; ++r)
      for (std::int64_t t = 0; t < sequence; ++t) {
        const T* map = in + r * x.cols;
        T* position = out + r * y.cols + t * channels;
        const Master* shift = added != nullptr ? added + t * channels : nullptr;
        const std::int64_t s = t - first;
        for (std::int64_t c = 0; c < channels; ++c) {
          Master value =
              s < 0 ? token[c] : static_cast<Master>(load(map[channels_last ? s * channels + c : c * spatial + s]));
          if (shift != nullptr) value += shift[c];
          position[c] = store<T>(value);
        }
      }
  });
}

void to_sequence_backward(std::int64_t channels, SpatialLayout layout, const TensorView& dy, const TensorView& dx,
                          void* dclass_token, void* dpositions, bool accumulate) {
  const bool class_token = dclass_token != nullptr;
  const std::int64_t first = class_token ? 1 : 0;
  const bool channels_last = layout == SpatialLayout::channels_last;
  HPCTRAIN_ASSERT(channels >= 1 && dy.cols % channels == 0 && dy.cols > (class_token ? channels : 0),
                  "to_sequence_backward: rows of " << dy.cols << " for " << channels << " channels");
  dispatch_dtype(dy.dtype, [&]<class T>() {
    using Master = compute_t<T>;
    const T* gradient = static_cast<const T*>(dy.data);  // (rows, sequence * C)
    if (dx.data != nullptr) {
      const std::int64_t spatial = spatial_positions(channels, dx, dy, class_token, "to_sequence_backward");
      T* out = static_cast<T*>(dx.data);
#pragma omp parallel for collapse(2) schedule(static) if (dx.size() > 16384)
      for (std::int64_t r = 0; r < dx.rows; ++r)
        for (std::int64_t s = 0; s < spatial; ++s) {
          const T* source = gradient + r * dy.cols + (s + first) * channels;
          T* map = out + r * dx.cols;
          for (std::int64_t c = 0; c < channels; ++c)
            map[channels_last ? s * channels + c : c * spatial + s] = source[c];
        }
    }
    // Column j of dy summed over the rows in row order from zero, then written or added.
    const auto column_sums = [&](Master* destination, std::int64_t columns) {
#pragma omp parallel for schedule(static) if (dy.rows * columns > 16384)
      for (std::int64_t j = 0; j < columns; ++j) {
        Master sum = 0;
        for (std::int64_t r = 0; r < dy.rows; ++r) sum += static_cast<Master>(load(gradient[r * dy.cols + j]));
        destination[j] = accumulate ? destination[j] + sum : sum;
      }
    };
    if (class_token) column_sums(static_cast<Master*>(dclass_token), channels);
    if (dpositions != nullptr) column_sums(static_cast<Master*>(dpositions), dy.cols);
  });
}

}  // namespace hpctrain::cpu
