// Element types of buffers, and dispatch from the runtime tag to a template.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/half.hpp"

namespace hpctrain {

// f64 exists for finite-difference gradient checks through the real layer code; training uses f32/bf16/f16.
enum class DType : std::uint8_t { f32, bf16, f16, f64 };

inline std::size_t dtype_size(DType type) {
  switch (type) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::f64: return 8;
  }
  return 0;
}

inline const char* dtype_name(DType type) {
  switch (type) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::f64: return "fp64";
  }
  return "?";
}

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <>
constexpr DType dtype_of<fp16>() { return DType::f16; }
template <>
constexpr DType dtype_of<double>() { return DType::f64; }

// dispatch_dtype(type, [&]<class T>() { ... }) calls the lambda with T the C++ type of the tag.
template <class F>
decltype(auto) dispatch_dtype(DType type, F&& function) {
  switch (type) {
    case DType::f32: return function.template operator()<float>();
    case DType::bf16: return function.template operator()<bf16>();
    case DType::f16: return function.template operator()<fp16>();
    case DType::f64: return function.template operator()<double>();
  }
  HPCTRAIN_ASSERT(false, "unknown dtype " << static_cast<int>(type));
}

}  // namespace hpctrain
