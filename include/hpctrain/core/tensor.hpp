// Non-owning views of buffers. A model's memory is a few large allocations carved into views; views never own.
#pragma once

#include <cstdint>

#include "hpctrain/core/dtype.hpp"

namespace hpctrain {

// A row-major matrix (rows x cols) of one dtype: a batch of samples (B, features) or a weight (out, in).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;

  [[nodiscard]] std::int64_t size() const { return rows * cols; }
  [[nodiscard]] std::size_t bytes() const { return static_cast<std::size_t>(size()) * dtype_size(dtype); }
  template <class T>
  [[nodiscard]] T* as() const {
    HPCTRAIN_ASSERT(dtype_of<T>() == dtype,
                    "view is " << dtype_name(dtype) << ", accessed as " << dtype_name(dtype_of<T>()));
    return static_cast<T*>(data);
  }
};

}  // namespace hpctrain
