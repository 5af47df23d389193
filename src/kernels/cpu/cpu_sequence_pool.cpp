// Pooling of a sequence into one vector on the CPU (an encoder's classification input): rows of (sequence, channels)
// values to rows of channels, by the mean over the positions or the first position, and the backward of each.
#include <algorithm>
#include <cstdint>

#include "cpu_sequence.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {
namespace {

void check_shapes(std::int64_t sequence, const TensorView& sequences, const TensorView& pooled, const char* what) {
  HPCTRAIN_ASSERT(sequence >= 1 && sequences.cols == sequence * pooled.cols && sequences.rows == pooled.rows &&
                      sequences.dtype == pooled.dtype,
                  what << ": " << sequences.rows << " x " << sequences.cols << " sequences of " << sequence
                       << " positions against " << pooled.rows << " x " << pooled.cols);
}

}  // namespace

void sequence_pool_forward(SequencePooling mode, std::int64_t sequence, const TensorView& x, const TensorView& y) {
  check_shapes(sequence, x, y, "sequence_pool_forward");
  const std::int64_t channels = y.cols;
  dispatch_dtype(y.dtype, [&]<class T>() {
    using Compute = compute_t<T>;  // f32, or f64 for f64 activations
    const T* in = static_cast<const T*>(x.data);
    T* out = static_cast<T*>(y.data);
    // Sums of a block of channels on the stack: nothing is allocated in the step.
    constexpr std::int64_t block = 64;
#pragma omp parallel for schedule(static) if (x.size() > 32768)
    for (std::int64_t r = 0; r < y.rows; ++r) {
      const T* row = in + r * x.cols;
      if (mode == SequencePooling::first) {
        for (std::int64_t c = 0; c < channels; ++c) out[r * channels + c] = row[c];
        continue;
      }
      for (std::int64_t first = 0; first < channels; first += block) {
        const std::int64_t width = std::min(block, channels - first);
        Compute sums[block] = {};
        for (std::int64_t t = 0; t < sequence; ++t)  // in position order: the CUDA kernel adds in the same order
#pragma omp simd
          for (std::int64_t c = 0; c < width; ++c) sums[c] += load(row[t * channels + first + c]);
        for (std::int64_t c = 0; c < width; ++c)
          out[r * channels + first + c] = store<T>(sums[c] / static_cast<Compute>(sequence));
      }
    }
  });
}

void sequence_pool_backward(SequencePooling mode, std::int64_t sequence, const TensorView& dy, const TensorView& dx) {
  check_shapes(sequence, dx, dy, "sequence_pool_backward");
  const std::int64_t channels = dy.cols;
  dispatch_dtype(dy.dtype, [&]<class T>() {
    using Compute = compute_t<T>;
    const T* gradient = static_cast<const T*>(dy.data);
    T* out = static_cast<T*>(dx.data);
#pragma omp parallel for schedule(static) if (dx.size() > 32768)
    for (std::int64_t r = 0; r < dx.rows; ++r) {
      T* row = out + r * dx.cols;
      const T* source = gradient + r * channels;
      if (mode == SequencePooling::first) {
        std::copy_n(source, channels, row);
        std::fill(row + channels, row + dx.cols, store<T>(Compute(0)));
        continue;
      }
      for (std::int64_t c = 0; c < channels; ++c) {
        const T share = store<T>(load(source[c]) / static_cast<Compute>(sequence));
        for (std::int64_t t = 0; t < sequence; ++t) row[t * channels + c] = share;
      }
    }
  });
}

}  // namespace hpctrain::cpu
