// Small helpers shared by the CPU backend's source files: grow-only aligned scratch buffers and dtype conversion of one
// value. Private to src/kernels/cpu.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>

#include "hpctrain/core/half.hpp"

namespace hpctrain::cpu {

inline constexpr std::size_t memory_alignment = 64;  // cache line and AVX-512 vector

// The widest vector register of the build's target, in bytes: the width of the CPU loops' GCC vector types. GCC
// splits a wider type into several registers, and register blocks of such types spill (on AVX2 the 64-byte types of
// the pooling and attention loops cost them ~10x).
#if defined(__AVX512F__)
inline constexpr std::size_t vector_register_bytes = 64;
#elif defined(__AVX__)
inline constexpr std::size_t vector_register_bytes = 32;
#else
inline constexpr std::size_t vector_register_bytes = 16;  // SSE: builds for any x86-64 (HPCTRAIN_NATIVE=OFF), others
#endif

// a * b + c rounded as the compiler contracts it on this target: once (an FMA instruction) where the build has FMA,
// twice where it has not. For loops restructured by hand whose plain form the compiler contracted: an unrolled form
// may be left unfused, which changes the last bit.
template <class C>
inline C multiply_add(C a, C b, C c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

inline std::size_t round_up_to_alignment(std::size_t bytes) {
  return (bytes + memory_alignment - 1) / memory_alignment * memory_alignment;
}

// std::aligned_alloc with the size rounded up (the standard requires a multiple of the alignment); never null.
inline void* aligned_allocate(std::size_t bytes) {
  void* pointer = std::aligned_alloc(memory_alignment, round_up_to_alignment(bytes == 0 ? 1 : bytes));
  if (pointer == nullptr) throw std::bad_alloc();
  return pointer;
}

// Scratch memory that only grows: after the largest request has been seen, reserve() never allocates again.
// Contents are not preserved when it grows.
class ScratchBuffer {
 public:
  void* reserve(std::size_t bytes) {
    if (bytes > capacity_) {
      data_.reset(aligned_allocate(bytes));
      capacity_ = round_up_to_alignment(bytes);
    }
    return data_.get();
  }
  template <class T>
  T* reserve_elements(std::size_t count) {
    return static_cast<T*>(reserve(count * sizeof(T)));
  }

 private:
  struct Free {
    void operator()(void* pointer) const { std::free(pointer); }
  };
  std::unique_ptr<void, Free> data_;
  std::size_t capacity_ = 0;
};

// Mixes value into hash (boost::hash_combine's recipe): the hashes of the primitive caches' keys.
inline void hash_combine(std::size_t& hash, std::uint64_t value) {
  hash ^= std::hash<std::uint64_t>{}(value) + 0x9e3779b97f4a7c15ull + (hash << 6) + (hash >> 2);
}

// Value of storage type From converted to storage type To: through fp32 unless either side is f64 (then through fp64,
// so f64 <-> f32 is exact where it can be).
template <class To, class From>
inline To convert_value(From value) {
  if constexpr (std::is_same_v<To, double>) {
    return static_cast<double>(load(value));
  } else {
    return store<To>(static_cast<float>(load(value)));
  }
}

// Storage of type T widened to fp32 (the 16-bit inputs of products oneDNN does not run natively), and back.
template <class T>
void widen_to_float(const T* source, float* destination, std::int64_t count) {
#pragma omp parallel for schedule(static) if (count > 32768)
  for (std::int64_t i = 0; i < count; ++i) destination[i] = load(source[i]);
}

template <class T>
void narrow_from_float(const float* source, T* destination, std::int64_t count) {
#pragma omp parallel for schedule(static) if (count > 32768)
  for (std::int64_t i = 0; i < count; ++i) destination[i] = store<T>(source[i]);
}

// A 16-bit operand (fp16 or bf16 storage) widened to fp32.
inline void widen_16bit_to_float(const void* source, bool is_bf16, float* destination, std::int64_t count) {
  if (is_bf16)
    widen_to_float(static_cast<const bf16*>(source), destination, count);
  else
    widen_to_float(static_cast<const fp16*>(source), destination, count);
}

// Whether oneDNN runs bf16 products natively on this CPU. oneDNN 2.6 has bf16 matmul and convolution kernels only
// from AVX-512 on (AVX512-BF16/AMX natively, AVX512 by emulation); on an AVX2-only CPU primitive creation fails, so
// the backend widens bf16 operands to fp32 (exact) and rounds the result once, as it does for fp16.
// HPCTRAIN_ONEDNN_BF16=0 forces that path (to test it, or to compare speeds). Probed once per process.
bool onednn_runs_bf16();

// A value computed in double stored as To.
template <class To>
inline To store_from_double(double value) {
  if constexpr (std::is_same_v<To, double>) {
    return value;
  } else {
    return store<To>(static_cast<float>(value));
  }
}

}  // namespace hpctrain::cpu
