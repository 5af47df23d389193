// MPI start-up, node-local ranks, and ending every rank on error.
#include "hpctrain/dist/mpi_environment.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int provided = 0;
  HPCTRAIN_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  // Errors come back as codes so the check macros can report them with file and line.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  HPCTRAIN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  MPI_Comm node = MPI_COMM_NULL;
  HPCTRAIN_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  HPCTRAIN_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(node, &local_size_));
  MPI_Comm_free(&node);
}

MpiEnvironment::~MpiEnvironment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string rank_prefix(int rank, int size) { return size > 1 ? "[rank " + std::to_string(rank) + "] " : ""; }

void MpiEnvironment::abort_on(const Error& error) const {
  const bool print_here = error.scope() == ErrorScope::this_rank || rank_ == 0;
  if (!print_here) {
    // Every rank saw the same error: give rank 0 time to print it and end the job. If rank 0 never does (it should),
    // print it here after all, so the job never ends without a message.
    std::this_thread::sleep_for(std::chrono::seconds(20));
  }
  const std::string prefix = error.scope() == ErrorScope::this_rank ? rank_prefix(rank_, size_) : "";
  std::fprintf(stderr, "%shpctrain: error: %s\n", prefix.c_str(), error.what());
  if (!error.hint().empty()) std::fprintf(stderr, "%s  hint: %s\n", prefix.c_str(), error.hint().c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (size_ == 1) {
    MPI_Finalize();
    std::_Exit(error.exit_code());
  }
  MPI_Abort(MPI_COMM_WORLD, error.exit_code());
  std::_Exit(error.exit_code());
}

void MpiEnvironment::abort_on(const std::string& message, int exit_code) const {
  abort_on(Error(message, ErrorScope::this_rank, {}, exit_code));
}

}  // namespace hpctrain

namespace hpctrain {

void run_on_root(const MpiEnvironment& mpi, const std::function<void()>& action) {
  std::string message, hint;
  int exit_code = 0;
  if (mpi.is_root()) {
    try {
      action();
    } catch (const Error& error) {
      message = error.what();
      hint = error.hint();
      exit_code = error.exit_code();
    }
  }
  int lengths[3] = {static_cast<int>(message.size()), static_cast<int>(hint.size()), exit_code};
  HPCTRAIN_MPI_CHECK(MPI_Bcast(lengths, 3, MPI_INT, 0, mpi.world()));
  if (lengths[2] == 0) return;
  message.resize(static_cast<std::size_t>(lengths[0]));
  hint.resize(static_cast<std::size_t>(lengths[1]));
  HPCTRAIN_MPI_CHECK(MPI_Bcast(message.data(), lengths[0], MPI_CHAR, 0, mpi.world()));
  HPCTRAIN_MPI_CHECK(MPI_Bcast(hint.data(), lengths[1], MPI_CHAR, 0, mpi.world()));
  throw Error(message, ErrorScope::all_ranks, hint, lengths[2]);
}

}  // namespace hpctrain
