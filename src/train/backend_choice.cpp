// run.device -> a backend. The ranks agree on the outcome, so either all of them use CUDA or none does, and a missing
// GPU on any rank is one clear error instead of a hang in the first collective.
#include "hpctrain/train/backend_choice.hpp"

#include <algorithm>
#include <string>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

bool ranks_share_a_device(const std::vector<DeviceUuid>& node_devices) {
  std::vector<DeviceUuid> sorted = node_devices;
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
}

namespace {

// The UUIDs of the devices every rank of this node drives, gathered over the node's communicator.
std::vector<DeviceUuid> node_devices(const MpiEnvironment& mpi, const DeviceUuid& mine) {
  MPI_Comm node = MPI_COMM_NULL;
  HPCTRAIN_MPI_CHECK(MPI_Comm_split_type(mpi.world(), MPI_COMM_TYPE_SHARED, mpi.rank(), MPI_INFO_NULL, &node));
  std::vector<DeviceUuid> devices(static_cast<std::size_t>(mpi.local_size()));
  const int status = MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UNSIGNED_CHAR, devices.data(),
                                   static_cast<int>(mine.size()), MPI_UNSIGNED_CHAR, node);
  MPI_Comm_free(&node);
  HPCTRAIN_MPI_CHECK(status);
  return devices;
}

}  // namespace

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
  // Ranks of a node spread over the GPUs they see: with one GPU per task from the launcher (CUDA_VISIBLE_DEVICES with
  // one entry) that is device 0 of each. Whether two ranks drive the same GPU is decided by the devices' UUIDs, not by
  // counting: `local ranks > visible devices` is true for every --gpus-per-task=1 job, whose ranks each have their own.
  choice.device = mpi.local_rank() % visible;
  choice.backend = make_cuda_backend(choice.device);
  choice.backend->allow_tf32(config.precision.tf32);
  choice.cuda = true;
  int shared = ranks_share_a_device(node_devices(mpi, choice.backend->device_uuid())) ? 1 : 0;
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, mpi.world()));
  choice.shared_device = shared != 0;
  return choice;
}

}  // namespace hpctrain
