// A conv feature map turned into a sequence on the CUDA backend (see cuda_to_sequence.hpp): one thread per output
// element for the forward and the input gradient (a gather: channels-last maps are copied position by position,
// channels-first ones transposed), and one thread per column for the parameter gradients, adding the rows in row order
// from zero in fp32, as the CPU backend does, so both give the same bits.
#include <cstdint>

#include "cuda_device.cuh"
#include "cuda_dispatch.hpp"
#include "cuda_to_sequence.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"

namespace hpctrain::cuda {
namespace {

// y (rows, sequence * C): position t < first is the class token, position t >= first is spatial element t - first of
// the map (x row: (C, S) channels-first or (S, C) channels-last); the position row added in fp32, one rounding.
template <class T>
__global__ void to_sequence_forward_kernel(const T* x, const float* class_token, const float* positions, T* y,
                                           std::int64_t rows, std::int64_t spatial, std::int64_t channels,
                                           std::int64_t first, bool channels_last) {
  const std::int64_t sequence_cols = (spatial + first) * channels;
  for (std::int64_t index = global_thread(); index < rows * sequence_cols; index += grid_threads()) {
    const std::int64_t row = index / sequence_cols, t = index % sequence_cols / channels, c = index % channels;
    const std::int64_t s = t - first;
    const T* map = x + row * spatial * channels;
    float value = s < 0 ? class_token[c] : load(map[channels_last ? s * channels + c : c * spatial + s]);
    if (positions != nullptr) value += positions[t * channels + c];
    y[index] = store<T>(value);
  }
}

// dx (rows, C * S) in the map's layout from the spatial positions of dy: a gather, one thread per dx element.
template <class T>
__global__ void to_sequence_input_gradient_kernel(const T* dy, T* dx, std::int64_t rows, std::int64_t spatial,
                                                  std::int64_t channels, std::int64_t first, bool channels_last) {
  const std::int64_t map_cols = spatial * channels, sequence_cols = map_cols + first * channels;
  for (std::int64_t index = global_thread(); index < rows * map_cols; index += grid_threads()) {
    const std::int64_t row = index / map_cols, within = index % map_cols;
    const std::int64_t s = channels_last ? within / channels : within % spatial;
    const std::int64_t c = channels_last ? within % channels : within / spatial;
    dx[index] = dy[row * sequence_cols + (s + first) * channels + c];
  }
}

// destination[j] (=, or += when accumulate) the sum over the rows of dy's column j, in row order from zero.
template <class T>
__global__ void column_sums_kernel(const T* dy, std::int64_t rows, std::int64_t cols, std::int64_t columns,
                                   float* destination, bool accumulate) {
  for (std::int64_t j = global_thread(); j < columns; j += grid_threads()) {
    float sum = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) sum += load(dy[r * cols + j]);
    destination[j] = accumulate ? destination[j] + sum : sum;
  }
}

}  // namespace

void to_sequence_forward(cudaStream_t stream, std::int64_t channels, SpatialLayout layout, const TensorView& x,
                         const float* class_token, const float* positions, const TensorView& y) {
  const std::int64_t first = class_token != nullptr ? 1 : 0;
  HPCTRAIN_ASSERT(channels >= 1 && x.cols % channels == 0 && y.cols == x.cols + first * channels && y.rows == x.rows &&
                      y.dtype == x.dtype && y.data != x.data,
                  "to_sequence_forward: " << x.rows << " x " << x.cols << " maps of " << channels
                                          << " channels against " << y.rows << " x " << y.cols << " sequences");
  if (y.size() == 0) return;
  dispatch_storage(y.dtype, "to_sequence_forward", [&]<class T>() {
    to_sequence_forward_kernel<T><<<grid_for(y.size()), block_threads, 0, stream>>>(
        static_cast<const T*>(x.data), class_token, positions, static_cast<T*>(y.data), y.rows, x.cols / channels,
        channels, first, layout == SpatialLayout::channels_last);
    HPCTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void to_sequence_backward(cudaStream_t stream, std::int64_t channels, SpatialLayout layout, const TensorView& dy,
                          const TensorView& dx, float* dclass_token, float* dpositions, bool accumulate) {
  const std::int64_t first = dclass_token != nullptr ? 1 : 0;
  HPCTRAIN_ASSERT(channels >= 1 && dy.cols % channels == 0 && dy.cols > first * channels,
                  "to_sequence_backward: rows of " << dy.cols << " for " << channels << " channels");
  require_device_storage(dy.dtype, "to_sequence_backward");
  if (dx.data != nullptr) {
    HPCTRAIN_ASSERT(
        dy.cols == dx.cols + first * channels && dy.rows == dx.rows && dy.dtype == dx.dtype && dy.data != dx.data,
        "to_sequence_backward: " << dx.rows << " x " << dx.cols << " maps against " << dy.rows << " x " << dy.cols
                                 << " sequences");
    if (dx.size() > 0)
      dispatch_storage(dx.dtype, "to_sequence_backward", [&]<class T>() {
        to_sequence_input_gradient_kernel<T><<<grid_for(dx.size()), block_threads, 0, stream>>>(
            static_cast<const T*>(dy.data), static_cast<T*>(dx.data), dx.rows, dx.cols / channels, channels, first,
            layout == SpatialLayout::channels_last);
        HPCTRAIN_CUDA_CHECK_LAUNCH();
      });
  }
  // Parameter gradients (written even for an empty batch: zero sums).
  dispatch_storage(dy.dtype, "to_sequence_backward", [&]<class T>() {
    const auto* gradient = static_cast<const T*>(dy.data);
    if (dclass_token != nullptr) {
      column_sums_kernel<T><<<grid_for(channels), block_threads, 0, stream>>>(gradient, dy.rows, dy.cols, channels,
                                                                              dclass_token, accumulate);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    }
    if (dpositions != nullptr) {
      column_sums_kernel<T><<<grid_for(dy.cols), block_threads, 0, stream>>>(gradient, dy.rows, dy.cols, dy.cols,
                                                                             dpositions, accumulate);
      HPCTRAIN_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace hpctrain::cuda
