// Mt19937Blocks against std::mt19937: the same outputs, block after block, for seeds small and large (std::mt19937
// keeps a seed's low 32 bits), and the first outputs' published value.
#include "hpctrain/core/mt19937.hpp"

#include <gtest/gtest.h>

#include <random>

namespace hpctrain {
namespace {

TEST(Mt19937Blocks, GivesStdMt19937sSequence) {
  for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{5489}, std::uint64_t{0xffffffff},
                                   (std::uint64_t{3} << 32) + 17}) {
    std::mt19937 reference(static_cast<std::uint32_t>(seed));
    Mt19937Blocks blocks(static_cast<std::uint32_t>(seed));
    for (int block = 0; block < 7; ++block) {
      const std::uint32_t* outputs = blocks.next_block();
      for (int i = 0; i < Mt19937Blocks::block_size; ++i)
        ASSERT_EQ(outputs[i], reference()) << "seed " << seed << " block " << block << " output " << i;
    }
  }
}

TEST(Mt19937Blocks, TenThousandthOutputOfTheDefaultSeed) {
  // The C++ standard fixes it: the 10000th output of a default-constructed std::mt19937 (seed 5489) is 4123659995.
  Mt19937Blocks blocks(5489);
  std::uint32_t value = 0;
  for (int drawn = 0; drawn < 10000;) {
    const std::uint32_t* outputs = blocks.next_block();
    for (int i = 0; i < Mt19937Blocks::block_size && drawn < 10000; ++i, ++drawn) value = outputs[i];
  }
  EXPECT_EQ(value, 4123659995u);
}

}  // namespace
}  // namespace hpctrain
