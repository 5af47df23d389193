// Counter-based random numbers (Philox-4x32-10). A number is a pure function of (seed, purpose, step, index), so
// results do not depend on how many ranks share the work, are identical on CPU and GPU, and need no state to resume.
#pragma once

#include <cstdint>

#include "hpctrain/core/host_device.hpp"

namespace hpctrain {

// What a random stream is used for; part of the key so streams never overlap.
enum class RngPurpose : std::uint32_t {
  init = 1,
  dropout = 2,
  shuffle = 3,
  data_generation = 4,
  augmentation = 5,
  token_sampling = 6,     // hpctrain generate: one draw per (seed, position of the new token)
  attention_dropout = 7,  // the attention probabilities' dropout mask (kernels/math.hpp, attention_dropout_keep)
};

struct Philox4 {
  std::uint32_t v[4];
};

HPCTRAIN_HD std::uint32_t mulhilo32(std::uint32_t a, std::uint32_t b, std::uint32_t* high) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  *high = static_cast<std::uint32_t>(product >> 32);
  return static_cast<std::uint32_t>(product);
}

// Ten rounds of Philox-4x32 on counter (c0..c3) with a 64-bit key.
HPCTRAIN_HD Philox4 philox4x32(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2, std::uint32_t c3,
                               std::uint64_t key) {
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = mulhilo32(0xD2511F53u, c0, &hi0);
    const std::uint32_t lo1 = mulhilo32(0xCD9E8D57u, c2, &hi1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) from 24 random bits (exact in fp32).
HPCTRAIN_HD float uniform_from_bits(std::uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

// Four uniforms for (purpose, stream, index); stream is e.g. the step or a layer id, index e.g. a global element index.
HPCTRAIN_HD Philox4 random_bits(std::uint64_t seed, RngPurpose purpose, std::uint32_t stream, std::uint64_t index) {
  return philox4x32(static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), stream,
                    static_cast<std::uint32_t>(purpose), seed);
}

HPCTRAIN_HD float random_uniform(std::uint64_t seed, RngPurpose purpose, std::uint32_t stream, std::uint64_t index) {
  return uniform_from_bits(random_bits(seed, purpose, stream, index).v[0]);
}

}  // namespace hpctrain
