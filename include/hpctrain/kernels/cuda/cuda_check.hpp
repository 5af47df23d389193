// Check macros for the CUDA runtime, cuBLAS(Lt), cuDNN and NCCL, in the family of HPCTRAIN_MPI_CHECK: a failing call
// throws LibraryError with the library's own error text and the file:line of the call. CUDA-only header (includes the
// CUDA headers); the messages are built in src/kernels/cuda/cuda_check.cpp.
//
// The *_WARN forms only print (rank-prefixed by the caller's main): for destructors, which must not throw.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#if defined(HPCTRAIN_HAVE_CUDNN)
#include <cudnn.h>
#endif

#include "hpctrain/core/error.hpp"

namespace hpctrain::detail {
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line);
#if defined(HPCTRAIN_HAVE_CUDNN)
[[noreturn]] void throw_cudnn_error(cudnnStatus_t code, const char* call, const char* file, int line);
#endif
void warn_cuda_error(cudaError_t code, const char* call, const char* file, int line);
}  // namespace hpctrain::detail

#define HPCTRAIN_CUDA_CHECK(call)                                                         \
  do {                                                                                    \
    const cudaError_t hpctrain_cuda_rc_ = (call);                                         \
    if (hpctrain_cuda_rc_ != cudaSuccess)                                                 \
      ::hpctrain::detail::throw_cuda_error(hpctrain_cuda_rc_, #call, __FILE__, __LINE__); \
  } while (false)

// After a kernel launch: launch-configuration errors show up here (execution errors at the next synchronisation).
#define HPCTRAIN_CUDA_CHECK_LAUNCH() HPCTRAIN_CUDA_CHECK(cudaGetLastError())

#define HPCTRAIN_CUDA_WARN(call)                                                         \
  do {                                                                                   \
    const cudaError_t hpctrain_cuda_rc_ = (call);                                        \
    if (hpctrain_cuda_rc_ != cudaSuccess)                                                \
      ::hpctrain::detail::warn_cuda_error(hpctrain_cuda_rc_, #call, __FILE__, __LINE__); \
  } while (false)

#define HPCTRAIN_CUBLAS_CHECK(call)                                                           \
  do {                                                                                        \
    const cublasStatus_t hpctrain_cublas_rc_ = (call);                                        \
    if (hpctrain_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::hpctrain::detail::throw_cublas_error(hpctrain_cublas_rc_, #call, __FILE__, __LINE__); \
  } while (false)

#if defined(HPCTRAIN_HAVE_CUDNN)
#define HPCTRAIN_CUDNN_CHECK(call)                                                          \
  do {                                                                                      \
    const cudnnStatus_t hpctrain_cudnn_rc_ = (call);                                        \
    if (hpctrain_cudnn_rc_ != CUDNN_STATUS_SUCCESS)                                         \
      ::hpctrain::detail::throw_cudnn_error(hpctrain_cudnn_rc_, #call, __FILE__, __LINE__); \
  } while (false)
#endif
