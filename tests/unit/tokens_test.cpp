// Token files' metadata helpers (data/tokens.hpp): the stored type for a vocabulary at its boundaries, the number of
// windows of T + 1 tokens in a stream, and the unigram entropy of a count table against hand-worked values.
#include "hpctrain/data/tokens.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace hpctrain {
namespace {

TEST(Tokens, StoredTypeIsTheSmallestThatHoldsEveryId) {
  EXPECT_EQ(token_type_for(1), "uint8");
  EXPECT_EQ(token_type_for(256), "uint8");  // ids 0..255
  EXPECT_EQ(token_type_for(257), "uint16");
  EXPECT_EQ(token_type_for(50304), "uint16");  // GPT-2's padded vocabulary
  EXPECT_EQ(token_type_for(65536), "uint16");
  EXPECT_EQ(token_type_for(65537), "int32");
  EXPECT_EQ(token_type_for(max_vocabulary), "int32");
}

TEST(Tokens, WindowsOfTPlusOneTokensAtAStrideOfT) {
  EXPECT_EQ(token_windows(0, 4), 0);
  EXPECT_EQ(token_windows(4, 4), 0);  // a window needs T + 1 tokens
  EXPECT_EQ(token_windows(5, 4), 1);
  EXPECT_EQ(token_windows(8, 4), 1);  // tokens 0..4; 4..8 needs a ninth token
  EXPECT_EQ(token_windows(9, 4), 2);
  EXPECT_EQ(token_windows(1000, 16), 62);
  EXPECT_EQ(token_windows(std::int64_t{1} << 40, 1024), ((std::int64_t{1} << 40) - 1) / 1024);
}

TEST(Tokens, UnigramEntropyInBits) {
  TokenCounts uniform;
  uniform.counts = {5, 5, 5, 5, 0, 0, 0, 0};  // four ids used equally: 2 bits
  uniform.tokens = 20;
  EXPECT_NEAR(uniform.entropy_bits(), 2.0, 1e-15);
  EXPECT_EQ(uniform.ids_used(), 4);
  TokenCounts skewed;
  skewed.counts = {6, 2};  // p = 3/4, 1/4; ids outside the vocabulary are not part of the distribution
  skewed.tokens = 9;
  skewed.out_of_range = 1;
  EXPECT_NEAR(skewed.entropy_bits(), -(0.75 * std::log2(0.75) + 0.25 * std::log2(0.25)), 1e-15);
}

}  // namespace
}  // namespace hpctrain
