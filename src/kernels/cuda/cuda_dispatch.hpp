// The storage-dtype dispatch of the CUDA backend's files. Private to src/kernels/cuda.
#pragma once

#include <string>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/half.hpp"
#include "hpctrain/core/tensor.hpp"

namespace hpctrain::cuda {

[[noreturn]] inline void refuse_fp64(const char* what) {
  throw NotSupported(std::string(what) + " with fp64 storage on the CUDA backend (fp64 is for CPU gradient checks)");
}

// Refuses what dispatch_storage cannot dispatch, before any work is done.
inline void require_device_storage(DType type, const char* what) {
  if (type == DType::f64) refuse_fp64(what);
}

// Calls f.template operator()<T>() with T the storage type; f64 is not built for the GPU.
template <class F>
void dispatch_storage(DType type, const char* what, F&& f) {
  switch (type) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::bf16:
      return f.template operator()<bf16>();
    case DType::f16:
      return f.template operator()<fp16>();
    case DType::f64:
      break;
  }
  refuse_fp64(what);
}

}  // namespace hpctrain::cuda
