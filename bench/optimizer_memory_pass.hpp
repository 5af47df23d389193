// The memory traffic of hpctrain's optimizer phase with trivial arithmetic: what the traffic alone costs on this
// machine, the anchor of the optimizer rows (gemm_ceiling's MEMORY line, optimizer_pass). Two passes, as the phase
// must make them (the clip coefficient needs the whole norm before any update): read the gradients for their norm;
// then read parameters, gradients and two moments, write parameters and moments, and with a 16-bit working copy also
// write it. Bytes per element: 4 + 16 read + 12 written (+ 2).
#pragma once

#include <cstdint>
#include <cstring>

namespace hpctrain::bench {

inline double optimizer_pass_bytes_per_element(bool working_copy) { return working_copy ? 34.0 : 32.0; }

// Sum of squares of g (the norm's traffic: one read).
inline double memory_norm_pass(const float* __restrict g, std::int64_t count) {
  double norm = 0.0;
#pragma omp parallel for simd reduction(+ : norm) schedule(static)
  for (std::int64_t i = 0; i < count; ++i) norm += static_cast<double>(g[i]) * g[i];
  return norm;
}

// The update's traffic; w (16-bit, truncated) may be null.
inline void memory_update_pass(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                               std::uint16_t* __restrict w, std::int64_t count) {
  const bool copy = w != nullptr;
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < count; ++i) {
    const float mi = 0.9f * m[i] + 0.1f * g[i], vi = 0.999f * v[i] + 0.001f * g[i] * g[i];
    const float pi = p[i] - 1e-3f * mi + 1e-6f * vi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (copy) {
      std::uint32_t bits;
      std::memcpy(&bits, &pi, sizeof bits);
      w[i] = static_cast<std::uint16_t>(bits >> 16);
    }
  }
}

}  // namespace hpctrain::bench
