// Pooling and group normalisation of the CPU backend: OpenMP loops for every storage dtype, arithmetic in fp32 (fp64
// for f64). Each thread owns whole (sample, channel) planes or (sample, group) blocks, so results do not depend on the
// thread count. Pooling is memory-bound and a loop over the plain NCHW layout is as fast as a primitive that would
// need its own layout; max pooling recomputes each window's argmax in the backward pass instead of storing indices.
#include "cpu_spatial.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "cpu_common.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {
namespace {

void check_pooling(const SpatialGeometry& g, const TensorView& x, const TensorView& y, const char* what) {
  HPCTRAIN_ASSERT(g.in_channels == g.out_channels && x.dtype == y.dtype && x.rows == y.rows &&
                      x.cols == g.in_channels * g.input_size() && y.cols == g.out_channels * g.output_size(),
                  what << ": shapes/dtypes do not match the geometry");
}

}  // namespace

void pooling_forward(PoolingKind kind, const SpatialGeometry& g, const TensorView& x, const TensorView& y) {
  check_pooling(g, x, y, "pooling_forward");
  const Box b = box_of(g);
  const std::int64_t planes = x.rows * g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const C divisor = static_cast<C>(g.kernel_size());
#pragma omp parallel for schedule(static)
    for (std::int64_t plane = 0; plane < planes; ++plane) {
      const T* in = x.as<T>() + plane * in_size;
      T* out = y.as<T>() + plane * out_size;
      for_each_output(b, [&](std::int64_t o, std::int64_t od, std::int64_t oh, std::int64_t ow) {
        if (kind == PoolingKind::max) {
          const std::int64_t best = window_argmax(b, in, od, oh, ow);
          out[o] = best >= 0 ? in[best] : store_from_double<T>(-std::numeric_limits<double>::infinity());
        } else {
          C sum = 0;
          for_each_tap(b, od, oh, ow, [&](std::int64_t i, std::int64_t) { sum += load(in[i]); });
          out[o] = store_from_double<T>(static_cast<double>(sum / divisor));
        }
      });
    }
  });
}

void pooling_backward(PoolingKind kind, const SpatialGeometry& g, const TensorView& x, const TensorView& dy,
                      const TensorView& dx) {
  check_pooling(g, x, dy, "pooling_backward");
  HPCTRAIN_ASSERT(dx.dtype == x.dtype && dx.rows == x.rows && dx.cols == x.cols, "pooling_backward: dx shape");
  const Box b = box_of(g);
  const std::int64_t planes = x.rows * g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const C divisor = static_cast<C>(g.kernel_size());
#pragma omp parallel
    {
      std::vector<C> sums(static_cast<std::size_t>(in_size));  // one plane of dx, rounded once at the end
#pragma omp for schedule(static)
      for (std::int64_t plane = 0; plane < planes; ++plane) {
        const T* in = x.as<T>() + plane * in_size;
        const T* gradient = dy.as<T>() + plane * out_size;
        std::fill(sums.begin(), sums.end(), C(0));
        for_each_output(b, [&](std::int64_t o, std::int64_t od, std::int64_t oh, std::int64_t ow) {
          const C upstream = load(gradient[o]);
          if (kind == PoolingKind::max) {
            const std::int64_t best = window_argmax(b, in, od, oh, ow);
            if (best >= 0) sums[static_cast<std::size_t>(best)] += upstream;
          } else {
            for_each_tap(b, od, oh, ow, [&](std::int64_t i, std::int64_t) {
              sums[static_cast<std::size_t>(i)] += upstream / divisor;
            });
          }
        });
        T* out = dx.as<T>() + plane * in_size;
        for (std::int64_t i = 0; i < in_size; ++i)
          out[i] = store_from_double<T>(static_cast<double>(sums[static_cast<std::size_t>(i)]));
      }
    }
  });
}

