// Tests of the 16-bit storage types (include/hpctrain/core/half.hpp): every bf16 and fp16 bit pattern survives a trip
// through float, and float -> 16-bit rounding matches CUDA's own host conversions bit for bit, so the CPU and CUDA
// backends store identical values. The CUDA comparison needs the toolkit headers (compiled here by the host compiler)
// and is skipped without them.
#include "hpctrain/core/half.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if __has_include("/usr/local/cuda/include/cuda_fp16.h") && __has_include("/usr/local/cuda/include/cuda_bf16.h")
#include "/usr/local/cuda/include/cuda_bf16.h"
#include "/usr/local/cuda/include/cuda_fp16.h"
#define HPCTRAIN_TEST_HAVE_CUDA_HEADERS 1
#else
#define HPCTRAIN_TEST_HAVE_CUDA_HEADERS 0
#endif

namespace hpctrain {
namespace {

bool is_nan_bits(std::uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }
bool is_bf16_nan(std::uint16_t bits) { return (bits & 0x7fffu) > 0x7f80u; }
bool is_fp16_nan(std::uint16_t bits) { return (bits & 0x7fffu) > 0x7c00u; }

TEST(Half, Bf16BitPatternsSurviveFloat) {
  for (std::uint32_t pattern = 0; pattern <= 0xffffu; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const float value = to_float(bf16{bits});
    EXPECT_EQ(float_bits(value), static_cast<std::uint32_t>(bits) << 16) << std::hex << pattern;  // bf16 is exact
    const bf16 back = to_bf16(value);
    if (is_bf16_nan(bits)) {
      EXPECT_TRUE(std::isnan(value)) << std::hex << pattern;
      EXPECT_TRUE(is_bf16_nan(back.bits)) << std::hex << pattern;
    } else {
      EXPECT_EQ(back.bits, bits) << std::hex << pattern;
    }
  }
}

TEST(Half, Fp16BitPatternsSurviveFloat) {
  for (std::uint32_t pattern = 0; pattern <= 0xffffu; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const float value = to_float(fp16{bits});
    const fp16 back = to_fp16(value);
    if (is_fp16_nan(bits)) {
      EXPECT_TRUE(std::isnan(value)) << std::hex << pattern;
      EXPECT_TRUE(is_fp16_nan(back.bits)) << std::hex << pattern;
    } else {
      EXPECT_EQ(back.bits, bits) << std::hex << pattern;
    }
  }
}

// A few values whose fp16 encodings are known from the IEEE 754 binary16 definition.
TEST(Half, Fp16KnownValues) {
  EXPECT_EQ(to_fp16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_fp16(-2.0f).bits, 0xc000);
  EXPECT_EQ(to_fp16(65504.0f).bits, 0x7bff);                // largest finite
  EXPECT_EQ(to_fp16(65519.996f).bits, 0x7bff);              // just below the overflow threshold
  EXPECT_EQ(to_fp16(65520.0f).bits, 0x7c00);                // the tie rounds to even: Inf
  EXPECT_EQ(to_fp16(std::ldexp(1.0f, -24)).bits, 0x0001);   // smallest subnormal
  EXPECT_EQ(to_fp16(std::ldexp(1.0f, -25)).bits, 0x0000);   // half of it: tie to even, zero
  EXPECT_EQ(to_fp16(std::ldexp(1.5f, -25)).bits, 0x0001);   // above the tie
  EXPECT_EQ(to_fp16(std::ldexp(3.0f, -25)).bits, 0x0002);   // 1.5 subnormal steps: tie to even, 2
  EXPECT_EQ(to_fp16(-std::ldexp(1.0f, -14)).bits, 0x8400);  // smallest normal
  EXPECT_EQ(to_float(fp16{0x3555}), 0.333251953125f);
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds up to Inf
}

#if HPCTRAIN_TEST_HAVE_CUDA_HEADERS

std::uint16_t cuda_fp16_bits(float value) {
  const __half converted = __float2half_rn(value);
  std::uint16_t bits;
  std::memcpy(&bits, &converted, sizeof bits);
  return bits;
}

std::uint16_t cuda_bf16_bits(float value) {
  const __nv_bfloat16 converted = __float2bfloat16_rn(value);
  std::uint16_t bits;
  std::memcpy(&bits, &converted, sizeof bits);
  return bits;
}

float cuda_fp16_to_float(std::uint16_t bits) {
  __half value;
  std::memcpy(&value, &bits, sizeof bits);
  return __half2float(value);
}

float cuda_bf16_to_float(std::uint16_t bits) {
  __nv_bfloat16 value;
  std::memcpy(&value, &bits, sizeof bits);
  return __bfloat162float(value);
}

// Compares one float's conversion with CUDA's; counts mismatches and reports the first few.
class Comparison {
 public:
  void check(std::uint32_t input_bits) {
    const float value = bits_float(input_bits);
    const std::uint16_t ours_fp16 = to_fp16(value).bits, cuda_fp16 = cuda_fp16_bits(value);
    const std::uint16_t ours_bf16 = to_bf16(value).bits, cuda_bf16 = cuda_bf16_bits(value);
    if (ours_fp16 != cuda_fp16) report("fp16", input_bits, ours_fp16, cuda_fp16);
    if (ours_bf16 != cuda_bf16) report("bf16", input_bits, ours_bf16, cuda_bf16);
    ++checked_;
  }
  // Every float whose bits lie within +-64 of center's.
  void check_around(std::uint32_t center) {
    for (std::int64_t offset = -64; offset <= 64; ++offset) check(static_cast<std::uint32_t>(center + offset));
  }
  [[nodiscard]] std::uint64_t mismatches() const { return mismatches_; }
  [[nodiscard]] std::uint64_t checked() const { return checked_; }

