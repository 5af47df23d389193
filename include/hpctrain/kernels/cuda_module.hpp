// The CUDA backend lives in a module (libhpctrain_cuda.so) that the executable opens at run time, only when a run asks
// for CUDA: the executable links no CUDA library, so it starts on nodes without them and a CPU run costs the memory of
// a CPU-only build. The module's one exported symbol, hpctrain_cuda_module(), returns the table below.
//
// make_cuda_backend (kernels/backend.hpp) and make_nccl_gradient_allreduce (dist/gradient_allreduce.hpp) forward to
// the table; cuda_device_count asks the driver directly and never loads the module.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hpctrain {

class Backend;
class GradientExchange;  // dist/gradient_allreduce.hpp: the module holds the NCCL exchange as well

// Changes with the table's layout: a module from another build is refused instead of being called wrongly.
inline constexpr int cuda_module_abi = 1;

// The executable and the module come from one build and one compiler, so the table may carry C++ types, and its
// functions throw hpctrain::Error like any other code (the entry point has C linkage only to be found by name).
struct CudaModuleTable {
  int abi;                // cuda_module_abi of the module's build
  const char* version;    // HPCTRAIN_VERSION of the module's build
  const char* features;   // the libraries it was built with, for --version
  int (*device_count)();  // visible devices as the CUDA runtime counts them; 0 without a driver or device
  std::unique_ptr<Backend> (*make_backend)(int device);
  std::unique_ptr<GradientExchange> (*make_nccl_gradient_allreduce)(MPI_Comm communicator, Backend& backend,
                                                                    float* gradients, std::int64_t count,
                                                                    const std::vector<std::int64_t>& layer_begins,
                                                                    std::int64_t bucket_bytes);
};

// The module's table, opened on the first call and kept for the process's life: $HPCTRAIN_CUDA_MODULE when set, else
// libhpctrain_cuda.so in the lib folder beside the executable's bin folder. nullptr when it cannot be loaded, with the
// reason in *why (a CPU-only build, the module missing, a CUDA library it needs missing, a module of another build).
const CudaModuleTable* load_cuda_module(std::string* why);

// Where load_cuda_module looks: $HPCTRAIN_CUDA_MODULE when set, else libhpctrain_cuda.so in the lib folder beside the
// program's bin folder (bin/../lib, in the build tree and the installed tree alike).
std::string cuda_module_path();

// Opens the module at `path` and checks that it is this build's (ABI number and version); nullptr with the reason in
// *why (the file missing; the loader's error, which names a CUDA library or symbol the module lacks; no entry point; a
// module of another build). Each call opens again; load_cuda_module keeps the one result a process uses.
const CudaModuleTable* open_cuda_module(const std::string& path, std::string* why);

// Whether the CUDA driver library (libcuda.so.1) can be opened; the reason in *why when not. Loads nothing else.
bool cuda_driver_present(std::string* why);

// One line for `hpctrain --version`: the module's path and libraries and the visible devices, or why it is unusable.
std::string cuda_module_summary();

}  // namespace hpctrain
