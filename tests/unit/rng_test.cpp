// Tests of the counter-based random numbers (include/hpctrain/core/rng.hpp): Philox-4x32-10 reproduces the published
// known-answer vectors of Random123, uniforms are uniform enough and inside [0, 1), and a number depends only on its
// (seed, purpose, stream, index), never on which numbers were drawn before it.
#include "hpctrain/core/rng.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace hpctrain {
namespace {

// Random123's key is two 32-bit words; ours packs them as (k1 << 32) | k0.
std::uint64_t packed_key(std::uint32_t k0, std::uint32_t k1) { return (static_cast<std::uint64_t>(k1) << 32) | k0; }

struct KnownAnswer {
  std::uint32_t counter[4];
  std::uint32_t key[2];
  std::uint32_t expected[4];
};

// The philox4x32 10-round vectors from Random123's kat_vectors file (counter, key, output).
const KnownAnswer known_answers[] = {
    {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u},
     {0x00000000u, 0x00000000u},
     {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    // Digits of pi.
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(Rng, PhiloxKnownAnswers) {
  for (const auto& answer : known_answers) {
    const Philox4 result = philox4x32(answer.counter[0], answer.counter[1], answer.counter[2], answer.counter[3],
                                      packed_key(answer.key[0], answer.key[1]));
    for (int word = 0; word < 4; ++word)
      EXPECT_EQ(result.v[word], answer.expected[word])
          << "word " << word << " for counter " << std::hex << answer.counter[0];
  }
}

TEST(Rng, RandomBitsIsPhiloxOfItsCoordinates) {
  const std::uint64_t seed = 0x0123456789abcdefull, index = 0xfedcba9876543210ull;
  const Philox4 direct =
      philox4x32(0x76543210u, 0xfedcba98u, 77u, static_cast<std::uint32_t>(RngPurpose::dropout), seed);
  const Philox4 through = random_bits(seed, RngPurpose::dropout, 77u, index);
  for (int word = 0; word < 4; ++word) EXPECT_EQ(through.v[word], direct.v[word]);
  EXPECT_EQ(random_uniform(seed, RngPurpose::dropout, 77u, index), uniform_from_bits(direct.v[0]));
}

TEST(Rng, UniformFromBitsRange) {
  EXPECT_EQ(uniform_from_bits(0u), 0.0f);
  EXPECT_LT(uniform_from_bits(0xffffffffu), 1.0f);
  EXPECT_EQ(uniform_from_bits(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_EQ(uniform_from_bits(0x80000000u), 0.5f);
}

TEST(Rng, UniformsLookUniform) {
  constexpr int count = 1'000'000;
  constexpr int buckets = 100;
  std::vector<int> histogram(buckets, 0);
  double sum = 0.0, sum_of_squares = 0.0;
  for (int i = 0; i < count; ++i) {
    const float value = random_uniform(42u, RngPurpose::init, 3u, static_cast<std::uint64_t>(i));
    ASSERT_GE(value, 0.0f) << i;
    ASSERT_LT(value, 1.0f) << i;
    sum += value;
    sum_of_squares += static_cast<double>(value) * value;
    ++histogram[static_cast<int>(value * buckets)];
  }
  const double mean = sum / count, variance = sum_of_squares / count - mean * mean;
  // The mean of 1e6 uniforms has standard deviation 0.29 / 1000; allow about 7 of them.
  EXPECT_NEAR(mean, 0.5, 0.002);
  EXPECT_NEAR(variance, 1.0 / 12.0, 0.002);
  // Chi-square with 99 degrees of freedom: mean 99, standard deviation 14; 200 is far out in the tail.
  double chi_square = 0.0;
  const double expected = static_cast<double>(count) / buckets;
  for (const int observed : histogram) chi_square += (observed - expected) * (observed - expected) / expected;
  EXPECT_LT(chi_square, 200.0);
}

TEST(Rng, AllFourWordsDiffer) {
  // Philox's words are not copies of each other; across many counters all four carry different values.
  for (std::uint64_t index = 0; index < 1000; ++index) {
    const Philox4 bits = random_bits(7u, RngPurpose::shuffle, 0u, index);
    const std::set<std::uint32_t> distinct(bits.v, bits.v + 4);
    EXPECT_EQ(distinct.size(), 4u) << index;
  }
}

TEST(Rng, ResultDoesNotDependOnCallOrder) {
  constexpr std::uint64_t count = 10'000;
  std::vector<float> forward(count);
  for (std::uint64_t i = 0; i < count; ++i) forward[i] = random_uniform(5u, RngPurpose::dropout, 11u, i);

  std::vector<float> backward(count);
  for (std::uint64_t i = count; i-- > 0;) backward[i] = random_uniform(5u, RngPurpose::dropout, 11u, i);
  EXPECT_EQ(forward, backward);

  // Shuffled order, with draws from other streams and purposes interleaved (as other layers and ranks would).
  std::vector<std::uint64_t> order(count);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(99u));
  std::vector<float> shuffled(count);
  for (const std::uint64_t i : order) {
    (void)random_uniform(5u, RngPurpose::init, 11u, i);
    (void)random_uniform(5u, RngPurpose::dropout, 12u, i * 3 + 1);
    shuffled[i] = random_uniform(5u, RngPurpose::dropout, 11u, i);
  }
  EXPECT_EQ(forward, shuffled);

  // Split into contiguous shares, as ranks would draw them.
  std::vector<float> shared(count);
  for (std::uint64_t rank = 0; rank < 3; ++rank)
    for (std::uint64_t i = rank * count / 3; i < (rank + 1) * count / 3; ++i)
      shared[i] = random_uniform(5u, RngPurpose::dropout, 11u, i);
  EXPECT_EQ(forward, shared);
}

TEST(Rng, CoordinatesSelectDifferentStreams) {
  // Changing any one of seed, purpose, stream or index (including its upper 32 bits) changes the numbers.
  const Philox4 base = random_bits(1u, RngPurpose::init, 0u, 0u);
  const Philox4 variants[] = {
      random_bits(2u, RngPurpose::init, 0u, 0u),    random_bits(1ull << 32, RngPurpose::init, 0u, 0u),
      random_bits(1u, RngPurpose::dropout, 0u, 0u), random_bits(1u, RngPurpose::init, 1u, 0u),
      random_bits(1u, RngPurpose::init, 0u, 1u),    random_bits(1u, RngPurpose::init, 0u, 1ull << 32),
  };
  for (const auto& variant : variants) EXPECT_NE(variant.v[0], base.v[0]);
}

}  // namespace
}  // namespace hpctrain
