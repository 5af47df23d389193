// Pooling, group normalisation and layout conversion of the CPU backend: OpenMP loops for every storage dtype,
// arithmetic in fp32 (fp64 for f64). Each thread owns whole (sample, channel) planes, output positions or (sample,
// group) blocks, so results do not depend on the thread count.
//
// Both activation layouts are supported. Pooling gives bit-identical results in both: the taps of a window and the
// outputs of a backward scatter are visited in the same order in either layout; group normalisation sums in the order
// each layout reads fastest, so its layouts agree to rounding. Channels-first loops
// walk one (sample, channel) plane at a time; channels-last loops walk one output position at a time with the channels
// innermost (contiguous, so they vectorise). Max pooling in a training step runs
// cpu_max_pooling.cpp's loops instead, which keep each output's argmax for the backward and give these loops' results.
#include "cpu_spatial.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_common.hpp"
#include "hpctrain/core/error.hpp"

namespace hpctrain::cpu {
namespace {

// Output position o of a box as (od, oh, ow).
struct Position {
  std::int64_t d, h, w;
};
Position position_of(const Box& b, std::int64_t o) {
  return {o / (b.out[2] * b.out[1]), o / b.out[2] % b.out[1], o % b.out[2]};
}

// Channels-last pooling of output position o of one sample (in: the sample) into C compute-type values: the max (-inf
// for a window wholly in the padding, as the channels-first loops) or the sum of the taps.
template <class T, class C>
void pool_position_channels_last(PoolingKind kind, const Box& b, std::int64_t channels, const T* in, std::int64_t o,
                                 C* result) {
  const Position p = position_of(b, o);
  const bool max_pooling = kind == PoolingKind::max;
  std::fill_n(result, channels, max_pooling ? -std::numeric_limits<C>::infinity() : C(0));
  for_each_tap(b, p.d, p.h, p.w, [&](std::int64_t i, std::int64_t) {
    const T* values = in + i * channels;
    if (max_pooling) {
      for (std::int64_t c = 0; c < channels; ++c) {
        const C value = load(values[c]);
        result[c] = replaces_best(result[c], value) ? value : result[c];
      }
    } else {
      for (std::int64_t c = 0; c < channels; ++c) result[c] += load(values[c]);
    }
  });
}

void pooling_forward_channels_last(PoolingKind kind, const SpatialGeometry& g, const TensorView& x,
                                   const TensorView& y) {
  const Box b = box_of(g);
  const std::int64_t channels = g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const C divisor = static_cast<C>(g.kernel_size());
#pragma omp parallel
    {
      std::vector<C> result(static_cast<std::size_t>(channels));
#pragma omp for schedule(static)
      for (std::int64_t index = 0; index < x.rows * out_size; ++index) {
        const std::int64_t n = index / out_size, o = index % out_size;
        pool_position_channels_last(kind, b, channels, x.as<T>() + n * channels * in_size, o, result.data());
        T* out = y.as<T>() + index * channels;
        for (std::int64_t c = 0; c < channels; ++c) {
          const C value = result[static_cast<std::size_t>(c)];
          // A maximum is one of the inputs: stored as it is (no round trip through double, which would quiet a
          // signalling f32 NaN or not depending on what the compiler folds), bf16/fp16 NaNs canonical (store()).
          out[c] =
              kind == PoolingKind::max ? store<T>(value) : store_from_double<T>(static_cast<double>(value / divisor));
        }
      }
    }
  });
}

