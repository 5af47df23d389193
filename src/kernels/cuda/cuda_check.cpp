// Error texts of the CUDA runtime, cuBLAS and cuDNN for the check macros (kernels/cuda/cuda_check.hpp), and the cheap
// device query every build can call.
#include "hpctrain/kernels/cuda/cuda_check.hpp"

#include <cstdio>
#include <string>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {
namespace detail {

void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  throw LibraryError("CUDA", call, std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code), file, line);
}

void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line) {
  throw LibraryError("cuBLAS", call, std::string(cublasLtGetStatusName(code)) + ": " + cublasLtGetStatusString(code),
                     file, line);
}

#if defined(HPCTRAIN_HAVE_CUDNN)
void throw_cudnn_error(cudnnStatus_t code, const char* call, const char* file, int line) {
  throw LibraryError("cuDNN", call, cudnnGetErrorString(code), file, line);
}
#endif

void warn_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  std::fprintf(stderr, "warning: CUDA call %s failed at %s:%d: %s\n", call, file, line, cudaGetErrorString(code));
}

}  // namespace detail

int cuda_device_count() {
  int count = 0;
  // No driver, no device, or a driver too old for this runtime: all mean "no usable GPU" here, not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls do not see it
    return 0;
  }
  return count;
}

}  // namespace hpctrain
