// Which backend a run computes on (run.device) and, for CUDA, which GPU this rank drives.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  bool cuda = false;
  int device = -1;             // the CUDA device index among the visible ones
  bool shared_device = false;  // two ranks of some node drive the same GPU (then NCCL cannot be used)
  std::string fallback;        // why "auto" chose the CPU (empty otherwise)
  std::string note;            // for the log's head: run.device = "auto": training on the CPU (fallback)
};

// Whether two ranks of a node drive the same GPU, from the UUIDs of the devices the node's ranks chose (NCCL refuses
// such a communicator, so gradients then go through host memory).
bool ranks_share_a_device(const std::vector<DeviceUuid>& node_devices);

// "cpu": the CPU backend. "cuda": the CUDA backend on GPU (node-local rank modulo visible devices, precision.tf32
// applied); every rank must see a GPU, otherwise every rank stops with one message naming what is missing (the CUDA
// module or a library it needs, the driver, a device). "auto": CUDA when every rank sees a GPU (and can load the CUDA
// module), the CPU otherwise, with a note saying why. Collective over the world communicator for "cuda" and "auto".
BackendChoice choose_backend(const RunConfig& config, const MpiEnvironment& mpi);

}  // namespace hpctrain
