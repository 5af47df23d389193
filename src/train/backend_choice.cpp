// run.device -> a backend. The ranks agree on the outcome, so either all of them use CUDA or none does, and a missing
// GPU on any rank is one clear error instead of a hang in the first collective.
#include "hpctrain/train/backend_choice.hpp"

#include <string>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

BackendChoice choose_backend(const RunConfig& config, const MpiEnvironment& mpi) {
  BackendChoice choice;
  const Device device = config.run.device;
  if (device == Device::cpu) {
    choice.backend = make_cpu_backend();
    return choice;
  }
  const int visible = cuda_device_count();  // 0 in CPU-only builds
  int ranks_without = visible == 0 ? 1 : 0;
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ranks_without, 1, MPI_INT, MPI_SUM, mpi.world()));
  if (ranks_without > 0) {
    if (device == Device::automatic) {
      choice.backend = make_cpu_backend();
      return choice;
    }
#if !defined(HPCTRAIN_HAVE_CUDA)
    throw NotSupported(config.where("run.device") +
                       ": run.device = \"cuda\": this build has no CUDA backend; rebuild with -DHPCTRAIN_CUDA=ON");
#else
    throw InputError(config.where("run.device") + ": run.device = \"cuda\" but " +
                         (ranks_without == mpi.size() ? std::string("no rank sees")
                                                      : std::to_string(ranks_without) + " of the " +
                                                            std::to_string(mpi.size()) + " ranks see") +
                         " a CUDA device",
                     "check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES and the job's GPU request, or use "
                     "run.device = \"auto\" to fall back to the CPU");
#endif
  }
  // One GPU per rank on a node; several ranks share a GPU when there are more ranks than GPUs. Launchers that give
  // each task its own GPU (CUDA_VISIBLE_DEVICES with one entry) make this device 0.
  choice.device = mpi.local_rank() % visible;
  int shared = mpi.local_size() > visible ? 1 : 0;
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, mpi.world()));
  choice.shared_device = shared != 0;
  choice.backend = make_cuda_backend(choice.device);
  choice.cuda = true;
  return choice;
}

}  // namespace hpctrain
