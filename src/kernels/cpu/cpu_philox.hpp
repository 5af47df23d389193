// Philox-4x32-10 (core/rng.hpp) on 16 consecutive counters at once, in 64-byte vectors: the dropout masks of the CPU
// kernels (the dropout layer, attention dropout) come 64 numbers per call instead of four per scalar call. Private to
// src/kernels/cpu.
#pragma once

#include <cstdint>

#include "hpctrain/core/rng.hpp"

namespace hpctrain::cpu {

// words[4 g + w] = word w of philox4x32(group low, group high, layer, purpose; key) for group = first_group + g,
// g < 16: exactly what kernels/math.hpp's dropout_group_bits (RngPurpose::dropout) and attention_dropout_group_bits
// (RngPurpose::attention_dropout) give, i.e. the bits of the elements 4 first_group .. 4 first_group + 63.
inline void philox_words16(std::uint64_t key, std::uint32_t layer, RngPurpose purpose, std::uint64_t first_group,
                           std::uint32_t* words) {
  using Words = std::uint32_t __attribute__((vector_size(64)));
  using Wide = std::uint64_t __attribute__((vector_size(128)));
  Wide groups;
  for (int lane = 0; lane < 16; ++lane) groups[lane] = first_group + static_cast<std::uint64_t>(lane);
  Words c0 = __builtin_convertvector(groups, Words), c1 = __builtin_convertvector(groups >> 32, Words);
  Words c2 = Words{} + layer, c3 = Words{} + static_cast<std::uint32_t>(purpose);
  auto k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const Wide product0 = __builtin_convertvector(c0, Wide) * std::uint64_t{0xD2511F53u};
    const Wide product1 = __builtin_convertvector(c2, Wide) * std::uint64_t{0xCD9E8D57u};
    const Words high0 = __builtin_convertvector(product0 >> 32, Words), low0 = __builtin_convertvector(product0, Words);
    const Words high1 = __builtin_convertvector(product1 >> 32, Words), low1 = __builtin_convertvector(product1, Words);
    c0 = high1 ^ c1 ^ k0;
    c1 = low1;
    c2 = high0 ^ c3 ^ k1;
    c3 = low0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int lane = 0; lane < 16; ++lane) {
    words[4 * lane] = c0[lane];
    words[4 * lane + 1] = c1[lane];
    words[4 * lane + 2] = c2[lane];
    words[4 * lane + 3] = c3[lane];
  }
}

}  // namespace hpctrain::cpu
