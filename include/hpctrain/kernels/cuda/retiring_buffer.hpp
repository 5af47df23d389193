// Device memory that only grows and never frees a block that a captured CUDA graph (or work still queued) may point
// at: a larger request allocates a new block and *retires* the old one, freed only at destruction. Evaluation batches
// larger than the training batch, a partial batch or a new cuDNN plan after the capture then get memory of their own
// while the graph keeps replaying on the old block.
//
// Host-only logic over an allocator (no CUDA headers), so the policy is tested on the CPU with a counting allocator
// (tests/unit/cuda_host_logic_test.cpp); the CUDA backend instantiates it with cudaMalloc/cudaFree.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace hpctrain::cuda {

// Allocator: `void* allocate(std::size_t bytes)` (throws on failure) and `void release(void* pointer) noexcept`.
template <class Allocator>
class RetiringBuffer {
 public:
  static constexpr std::size_t granule = 256;  // cudaMalloc's alignment; sizes are rounded up to it

  explicit RetiringBuffer(Allocator allocator = Allocator()) : allocator_(std::move(allocator)) {}
  RetiringBuffer(const RetiringBuffer&) = delete;
  RetiringBuffer& operator=(const RetiringBuffer&) = delete;
  ~RetiringBuffer() {
    for (void* pointer : retired_) allocator_.release(pointer);
    if (data_ != nullptr) allocator_.release(data_);
  }

  // At least `bytes`: the current block when it is large enough, else a new one (the old one is retired, not freed).
  void* reserve(std::size_t bytes) {
    bytes = (max_of(bytes, 1) + granule - 1) / granule * granule;
    if (bytes > capacity_) {
      void* grown = allocator_.allocate(bytes);  // may throw: the old block stays current
      if (data_ != nullptr) retired_.push_back(data_);
      data_ = grown;
      capacity_ = bytes;
    }
    return data_;
  }
  template <class T>
  T* reserve_elements(std::size_t count) {
    return static_cast<T*>(reserve(count * sizeof(T)));
  }

  [[nodiscard]] void* data() const { return data_; }
  [[nodiscard]] std::size_t capacity() const { return capacity_; }
  [[nodiscard]] std::size_t retired_blocks() const { return retired_.size(); }

 private:
  static std::size_t max_of(std::size_t a, std::size_t b) { return a < b ? b : a; }
  Allocator allocator_;
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::vector<void*> retired_;
};

}  // namespace hpctrain::cuda
