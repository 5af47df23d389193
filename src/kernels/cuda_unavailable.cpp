// CPU-only builds: the CUDA entry points exist and say clearly that this build has no CUDA backend, so every caller
// links whatever the build options (the Ginkgo "not compiled" stub pattern).
#ifndef HPCTRAIN_HAVE_CUDA
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

int cuda_device_count() { return 0; }

std::unique_ptr<Backend> make_cuda_backend(int) {
  throw NotSupported("this build has no CUDA backend; rebuild with -DHPCTRAIN_CUDA=ON");
}

}  // namespace hpctrain
#endif
