// The CUDA module's entry point: the one symbol libhpctrain_cuda.so exports (the rest is built with hidden visibility,
// cmake/HpctrainCuda.cmake). The executable finds it with dlsym and reaches the backend and the NCCL exchange through
// its table (kernels/cuda_module.hpp). It sits in dist/ because the table holds both.
#include <cuda_runtime_api.h>

#if defined(HPCTRAIN_HAVE_CUDNN)
#include <cudnn_version.h>
#endif
#if defined(HPCTRAIN_HAVE_NCCL)
#include <nccl.h>
#endif

#include <string>

#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda_module.hpp"

namespace {

// The libraries this module was compiled against, for `hpctrain --version`.
const char* features() {
  static const std::string text = "CUDA runtime " + std::to_string(CUDART_VERSION / 1000) + "." +
                                  std::to_string(CUDART_VERSION % 1000 / 10) + ", cuBLASLt" +
#if defined(HPCTRAIN_HAVE_CUDNN)
                                  ", cuDNN " + std::to_string(CUDNN_MAJOR) + "." + std::to_string(CUDNN_MINOR) +
#else
                                  ", no cuDNN" +
#endif
#if defined(HPCTRAIN_HAVE_NCCL)
                                  ", NCCL " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR);
#else
                                  ", no NCCL";
#endif
  return text.c_str();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const hpctrain::CudaModuleTable* hpctrain_cuda_module() {
  static const hpctrain::CudaModuleTable table{hpctrain::cuda_module_abi,
                                               HPCTRAIN_VERSION,
                                               features(),
                                               &hpctrain::cuda_device_count,
                                               &hpctrain::make_cuda_backend,
                                               &hpctrain::make_nccl_gradient_allreduce};
  return &table;
}
