// The Mersenne Twister MT19937 (Matsumoto and Nishimura, 1998), as std::mt19937 defines it, a block at a time.
#include "hpctrain/core/mt19937.hpp"

namespace hpctrain {

namespace {
constexpr int words = Mt19937Blocks::block_size, shift = 397;  // n and m of the definition

// One word of the twist: the upper bit of `upper`, the lower 31 of `lower`, then the matrix A and the word `shift`
// ahead. The select is arithmetic (no branch), so the loops below vectorise.
std::uint32_t twist(std::uint32_t upper, std::uint32_t lower, std::uint32_t ahead) {
  const std::uint32_t y = (upper & 0x80000000u) | (lower & 0x7fffffffu);
  return ahead ^ (y >> 1) ^ ((0u - (y & 1u)) & 0x9908b0dfu);
}
}  // namespace

Mt19937Blocks::Mt19937Blocks(std::uint32_t seed) {
  state_[0] = seed;
  for (int i = 1; i < words; ++i)
    state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + static_cast<std::uint32_t>(i);
}

const std::uint32_t* Mt19937Blocks::next_block() {
  // In place, as the definition does: word i reads word i + 1 before it changes, and from word n - m on, the word
  // m ahead wraps to one already renewed. Each loop has a fixed distance between what it writes and what it reads.
  std::uint32_t* s = state_;
  for (int i = 0; i < words - shift; ++i) s[i] = twist(s[i], s[i + 1], s[i + shift]);
  for (int i = words - shift; i < words - 1; ++i) s[i] = twist(s[i], s[i + 1], s[i + shift - words]);
  s[words - 1] = twist(s[words - 1], s[0], s[shift - 1]);
  for (int i = 0; i < words; ++i) {
    std::uint32_t y = s[i];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    outputs_[i] = y;
  }
  return outputs_;
}

}  // namespace hpctrain
