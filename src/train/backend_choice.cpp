// run.device -> a backend. The ranks agree on the outcome, so either all of them use CUDA or none does, and a missing
// GPU (or CUDA library) on any rank is one clear error instead of a hang in the first collective.
//
// The CUDA backend is a module opened at run time (kernels/cuda_module.hpp). "auto" opens it only where the CUDA
// driver is installed, so on CPU nodes nothing of CUDA is loaded; "cuda" always tries, so that the error names what is
// missing (the module, a CUDA library, the driver, a device).
#include "hpctrain/train/backend_choice.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/cuda_module.hpp"

namespace hpctrain {

bool ranks_share_a_device(const std::vector<DeviceUuid>& node_devices) {
  std::vector<DeviceUuid> sorted = node_devices;
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
}

namespace {

// The UUIDs of the devices every rank of this node drives, gathered over the node's communicator.
std::vector<DeviceUuid> node_devices(const MpiEnvironment& mpi, const DeviceUuid& mine) {
  std::vector<DeviceUuid> devices(static_cast<std::size_t>(mpi.local_size()));
  HPCTRAIN_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UNSIGNED_CHAR, devices.data(),
                                   static_cast<int>(mine.size()), MPI_UNSIGNED_CHAR, mpi.node()));
  return devices;
}

// Why this rank cannot run CUDA, as one rank tells every other (MPI_Bcast of plain bytes).
struct CudaUnavailable {
  enum Kind : int { usable = 0, no_backend = 1, no_device = 2 };
  int kind = usable;
  char why[1000] = {};

  void set(Kind k, const std::string& text) {
    kind = k;
    std::strncpy(why, text.c_str(), sizeof why - 1);
  }
};

// The visible devices, 0 with the reason in *state. Without `open_without_driver` the module is opened only where the
// driver library is installed.
int usable_devices(bool open_without_driver, CudaUnavailable* state) {
  std::string why;
  if (!open_without_driver && !cuda_driver_present(&why)) {
    state->set(CudaUnavailable::no_device, why);
    return 0;
  }
  const CudaModuleTable* module = load_cuda_module(&why);
  if (module == nullptr) {
    state->set(CudaUnavailable::no_backend, why);
    return 0;
  }
  const int devices = module->device_count();
  if (devices == 0) {
    std::string driver;
    state->set(CudaUnavailable::no_device, cuda_driver_present(&driver)
                                               ? "the driver reports none: check nvidia-smi and CUDA_VISIBLE_DEVICES"
                                               : driver);
  }
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
  CudaUnavailable state;
  const int visible = usable_devices(device == Device::cuda, &state);
  int ranks_without = visible == 0 ? 1 : 0;
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ranks_without, 1, MPI_INT, MPI_SUM, mpi.world()));
  if (ranks_without > 0) {
    // The first rank without CUDA tells the others why, so that rank 0 prints the reason whichever rank it was.
    int first_without = visible == 0 ? mpi.rank() : mpi.size();
    HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_without, 1, MPI_INT, MPI_MIN, mpi.world()));
    HPCTRAIN_MPI_CHECK(MPI_Bcast(&state, sizeof state, MPI_BYTE, first_without, mpi.world()));
    const bool everywhere = ranks_without == mpi.size();
    const std::string why = (everywhere ? std::string() : "rank " + std::to_string(first_without) + ": ") + state.why;
    if (device == Device::automatic) {
      choice.backend = make_cpu_backend();
      choice.fallback = why;
      choice.note = "run.device = \"auto\": training on the CPU (" + why + ")";
      return choice;
    }
    const std::string where = config.where("run.device") + ": run.device = \"cuda\" but ";
    const std::string ranks =
        everywhere ? std::string() : std::to_string(ranks_without) + " of the " + std::to_string(mpi.size()) + " ranks";
    if (state.kind == CudaUnavailable::no_backend)
      throw InputError(
          where + "the CUDA backend cannot be loaded" + (everywhere ? "" : " on " + ranks) + " (" + why + ")",
          "on a GPU node, install what it names or put the CUDA libraries' folder on LD_LIBRARY_PATH "
          "(e.g. module load cuda); elsewhere use run.device = \"auto\" to fall back to the CPU");
    throw InputError(
        where + (everywhere ? "no rank sees a CUDA device" : ranks + " see no CUDA device") + " (" + why + ")",
        "check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES and the job's GPU request, or use "
        "run.device = \"auto\" to fall back to the CPU");
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