void pooling_backward_disjoint_windows(PoolingKind kind, const SpatialGeometry& g, const TensorView& x,
                                       const TensorView& dy, const TensorView& dx) {
  const Box b = box_of(g);
  const std::int64_t channels = g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  bool covered = true;  // input positions past the last whole window get no gradient: zero them first
  for (std::size_t a = 0; a < 3; ++a) covered = covered && b.out[a] * b.stride[a] == b.in[a];
  if (!covered) std::memset(dx.data, 0, dx.bytes());
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const C divisor = static_cast<C>(g.kernel_size());
#pragma omp parallel
    {
      std::vector<std::int32_t> best_index(static_cast<std::size_t>(channels));
      std::vector<C> best_value(static_cast<std::size_t>(channels));
#pragma omp for schedule(static)
      for (std::int64_t index = 0; index < x.rows * out_size; ++index) {
        const std::int64_t n = index / out_size, o = index % out_size;
        const T* in = x.as<T>() + n * channels * in_size;
        T* out = dx.as<T>() + n * channels * in_size;
        const T* upstream = dy.as<T>() + index * channels;
        const Position p = position_of(b, o);
        if (kind == PoolingKind::max)
          window_argmax_channels_last(b, channels, in, p.d, p.h, p.w, best_index.data(), best_value.data());
        for_each_tap(b, p.d, p.h, p.w, [&](std::int64_t i, std::int64_t) {
          T* target = out + i * channels;
          const auto tap = static_cast<std::int32_t>(i);
          for (std::int64_t c = 0; c < channels; ++c) {
            const C gradient = kind == PoolingKind::max
                                   ? (best_index[static_cast<std::size_t>(c)] == tap ? load(upstream[c]) : C(0))
                                   : load(upstream[c]) / divisor;
            target[c] = store_from_double<T>(static_cast<double>(C(0) + gradient));
          }
        });
      }
    }
  });
}

// One thread per sample scatters every output's gradient in output order (the order of the channels-first loops), into
// dx itself when the storage is the compute type, else into a compute-type copy rounded once at the end.
void pooling_backward_channels_last(PoolingKind kind, const SpatialGeometry& g, const TensorView& x,
                                    const TensorView& dy, const TensorView& dx) {
  const Box b = box_of(g);
  if (windows_tile_the_input(b)) {
    pooling_backward_disjoint_windows(kind, g, x, dy, dx);
    return;
  }
  const std::int64_t channels = g.in_channels, in_size = g.input_size(), out_size = g.output_size();
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    constexpr bool in_place = std::is_same_v<T, C>;
    const C divisor = static_cast<C>(g.kernel_size());
    HPCTRAIN_ASSERT(in_size < std::numeric_limits<std::int32_t>::max(),
                    "pooling_backward: " << in_size << " positions");
#pragma omp parallel
    {
      std::vector<std::int32_t> best_index(static_cast<std::size_t>(channels));
      std::vector<C> best_value(static_cast<std::size_t>(channels));
      std::vector<C> copy(in_place ? 0 : static_cast<std::size_t>(channels * in_size));
#pragma omp for schedule(static)
      for (std::int64_t n = 0; n < x.rows; ++n) {
        const T* in = x.as<T>() + n * channels * in_size;
        C* sums = nullptr;
        if constexpr (in_place)
          sums = dx.as<T>() + n * channels * in_size;
        else
          sums = copy.data();
        std::fill_n(sums, channels * in_size, C(0));
        for (std::int64_t o = 0; o < out_size; ++o) {
          const T* upstream = dy.as<T>() + (n * out_size + o) * channels;
          if (kind == PoolingKind::max) {
            const Position p = position_of(b, o);
            window_argmax_channels_last(b, channels, in, p.d, p.h, p.w, best_index.data(), best_value.data());
            for (std::int64_t c = 0; c < channels; ++c)
              if (best_index[static_cast<std::size_t>(c)] >= 0)
                sums[best_index[static_cast<std::size_t>(c)] * channels + c] += load(upstream[c]);
          } else {
            const Position p = position_of(b, o);
            for_each_tap(b, p.d, p.h, p.w, [&](std::int64_t i, std::int64_t) {
              for (std::int64_t c = 0; c < channels; ++c) sums[i * channels + c] += load(upstream[c]) / divisor;
            });
          }
        }
        if constexpr (!in_place) {
          T* out = dx.as<T>() + n * channels * in_size;
          for (std::int64_t i = 0; i < channels * in_size; ++i)
            out[i] = store_from_double<T>(static_cast<double>(sums[i]));
        }
      }
    }
  });
}

}  // namespace

