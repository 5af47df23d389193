// Small helpers shared by the CPU backend's source files: grow-only aligned scratch buffers and dtype conversion of one
// value. Private to src/kernels/cpu.
#pragma once

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