 private:
  void report(const char* type, std::uint32_t input_bits, std::uint16_t ours, std::uint16_t cuda) {
    if (++mismatches_ <= 10)
      ADD_FAILURE() << type << " of float bits 0x" << std::hex << input_bits << " (" << bits_float(input_bits)
                    << "): ours 0x" << ours << ", CUDA 0x" << cuda;
  }
  std::uint64_t mismatches_ = 0;
  std::uint64_t checked_ = 0;
};

// The exact value of a 16-bit pattern and of the next pattern away from zero; past the largest finite value the "next"
// is the first power of two that no longer fits, so the midpoint is the overflow threshold (65520 for fp16).
template <class Half>
double next_away_from_zero(std::uint16_t bits, double value);

template <>
double next_away_from_zero<fp16>(std::uint16_t bits, double value) {
  if ((bits & 0x7fffu) == 0x7bffu) return std::copysign(65536.0, value);
  return to_float(fp16{static_cast<std::uint16_t>(bits + 1)});
}

template <>
double next_away_from_zero<bf16>(std::uint16_t bits, double value) {
  if ((bits & 0x7fffu) == 0x7f7fu) return std::copysign(std::ldexp(1.0, 128), value);
  return to_float(bf16{static_cast<std::uint16_t>(bits + 1)});
}

// Around every finite 16-bit value of type Half: its exact float and the midpoint to its neighbour away from zero
// (where round-to-nearest-even decides). Both conversions are checked at each float, so fp16 boundaries also
// exercise the bf16 conversion and the other way round.
template <class Half>
void check_boundaries(Comparison& comparison) {
  for (std::uint32_t pattern = 0; pattern <= 0xffffu; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const float value = to_float(Half{bits});
    if (!std::isfinite(value)) continue;
    comparison.check_around(float_bits(value));
    // The midpoint of two adjacent 16-bit values needs one more significant bit than they do: exact in a float.
    const double midpoint = (static_cast<double>(value) + next_away_from_zero<Half>(bits, value)) / 2.0;
    const auto midpoint_float = static_cast<float>(midpoint);
    ASSERT_EQ(static_cast<double>(midpoint_float), midpoint) << std::hex << pattern;
    comparison.check_around(float_bits(midpoint_float));
  }
}

TEST(HalfMatchesCuda, AroundEveryBoundaryAndTie) {
  Comparison comparison;
  check_boundaries<fp16>(comparison);
  check_boundaries<bf16>(comparison);
  EXPECT_EQ(comparison.mismatches(), 0u) << "of " << comparison.checked() << " floats";
  EXPECT_GT(comparison.checked(), 32000000u);  // about 128 000 finite patterns x 2 centres x 129 floats
}

TEST(HalfMatchesCuda, RandomFloats) {
  Comparison comparison;
  std::mt19937 generator(20240611u);
  for (int i = 0; i < 4'000'000; ++i) comparison.check(static_cast<std::uint32_t>(generator()));
  EXPECT_EQ(comparison.mismatches(), 0u) << "of " << comparison.checked() << " floats";
}

TEST(HalfMatchesCuda, SpecialValues) {
  const float infinity = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {
      0.0f,
      -0.0f,
      infinity,
      -infinity,
      std::numeric_limits<float>::max(),
      -std::numeric_limits<float>::max(),
      std::numeric_limits<float>::min(),
      std::numeric_limits<float>::denorm_min(),
      65504.0f,
      65520.0f,
      -65520.0f,
      std::nextafter(65520.0f, 0.0f),
      std::nextafter(65520.0f, infinity),
      65536.0f,
      1e10f,
      std::ldexp(1.0f, -24),
      std::ldexp(1.0f, -25),
      -std::ldexp(1.0f, -25),
      std::ldexp(1.0f, -26),
      std::nextafter(std::ldexp(1.0f, -25), infinity),
      std::nextafter(std::ldexp(1.0f, -25), 0.0f),
      std::ldexp(1.0f, -14),
      std::ldexp(1023.0f, -24),
      std::ldexp(1023.5f, -24),
      std::ldexp(1.0f, -133),
      std::ldexp(1.0f, -134),
      3.3895314e38f,  // largest finite bf16
  };
  Comparison comparison;
  for (const float value : specials) comparison.check(float_bits(value));
  // NaNs: quiet and signalling, both signs, assorted payloads.
  for (const std::uint32_t nan_bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fffffffu,
                                       0xffffffffu, 0x7fc00001u, 0x7f812345u, 0x7fdead00u}) {
    ASSERT_TRUE(is_nan_bits(nan_bits));
    comparison.check(nan_bits);
    EXPECT_TRUE(is_fp16_nan(to_fp16(bits_float(nan_bits)).bits));
    EXPECT_TRUE(is_bf16_nan(to_bf16(bits_float(nan_bits)).bits));
  }
  EXPECT_EQ(comparison.mismatches(), 0u);
}

TEST(HalfMatchesCuda, ToFloatOfEveryPattern) {
  for (std::uint32_t pattern = 0; pattern <= 0xffffu; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const float ours_fp16 = to_float(fp16{bits}), cuda_fp16 = cuda_fp16_to_float(bits);
    const float ours_bf16 = to_float(bf16{bits}), cuda_bf16 = cuda_bf16_to_float(bits);
    if (std::isnan(cuda_fp16)) {
      EXPECT_TRUE(std::isnan(ours_fp16)) << std::hex << pattern;
    } else {
      EXPECT_EQ(float_bits(ours_fp16), float_bits(cuda_fp16)) << std::hex << pattern;
    }
    if (std::isnan(cuda_bf16)) {
      EXPECT_TRUE(std::isnan(ours_bf16)) << std::hex << pattern;
    } else {
      EXPECT_EQ(float_bits(ours_bf16), float_bits(cuda_bf16)) << std::hex << pattern;
    }
  }
}

#else

TEST(HalfMatchesCuda, NeedsCudaHeaders) {
  GTEST_SKIP() << "/usr/local/cuda/include/cuda_fp16.h not found: CUDA comparison skipped";
}

#endif

}  // namespace
}  // namespace hpctrain