void groupnorm_forward(std::int64_t channels, std::int64_t groups, const TensorView& x, const void* gamma,
                       const void* beta, float eps, const TensorView& y, void* mean, void* rstd) {
  HPCTRAIN_ASSERT(channels > 0 && groups > 0 && channels % groups == 0 && x.cols % channels == 0 &&
                      x.dtype == y.dtype && x.rows == y.rows && x.cols == y.cols,
                  "groupnorm_forward: " << channels << " channels in " << groups << " groups, rows of " << x.cols);
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  const std::int64_t block = group_channels * spatial;  // the channels of a group are contiguous in NCHW
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const C* scale = static_cast<const C*>(gamma);  // (channels)
    const C* shift = static_cast<const C*>(beta);   // (channels)
    C* block_mean = static_cast<C*>(mean);          // (rows, groups)
    C* block_rstd = static_cast<C*>(rstd);          // (rows, groups)
#pragma omp parallel for schedule(static) if (x.size() > 16384)
    for (std::int64_t index = 0; index < x.rows * groups; ++index) {
      const T* in = x.as<T>() + index * block;
      T* out = y.as<T>() + index * block;
      C sum = 0;
      for (std::int64_t i = 0; i < block; ++i) sum += load(in[i]);
      const C average = sum / static_cast<C>(block);
      C squares = 0;
      for (std::int64_t i = 0; i < block; ++i) {
        const C centred = load(in[i]) - average;
        squares += centred * centred;
      }
      const C inverse = C(1) / std::sqrt(squares / static_cast<C>(block) + static_cast<C>(eps));
      block_mean[index] = average;
      block_rstd[index] = inverse;
      const std::int64_t first_channel = index % groups * group_channels;
      for (std::int64_t c = 0; c < group_channels; ++c) {
        const C a = scale[first_channel + c] * inverse;
        const C b = shift[first_channel + c] - average * a;
        for (std::int64_t s = 0; s < spatial; ++s) {
          const std::int64_t i = c * spatial + s;
          out[i] = store_from_double<T>(static_cast<double>(load(in[i]) * a + b));
        }
      }
    }
  });
}

void groupnorm_backward(std::int64_t channels, std::int64_t groups, const TensorView& x, const TensorView& dy,
                        const void* gamma, const void* mean, const void* rstd, const TensorView& dx, void* dgamma,
                        void* dbeta, bool accumulate) {
  HPCTRAIN_ASSERT(channels > 0 && groups > 0 && channels % groups == 0 && x.cols % channels == 0 &&
                      x.dtype == dy.dtype && x.rows == dy.rows && x.cols == dy.cols && dx.data != dy.data,
                  "groupnorm_backward: shapes, or dx aliasing dy");
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  const std::int64_t block = group_channels * spatial;
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const T* in = x.as<T>();
    const T* gradient = dy.as<T>();
    const C* scale = static_cast<const C*>(gamma);
    const C* block_mean = static_cast<const C*>(mean);
    const C* block_rstd = static_cast<const C*>(rstd);
    // Parameter gradients: one thread per channel, rows added in order (deterministic).
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < channels; ++c) {
      C gamma_sum = 0, beta_sum = 0;
      for (std::int64_t row = 0; row < x.rows; ++row) {
        const std::int64_t index = row * groups + c / group_channels;
        const std::int64_t offset = row * x.cols + c * spatial;
        for (std::int64_t s = 0; s < spatial; ++s) {
          const C upstream = load(gradient[offset + s]);
          gamma_sum += upstream * (load(in[offset + s]) - block_mean[index]) * block_rstd[index];
          beta_sum += upstream;
        }
      }
      if (dgamma != nullptr) {
        C& target = static_cast<C*>(dgamma)[c];
        target = gamma_sum + (accumulate ? target : C(0));
      }
      if (dbeta != nullptr) {
        C& target = static_cast<C*>(dbeta)[c];
        target = beta_sum + (accumulate ? target : C(0));
      }
    }
    if (dx.data == nullptr) return;
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, per (row, group) block.
#pragma omp parallel for schedule(static) if (x.size() > 16384)
    for (std::int64_t index = 0; index < x.rows * groups; ++index) {
      const T* block_in = in + index * block;
      const T* block_gradient = gradient + index * block;
      T* out = dx.as<T>() + index * block;
      const std::int64_t first_channel = index % groups * group_channels;
      const C average = block_mean[index], inverse = block_rstd[index];
      C sum = 0, weighted = 0;
      for (std::int64_t i = 0; i < block; ++i) {
        const C g = load(block_gradient[i]) * scale[first_channel + i / spatial];
        sum += g;
        weighted += g * (load(block_in[i]) - average) * inverse;
      }
      const C mean_g = sum / static_cast<C>(block), mean_gx = weighted / static_cast<C>(block);
      for (std::int64_t i = 0; i < block; ++i) {
        const C g = load(block_gradient[i]) * scale[first_channel + i / spatial];
        const C normalised = (load(block_in[i]) - average) * inverse;
        out[i] = store_from_double<T>(static_cast<double>(inverse * (g - mean_g - normalised * mean_gx)));
      }
    }
  });
}

}  // namespace hpctrain::cpu