void pooling_forward(PoolingKind kind, const SpatialGeometry& g, const TensorView& x, const TensorView& y) {
  check_pooling(g, x, y, "pooling_forward");
  if (g.layout == SpatialLayout::channels_last) {
    pooling_forward_channels_last(kind, g, x, y);
    return;
  }
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
  if (g.layout == SpatialLayout::channels_last) {
    pooling_backward_channels_last(kind, g, x, dy, dx);
    return;
  }
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

namespace {

// Runs body.template operator()<W>(first channel) over the channels in blocks of W = two vector registers' worth, then
// one, then single channels. With W fixed at compile time a block's running sums stay in registers across the
// positions, where a loop over all the channels keeps them in memory (a store-to-load chain per position). Every
// channel still sums its positions in order, and each product-and-add is one multiply_add as the compiler contracts
// the plain loop (which an unrolled block may leave unfused), so the results are that loop's, bit for bit.
template <class C, class Body>
void for_channel_blocks(std::int64_t channels, const Body& body) {
  constexpr int vector = static_cast<int>(vector_register_bytes / sizeof(C));
  std::int64_t c = 0;
  for (; c + 2 * vector <= channels; c += 2 * vector) body.template operator()<2 * vector>(c);
  for (; c + vector <= channels; c += vector) body.template operator()<vector>(c);
  for (; c < channels; ++c) body.template operator()<1>(c);
}

// Channels-last group normalisation: one thread per sample (row), the channels innermost (contiguous, so the loops
// vectorise). Statistics are summed per channel over the positions first, then per group over its channels; parameter
// gradients are summed per (row, channel) into scratch and then over the rows in order, so no result depends on the
// thread count. (The channels-first loops sum in another order: the layouts agree to rounding, not bit for bit.)
template <class T, class C>
void groupnorm_forward_channels_last(std::int64_t channels, std::int64_t groups, const TensorView& x, const C* scale,
                                     const C* shift, float eps, const TensorView& y, C* block_mean, C* block_rstd) {
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  const auto count = static_cast<C>(group_channels * spatial);
#pragma omp parallel
  {
    std::vector<C> per_channel(static_cast<std::size_t>(channels)), a(per_channel.size()), b(per_channel.size());
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < x.rows; ++row) {
      const T* in = x.as<T>() + row * x.cols;
      T* out = y.as<T>() + row * x.cols;
      C* mean = block_mean + row * groups;
      C* rstd = block_rstd + row * groups;
      for_channel_blocks<C>(channels, [&]<int W>(std::int64_t first) {  // per channel: the sum of x
        C sums[W] = {};
        for (std::int64_t s = 0; s < spatial; ++s)
          for (int j = 0; j < W; ++j) sums[j] += load(in[s * channels + first + j]);
        std::copy(sums, sums + W, per_channel.begin() + first);
      });
      for (std::int64_t group = 0; group < groups; ++group) {
        C sum = 0;
        for (std::int64_t c = group * group_channels; c < (group + 1) * group_channels; ++c)
          sum += per_channel[static_cast<std::size_t>(c)];
        mean[group] = sum / count;
      }
      for (std::int64_t c = 0; c < channels; ++c) a[static_cast<std::size_t>(c)] = mean[c / group_channels];  // means
      for_channel_blocks<C>(channels, [&]<int W>(std::int64_t first) {  // per channel: the sum of (x - mean)^2
        C means[W], sums[W] = {};
        std::copy(a.begin() + first, a.begin() + first + W, means);
        for (std::int64_t s = 0; s < spatial; ++s)
          for (int j = 0; j < W; ++j) {
            const C centred = load(in[s * channels + first + j]) - means[j];
            sums[j] = multiply_add(centred, centred, sums[j]);
          }
        std::copy(sums, sums + W, per_channel.begin() + first);
      });
      for (std::int64_t group = 0; group < groups; ++group) {
        C squares = 0;
        for (std::int64_t c = group * group_channels; c < (group + 1) * group_channels; ++c)
          squares += per_channel[static_cast<std::size_t>(c)];
        rstd[group] = C(1) / std::sqrt(squares / count + static_cast<C>(eps));
      }
      for (std::int64_t c = 0; c < channels; ++c) {  // y = x * a + b per channel
        const auto i = static_cast<std::size_t>(c);
        const C scaled = scale[c] * rstd[c / group_channels];
        b[i] = shift[c] - mean[c / group_channels] * scaled;
        a[i] = scaled;
      }
      for (std::int64_t s = 0; s < spatial; ++s)
        for (std::int64_t c = 0; c < channels; ++c)
          out[s * channels + c] = store_from_double<T>(static_cast<double>(
              load(in[s * channels + c]) * a[static_cast<std::size_t>(c)] + b[static_cast<std::size_t>(c)]));
    }
  }
}

template <class T, class C>
void groupnorm_backward_channels_last(std::int64_t channels, std::int64_t groups, const TensorView& x,
                                      const TensorView& dy, const C* scale, const C* block_mean, const C* block_rstd,
                                      const TensorView& dx, C* dgamma, C* dbeta, bool accumulate) {
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  const auto count = static_cast<C>(group_channels * spatial);
  // Per (row, channel): sum of dy * xhat (dgamma's) and of dy (dbeta's), summed over the rows afterwards.
  std::vector<C> row_dgamma(static_cast<std::size_t>(x.rows * channels)), row_dbeta(row_dgamma.size());
#pragma omp parallel
  {
    std::vector<C> mean(static_cast<std::size_t>(channels)), rstd(mean.size()), mean_g(mean.size()),
        mean_gx(mean.size());
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < x.rows; ++row) {
      const T* in = x.as<T>() + row * x.cols;
      const T* gradient = dy.as<T>() + row * x.cols;
      C* gamma_sums = row_dgamma.data() + row * channels;
      C* beta_sums = row_dbeta.data() + row * channels;
      for (std::int64_t c = 0; c < channels; ++c) {
        mean[static_cast<std::size_t>(c)] = block_mean[row * groups + c / group_channels];
        rstd[static_cast<std::size_t>(c)] = block_rstd[row * groups + c / group_channels];
      }
      // Per channel: the sums of dy * xhat and of dy (the parameters' gradients), and with g = dy * gamma, of g and of
      // g * xhat (mean_g, mean_gx hold them first).
      for_channel_blocks<C>(channels, [&]<int W>(std::int64_t first) {
        C means[W], rstds[W], scales[W], gamma[W] = {}, beta[W] = {}, g[W] = {}, gx[W] = {};
        for (int j = 0; j < W; ++j) {
          means[j] = mean[static_cast<std::size_t>(first + j)];
          rstds[j] = rstd[static_cast<std::size_t>(first + j)];
          scales[j] = scale[first + j];
        }
        for (std::int64_t s = 0; s < spatial; ++s)
          for (int j = 0; j < W; ++j) {
            const C upstream = load(gradient[s * channels + first + j]);
            const C normalised = (load(in[s * channels + first + j]) - means[j]) * rstds[j];
            gamma[j] = multiply_add(upstream, normalised, gamma[j]);
            beta[j] += upstream;
            g[j] = multiply_add(upstream, scales[j], g[j]);
            gx[j] = multiply_add(upstream * scales[j], normalised, gx[j]);
          }
        std::copy(gamma, gamma + W, gamma_sums + first);
        std::copy(beta, beta + W, beta_sums + first);
        std::copy(g, g + W, mean_g.begin() + first);
        std::copy(gx, gx + W, mean_gx.begin() + first);
      });
      if (dx.data == nullptr) continue;
      for (std::int64_t group = 0; group < groups; ++group) {  // per group, then spread back over its channels
        C sum = 0, weighted = 0;
        for (std::int64_t c = group * group_channels; c < (group + 1) * group_channels; ++c) {
          sum += mean_g[static_cast<std::size_t>(c)];
          weighted += mean_gx[static_cast<std::size_t>(c)];
        }
        for (std::int64_t c = group * group_channels; c < (group + 1) * group_channels; ++c) {
          mean_g[static_cast<std::size_t>(c)] = sum / count;
          mean_gx[static_cast<std::size_t>(c)] = weighted / count;
        }
      }
      T* out = dx.as<T>() + row * x.cols;
      for (std::int64_t s = 0; s < spatial; ++s)
        for (std::int64_t c = 0; c < channels; ++c) {
          const auto i = static_cast<std::size_t>(c);
          const C g = load(gradient[s * channels + c]) * scale[c];
          const C normalised = (load(in[s * channels + c]) - mean[i]) * rstd[i];
          out[s * channels + c] =
              store_from_double<T>(static_cast<double>(rstd[i] * (g - mean_g[i] - normalised * mean_gx[i])));
        }
    }
  }
  for (std::int64_t c = 0; c < channels; ++c) {
    C gamma_sum = 0, beta_sum = 0;
    for (std::int64_t row = 0; row < x.rows; ++row) {
      gamma_sum += row_dgamma[static_cast<std::size_t>(row * channels + c)];
      beta_sum += row_dbeta[static_cast<std::size_t>(row * channels + c)];
    }
    if (dgamma != nullptr) dgamma[c] = gamma_sum + (accumulate ? dgamma[c] : C(0));
    if (dbeta != nullptr) dbeta[c] = beta_sum + (accumulate ? dbeta[c] : C(0));
  }
}

}  // namespace

