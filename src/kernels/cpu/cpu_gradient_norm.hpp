// The gradient norm's chunk sum of the CPU backend (Backend::gradient_statistics in cpu_backend.cpp). Private to
// src/kernels/cpu; declared here so that a unit test can see which path summed each block.
#pragma once

#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cpu {

// Elements per partial sum of the gradient statistics; the partials are added in order, so the result does not depend
// on the thread count.
constexpr std::int64_t statistics_chunk = Backend::gradient_statistics_chunk;

// How the blocks of a chunk were summed (for tests): in fp32, skipped as all +-0 (they add exactly 0), or again in
// fp64 (fp32 may have flushed or overflowed). The buffer's last partial block is in none of them.
struct NormBlockPaths {
  std::int64_t fp32 = 0, zero = 0, fp64 = 0;
};

// The sum of squares of gradients[begin, end) (end - begin <= statistics_chunk) in a fixed order, and whether any is
// not finite (nonfinite = 1). paths, when not null, counts how the blocks were summed.
double chunk_sum_of_squares(const float* gradients, std::int64_t begin, std::int64_t end, int& nonfinite,
                            NormBlockPaths* paths = nullptr);

}  // namespace hpctrain::cpu
