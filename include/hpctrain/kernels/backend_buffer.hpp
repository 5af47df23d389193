// An owning buffer in backend memory (freed through its backend), for the few buffers outside the model's arenas.
#pragma once

#include <algorithm>
#include <utility>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

struct BackendBuffer {
  Backend* backend = nullptr;
  void* data = nullptr;
  BackendBuffer() = default;
  BackendBuffer(Backend& owner, std::size_t bytes)
      : backend(&owner), data(owner.allocate(std::max<std::size_t>(bytes, 64))) {}
  BackendBuffer(BackendBuffer&& other) noexcept : backend(other.backend), data(std::exchange(other.data, nullptr)) {}
  BackendBuffer& operator=(BackendBuffer&& other) noexcept {
    std::swap(backend, other.backend);
    std::swap(data, other.data);
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() {
    if (data != nullptr) backend->deallocate(data);
  }
  template <class T>
  [[nodiscard]] T* as() const {
    return static_cast<T*>(data);
  }
};

}  // namespace hpctrain