void groupnorm_forward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                       const void* gamma, const void* beta, float eps, const TensorView& y, void* mean, void* rstd) {
  HPCTRAIN_ASSERT(channels > 0 && groups > 0 && channels % groups == 0 && x.cols % channels == 0 &&
                      x.dtype == y.dtype && x.rows == y.rows && x.cols == y.cols,
                  "groupnorm_forward: " << channels << " channels in " << groups << " groups, rows of " << x.cols);
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  const std::int64_t block = group_channels * spatial;
  const auto at = [spatial](std::int64_t channel, std::int64_t s) { return channel * spatial + s; };
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const C* scale = static_cast<const C*>(gamma);  // (channels)
    const C* shift = static_cast<const C*>(beta);   // (channels)
    C* block_mean = static_cast<C*>(mean);          // (rows, groups)
    C* block_rstd = static_cast<C*>(rstd);          // (rows, groups)
    if (layout == SpatialLayout::channels_last) {
      groupnorm_forward_channels_last<T>(channels, groups, x, scale, shift, eps, y, block_mean, block_rstd);
      return;
    }
#pragma omp parallel for schedule(static) if (x.size() > 16384)
    for (std::int64_t index = 0; index < x.rows * groups; ++index) {
      const T* in = x.as<T>() + index / groups * x.cols;
      T* out = y.as<T>() + index / groups * x.cols;
      const std::int64_t first_channel = index % groups * group_channels;
      C sum = 0;
      for (std::int64_t c = first_channel; c < first_channel + group_channels; ++c)
        for (std::int64_t s = 0; s < spatial; ++s) sum += load(in[at(c, s)]);
      const C average = sum / static_cast<C>(block);
      C squares = 0;
      for (std::int64_t c = first_channel; c < first_channel + group_channels; ++c)
        for (std::int64_t s = 0; s < spatial; ++s) {
          const C centred = load(in[at(c, s)]) - average;
          squares += centred * centred;
        }
      const C inverse = C(1) / std::sqrt(squares / static_cast<C>(block) + static_cast<C>(eps));
      block_mean[index] = average;
      block_rstd[index] = inverse;
      for (std::int64_t c = first_channel; c < first_channel + group_channels; ++c) {
        const C a = scale[c] * inverse;
        const C b = shift[c] - average * a;
        for (std::int64_t s = 0; s < spatial; ++s)
          out[at(c, s)] = store_from_double<T>(static_cast<double>(load(in[at(c, s)]) * a + b));
      }
    }
  });
}

