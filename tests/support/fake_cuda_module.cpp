// Stand-ins for the CUDA module, for tests/unit/cuda_module_test.cpp in every build (CUDA or not): built as shared
// modules that export hpctrain_cuda_module() like the real one, with a table of this build (FAKE_MODULE_ABI_SHIFT 0)
// or of another (1), and optionally a library dependency that the loader cannot find (FAKE_MODULE_NEEDS_ABSENT).
#include <memory>
#include <string>
#include <vector>

#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda_module.hpp"

#if defined(FAKE_MODULE_NEEDS_ABSENT)
extern "C" int hpctrain_test_absent_library();  // in a library the module's NEEDED names and nothing can find
#endif

namespace {

int device_count() {
#if defined(FAKE_MODULE_NEEDS_ABSENT)
  return hpctrain_test_absent_library();
#else
  return 3;
#endif
}

std::unique_ptr<hpctrain::Backend> make_backend(int device) {
  throw hpctrain::InputError("fake CUDA module: no backend on device " + std::to_string(device));
}

std::unique_ptr<hpctrain::GradientExchange> make_exchange(MPI_Comm, hpctrain::Backend&, float*, std::int64_t,
                                                          const std::vector<std::int64_t>&, std::int64_t) {
  throw hpctrain::NotSupported("fake CUDA module: no exchange");
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const hpctrain::CudaModuleTable* hpctrain_cuda_module() {
  static const hpctrain::CudaModuleTable table{hpctrain::cuda_module_abi + FAKE_MODULE_ABI_SHIFT,
                                               HPCTRAIN_VERSION,
                                               "fake",
                                               &device_count,
                                               &make_backend,
                                               &make_exchange};
  return &table;
}
