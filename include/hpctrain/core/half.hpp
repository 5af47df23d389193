// 16-bit floating-point storage types (bf16, fp16) and their conversions.
//
// Storage only: arithmetic happens in fp32. float -> 16-bit rounds to nearest even and matches CUDA's
// __float2bfloat16_rn / __float2half_rn bit for bit (NaN stays NaN, overflow goes to Inf, fp16 subnormals are rounded
// correctly), so the CPU and CUDA backends store identical bits. Device code uses those hardware conversions themselves
// (one instruction instead of the bit manipulation below); tests/gpu/cuda_kernels_test.cpp checks that casts on the two
// backends give identical bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "hpctrain/core/host_device.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace hpctrain {

struct bf16 {
  std::uint16_t bits;
};
struct fp16 {
  std::uint16_t bits;
};

HPCTRAIN_HD std::uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

HPCTRAIN_HD float bits_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// ---- bf16: the upper half of an fp32 ----
HPCTRAIN_HD float to_float(bf16 value) { return bits_float(static_cast<std::uint32_t>(value.bits) << 16); }

HPCTRAIN_HD bf16 to_bf16(float value) {
#if defined(__CUDA_ARCH__)
  return bf16{__bfloat16_as_ushort(__float2bfloat16_rn(value))};
#else
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16{0x7fff};   // canonical NaN, as CUDA produces
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // round half to even
  return bf16{static_cast<std::uint16_t>((bits + rounding) >> 16)};
#endif
}

// ---- fp16: 1 sign, 5 exponent, 10 mantissa bits ----
HPCTRAIN_HD float to_float(fp16 value) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(value.bits));
#else
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (value.bits >> 10) & 0x1fu;
  std::uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // Inf / NaN
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);  // signed zero
    // subnormal: value = mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#endif
}

HPCTRAIN_HD fp16 to_fp16(float value) {
#if defined(__CUDA_ARCH__)
  return fp16{__half_as_ushort(__float2half_rn(value))};
#else
  const std::uint32_t bits = float_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return fp16{0x7fff};                                       // NaN (canonical, like CUDA)
  if (magnitude >= 0x477ff000u) return fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520: Inf
  if (magnitude < 0x38800000u) {
    // result is subnormal (or zero): mantissa = round(|value| * 2^24), ties to even
    const std::uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return fp16{sign};  // below half the smallest subnormal: rounds to zero
    const std::uint32_t full = (magnitude & 0x7fffffu) | 0x800000u;  // implicit bit
    const std::uint32_t shift = 126 - exponent;                      // 14..24
    std::uint32_t result = full >> shift;
    const std::uint32_t remainder = full & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (result & 1u))) ++result;
    return fp16{static_cast<std::uint16_t>(sign | result)};
  }
  // normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even
  std::uint32_t result = ((magnitude >> 13) - (112u << 10));
  const std::uint32_t remainder = magnitude & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) ++result;
  return fp16{static_cast<std::uint16_t>(sign | result)};
#endif
}

// Generic load/store used by templated kernels: compute in Compute (fp32, or fp64 in gradient checks), store in T.
template <class T>
struct StorageTraits {
  using compute_type = float;
  HPCTRAIN_HD static float load(T value) { return static_cast<float>(value); }
  HPCTRAIN_HD static T store(float value) { return static_cast<T>(value); }
};
template <>
struct StorageTraits<double> {
  using compute_type = double;
  HPCTRAIN_HD static double load(double value) { return value; }
  HPCTRAIN_HD static double store(double value) { return value; }
};
template <>
struct StorageTraits<bf16> {
  using compute_type = float;
  HPCTRAIN_HD static float load(bf16 value) { return to_float(value); }
  HPCTRAIN_HD static bf16 store(float value) { return to_bf16(value); }
};
template <>
struct StorageTraits<fp16> {
  using compute_type = float;
  HPCTRAIN_HD static float load(fp16 value) { return to_float(value); }
  HPCTRAIN_HD static fp16 store(float value) { return to_fp16(value); }
};

template <class T>
using compute_t = typename StorageTraits<T>::compute_type;

template <class T>
HPCTRAIN_HD compute_t<T> load(T value) {
  return StorageTraits<T>::load(value);
}
template <class T>
HPCTRAIN_HD T store(compute_t<T> value) {
  return StorageTraits<T>::store(value);
}

}  // namespace hpctrain
