// What each rank runs on: its thread count, and start-up warnings when the job gives the ranks fewer cores than
// threads (threads then share cores, many times slower) or GPUs that a CPU run leaves idle.
#pragma once

#include <string>
#include <vector>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

// Threads per rank: OMP_NUM_THREADS if set, else run.threads, else the cores this rank may use divided among the ranks
// of its node (a launcher that binds each rank already gives it its own cores).
int choose_thread_count(const RunConfig& config, const MpiEnvironment& mpi);

// Warnings for rank 0's log, agreed over the ranks (collective): a rank with more threads than cores in its CPU
// affinity mask (named, with how many ranks are short); CUDA devices visible while the run computes on the CPU.
std::vector<std::string> rank_resource_warnings(const RunConfig& config, const MpiEnvironment& mpi, int threads,
                                                bool on_cuda);

}  // namespace hpctrain