void groupnorm_backward(std::int64_t channels, std::int64_t groups, SpatialLayout layout, const TensorView& x,
                        const TensorView& dy, const void* gamma, const void* mean, const void* rstd,
                        const TensorView& dx, void* dgamma, void* dbeta, bool accumulate) {
  HPCTRAIN_ASSERT(channels > 0 && groups > 0 && channels % groups == 0 && x.cols % channels == 0 &&
                      x.dtype == dy.dtype && x.rows == dy.rows && x.cols == dy.cols && dx.data != dy.data,
                  "groupnorm_backward: shapes, or dx aliasing dy");
  const std::int64_t spatial = x.cols / channels, group_channels = channels / groups;
  const std::int64_t block = group_channels * spatial;
  const auto at = [spatial](std::int64_t channel, std::int64_t s) { return channel * spatial + s; };
  dispatch_dtype(x.dtype, [&]<class T>() {
    using C = compute_t<T>;
    const T* in = x.as<T>();
    const T* gradient = dy.as<T>();
    const C* scale = static_cast<const C*>(gamma);
    const C* block_mean = static_cast<const C*>(mean);
    const C* block_rstd = static_cast<const C*>(rstd);
    if (layout == SpatialLayout::channels_last) {
      groupnorm_backward_channels_last<T>(channels, groups, x, dy, scale, block_mean, block_rstd, dx,
                                          static_cast<C*>(dgamma), static_cast<C*>(dbeta), accumulate);
      return;
    }
    // Parameter gradients: one thread per channel, rows added in order (deterministic).
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < channels; ++c) {
      C gamma_sum = 0, beta_sum = 0;
      for (std::int64_t row = 0; row < x.rows; ++row) {
        const std::int64_t index = row * groups + c / group_channels;
        const T* row_in = in + row * x.cols;
        const T* row_gradient = gradient + row * x.cols;
        for (std::int64_t s = 0; s < spatial; ++s) {
          const C upstream = load(row_gradient[at(c, s)]);
          gamma_sum += upstream * (load(row_in[at(c, s)]) - block_mean[index]) * block_rstd[index];
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
      const T* row_in = in + index / groups * x.cols;
      const T* row_gradient = gradient + index / groups * x.cols;
      T* out = dx.as<T>() + index / groups * x.cols;
      const std::int64_t first_channel = index % groups * group_channels;
      const C average = block_mean[index], inverse = block_rstd[index];
      C sum = 0, weighted = 0;
      for (std::int64_t c = first_channel; c < first_channel + group_channels; ++c)
        for (std::int64_t s = 0; s < spatial; ++s) {
          const C g = load(row_gradient[at(c, s)]) * scale[c];
          sum += g;
          weighted += g * (load(row_in[at(c, s)]) - average) * inverse;
        }
      const C mean_g = sum / static_cast<C>(block), mean_gx = weighted / static_cast<C>(block);
      for (std::int64_t c = first_channel; c < first_channel + group_channels; ++c)
        for (std::int64_t s = 0; s < spatial; ++s) {
          const C g = load(row_gradient[at(c, s)]) * scale[c];
          const C normalised = (load(row_in[at(c, s)]) - average) * inverse;
          out[at(c, s)] = store_from_double<T>(static_cast<double>(inverse * (g - mean_g - normalised * mean_gx)));
        }
    }
  });
}

// A transpose of every row between (C, S) and (S, C): pure data movement, so by element size. Rows and blocks of
// positions are spread over the threads; a block's C source lines stay in cache while its positions are written.
void convert_layout(std::int64_t channels, SpatialLayout from, const TensorView& x, const TensorView& y) {
  HPCTRAIN_ASSERT(channels > 0 && x.cols % channels == 0 && x.dtype == y.dtype && x.rows == y.rows &&
                      x.cols == y.cols && x.data != y.data,
                  "convert_spatial_layout: " << channels << " channels, rows of " << x.cols << " and " << y.cols);
  const std::int64_t spatial = x.cols / channels;
  const bool to_last = from == SpatialLayout::channels_first;
  constexpr std::int64_t positions_per_block = 64;
  const std::int64_t blocks = (spatial + positions_per_block - 1) / positions_per_block;
  const auto transpose = [&]<class E>() {
    const E* source = static_cast<const E*>(x.data);
    E* target = static_cast<E*>(y.data);
#pragma omp parallel for collapse(2) schedule(static) if (x.size() > 16384)
    for (std::int64_t row = 0; row < x.rows; ++row)
      for (std::int64_t block = 0; block < blocks; ++block) {
        const E* in = source + row * x.cols;
        E* out = target + row * x.cols;
        const std::int64_t end = std::min(spatial, (block + 1) * positions_per_block);
        for (std::int64_t s = block * positions_per_block; s < end; ++s)
          for (std::int64_t c = 0; c < channels; ++c) {
            if (to_last)
              out[s * channels + c] = in[c * spatial + s];
            else
              out[c * spatial + s] = in[s * channels + c];
          }
      }
  };
  switch (dtype_size(x.dtype)) {
    case 2:
      transpose.operator()<std::uint16_t>();
      break;
    case 4:
      transpose.operator()<std::uint32_t>();
      break;
    case 8:
      transpose.operator()<std::uint64_t>();
      break;
    default:
      HPCTRAIN_ASSERT(false, "convert_spatial_layout: element size " << dtype_size(x.dtype));
  }
}

}  // namespace hpctrain::cpu
