// An f64 reference of fused attention (Backend::attention_forward/backward's contract: packed qkv, lse in natural-log
// units) that forms the whole T x T probability matrix of each (sequence, head), and inputs exact in bf16 and fp16
// alike. Used by tests/gpu/cuda_tensor_core_attention_test.cpp and tests/unit/tensor_core_attention_emulation_test.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::test_support {

// ---- f64 reference: the whole probability matrix of each (sequence, head) ----
struct ReferenceAttention {
  std::vector<double> out, lse, dqkv;
};

inline ReferenceAttention reference_attention(const AttentionGeometry& g, const std::vector<double>& qkv,
                                              const std::vector<double>& dout) {
  const std::int64_t n = g.sequence, dim = g.head_dim, width = g.width();
  const auto scale = static_cast<double>(g.scale);
  ReferenceAttention r{std::vector<double>(static_cast<std::size_t>(g.batch * n * width)),
                       std::vector<double>(static_cast<std::size_t>(g.batch * g.heads * n)),
                       std::vector<double>(qkv.size(), 0.0)};
  const auto at = [](std::int64_t row, std::int64_t col, std::int64_t cols) {
    return static_cast<std::size_t>(row * cols + col);
  };
  std::vector<double> q(static_cast<std::size_t>(n * dim)), k(q.size()), v(q.size()), dO(q.size()), o(q.size());
  std::vector<double> dq(q.size()), dk(q.size()), dv(q.size());
  std::vector<double> p(static_cast<std::size_t>(n * n)), ds(p.size());
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t h = 0; h < g.heads; ++h) {
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t d = 0; d < dim; ++d) {
          const std::size_t row = at(b * n + t, h * dim + d, 3 * width);
          q[at(t, d, dim)] = qkv[row];
          k[at(t, d, dim)] = qkv[row + static_cast<std::size_t>(width)];
          v[at(t, d, dim)] = qkv[row + static_cast<std::size_t>(2 * width)];
          dO[at(t, d, dim)] = dout[at(b * n + t, h * dim + d, width)];
        }
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t seen = g.causal ? i + 1 : n;
        double maximum = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < dim && j < seen; ++d) dot += q[at(i, d, dim)] * k[at(j, d, dim)];
          p[at(i, j, n)] = dot * scale;
          if (j < seen) maximum = std::max(maximum, dot * scale);
        }
        double sum = 0.0;
        for (std::int64_t j = 0; j < seen; ++j) sum += std::exp(p[at(i, j, n)] - maximum);
        const double lse = maximum + std::log(sum);
        r.lse[static_cast<std::size_t>((b * g.heads + h) * n + i)] = lse;
        for (std::int64_t j = 0; j < n; ++j) p[at(i, j, n)] = j < seen ? std::exp(p[at(i, j, n)] - lse) : 0.0;
        double delta = 0.0;
        for (std::int64_t d = 0; d < dim; ++d) {
          double sum_v = 0.0;
          for (std::int64_t j = 0; j < seen; ++j) sum_v += p[at(i, j, n)] * v[at(j, d, dim)];
          o[at(i, d, dim)] = sum_v;
          delta += dO[at(i, d, dim)] * sum_v;
        }
        for (std::int64_t j = 0; j < n; ++j) {
          double dp = 0.0;
          for (std::int64_t d = 0; d < dim && j < seen; ++d) dp += dO[at(i, d, dim)] * v[at(j, d, dim)];
          ds[at(i, j, n)] = p[at(i, j, n)] * (dp - delta);
        }
      }
      std::fill(dq.begin(), dq.end(), 0.0);
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < (g.causal ? i + 1 : n); ++j) {
          const double s = ds[at(i, j, n)], pij = p[at(i, j, n)];
          for (std::int64_t d = 0; d < dim; ++d) {
            dq[at(i, d, dim)] += scale * s * k[at(j, d, dim)];
            dk[at(j, d, dim)] += scale * s * q[at(i, d, dim)];
            dv[at(j, d, dim)] += pij * dO[at(i, d, dim)];
          }
        }
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t d = 0; d < dim; ++d) {
          const std::size_t row = at(b * n + t, h * dim + d, 3 * width);
          r.out[at(b * n + t, h * dim + d, width)] = o[at(t, d, dim)];
          r.dqkv[row] = dq[at(t, d, dim)];
          r.dqkv[row + static_cast<std::size_t>(width)] = dk[at(t, d, dim)];
          r.dqkv[row + static_cast<std::size_t>(2 * width)] = dv[at(t, d, dim)];
        }
    }
  return r;
}

// Part 0 (q), 1 (k) or 2 (v) of packed rows of 3 * width columns.
inline std::vector<double> attention_part(const std::vector<double>& packed, std::int64_t width, int which) {
  std::vector<double> values;
  const auto row_length = static_cast<std::size_t>(3 * width);
  for (std::size_t row = 0; row * row_length < packed.size(); ++row) {
    const auto first = packed.begin() + static_cast<std::ptrdiff_t>(row * row_length + which * width);
    values.insert(values.end(), first, first + width);
  }
  return values;
}

// Uniform multiples of 1 / denominator in [-range, range]: exact in bf16 and fp16 for range * denominator <= 256.
inline std::vector<double> grid_values(std::size_t count, std::uint64_t seed, double range, double denominator) {
  std::mt19937_64 generator(seed);
  const auto steps = static_cast<std::int64_t>(range * denominator);
  std::uniform_int_distribution<std::int64_t> distribution(-steps, steps);
  std::vector<double> values(count);
  for (double& value : values) value = static_cast<double>(distribution(generator)) / denominator;
  return values;
}

}  // namespace hpctrain::test_support
