// Threads per rank and the start-up warnings about cores and GPUs.
#include "hpctrain/train/rank_resources.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <thread>

#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

namespace {

// Cores in this process's affinity mask (what the launcher or taskset allows), or the machine's when unknown.
int cores_in_affinity_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

}  // namespace

int choose_thread_count(const RunConfig& config, const MpiEnvironment& mpi) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return omp_get_max_threads();
  if (config.run.threads > 0) return static_cast<int>(config.run.threads);
  const int allowed = cores_in_affinity_mask();
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  if (allowed < hardware) return std::max(1, allowed);  // the launcher bound this rank to its own cores
  return std::max(1, allowed / mpi.local_size());
}

std::vector<std::string> rank_resource_warnings(const RunConfig& config, const MpiEnvironment& mpi, int threads,
                                                bool on_cuda) {
  std::vector<std::string> warnings;
  // Slurm >= 22.05: srun no longer takes --cpus-per-task from sbatch, so each rank may get one core for its threads.
  const int cores = cores_in_affinity_mask();
  int first_short = threads > cores ? mpi.rank() : INT_MAX, short_ranks = threads > cores ? 1 : 0;
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_short, 1, MPI_INT, MPI_MIN, mpi.world()));
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &short_ranks, 1, MPI_INT, MPI_SUM, mpi.world()));
  if (short_ranks > 0) {
    int counts[2] = {threads, cores};  // of the first short rank
    HPCTRAIN_MPI_CHECK(MPI_Bcast(counts, 2, MPI_INT, first_short, mpi.world()));
    warnings.push_back(
        "warning: rank " + std::to_string(first_short) + " runs " + std::to_string(counts[0]) + " threads on " +
        std::to_string(counts[1]) + (counts[1] == 1 ? " core" : " cores") + " (its CPU affinity)" +
        (short_ranks > 1 ? ", and " + std::to_string(short_ranks - 1) + " more ranks are short of cores" : "") +
        ": threads that share a core make training many times slower. Give each rank as many cores as threads "
        "(srun --cpus-per-task, mpiexec --bind-to none or --map-by ...:PE=N; see docs/jobscripts.md) or lower "
        "OMP_NUM_THREADS");
  }
  // Rank 0's node stands for the others: one device count (0 without a driver, and in builds without CUDA).
  if (!on_cuda && config.run.device == Device::cpu && mpi.is_root()) {
    const int devices = cuda_device_count();
    if (devices > 0)
      warnings.push_back("warning: " + std::to_string(devices) + " CUDA device" + (devices > 1 ? "s are" : " is") +
                         " visible but run.device = \"cpu\" (the default): set run.device = \"cuda\" (or --set "
                         "run.device=cuda) to train on them, or submit without a GPU request");
  }
  return warnings;
}

}  // namespace hpctrain
