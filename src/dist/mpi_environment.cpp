// MPI start-up, node-local ranks, and ending every rank on error.
#include "hpctrain/dist/mpi_environment.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int provided = 0;
  HPCTRAIN_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  // Errors come back as codes so the check macros can report them with file and line.
  serialized_ = provided >= MPI_THREAD_SERIALIZED;
  HPCTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  HPCTRAIN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  find_nodes();
  // OpenMP threads and the batch loader's thread run beside the one thread that calls MPI: an MPI that promises less
  // (MPI_THREAD_SINGLE) may break in ways nobody could trace back to this. Every rank gets the same library's answer.
  if (provided < MPI_THREAD_FUNNELED)
    abort_on(Error("the MPI library provides thread support level " + std::to_string(provided) +
                       " (MPI_THREAD_SINGLE), but hpctrain needs MPI_THREAD_FUNNELED: its OpenMP and data-loading "
                       "threads run beside the thread that calls MPI",
                   ErrorScope::all_ranks,
                   "use an MPI built with thread support (Open MPI's, MPICH's and the vendors' default builds are); "
                   "check MPI settings that lower it (e.g. MPICH_MAX_THREAD_SAFETY=single)",
                   exit_runtime_error));
}

MpiEnvironment::~MpiEnvironment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  MPI_Finalize();
}

void MpiEnvironment::find_nodes() {
  MPI_Comm shared = MPI_COMM_NULL;
  HPCTRAIN_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared));
  // HPCTRAIN_NODE_ID (tests): ranks that see different values count as ranks of different nodes, so that one machine
  // runs the code paths of several (as NCCL_HOSTID does for NCCL).
  const char* id = std::getenv("HPCTRAIN_NODE_ID");
  const int color = id == nullptr ? 0 : static_cast<int>(std::hash<std::string>{}(id)&0x7fffffff);
  HPCTRAIN_MPI_CHECK(MPI_Comm_split(shared, color, rank_, &node_));
  HPCTRAIN_MPI_CHECK(MPI_Comm_free(&shared));
  HPCTRAIN_MPI_CHECK(MPI_Comm_rank(node_, &local_rank_));
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(node_, &local_size_));
  // Nodes are numbered in the order of their first ranks: the first ranks form a communicator ordered by world rank.
  MPI_Comm leaders = MPI_COMM_NULL;
  HPCTRAIN_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, local_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders));
  int numbering[2] = {0, 1};  // node index, node count
  if (leaders != MPI_COMM_NULL) {
    HPCTRAIN_MPI_CHECK(MPI_Comm_rank(leaders, &numbering[0]));
    HPCTRAIN_MPI_CHECK(MPI_Comm_size(leaders, &numbering[1]));
    HPCTRAIN_MPI_CHECK(MPI_Comm_free(&leaders));
  }
  HPCTRAIN_MPI_CHECK(MPI_Bcast(numbering, 2, MPI_INT, 0, node_));
  node_index_ = numbering[0];
  node_count_ = numbering[1];
  int sizes[2] = {local_size_, -local_size_};  // the largest node's rank count and the smallest's, negated
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  uniform_nodes_ = sizes[0] == -sizes[1];
}

std::string rank_prefix(int rank, int size) { return size > 1 ? "[rank " + std::to_string(rank) + "] " : ""; }

namespace {

// Polls a non-blocking collective until it completes (true) or `seconds` have passed (false; negative: no limit).
bool completes_within(MPI_Request& request, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  // Pauses between tests grow from a yield to 2 ms: an agreement among ranks that arrive together (every step of a
  // checkpoint write) completes within microseconds, while a long wait does not keep a core busy. They grow by a
  // quarter at a time, so a wait overshoots its end by at most about a quarter of its length (doubling pauses let
  // the 20 agreements of a 2-rank 10 MB checkpoint write take a third of it).
  std::chrono::microseconds pause(0);
  while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
    if (seconds >= 0 && std::chrono::steady_clock::now() > deadline) return false;
    if (pause.count() == 0)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(pause);
    pause = std::min(pause + pause / 4 + std::chrono::microseconds(10), std::chrono::microseconds(2000));
  }
  return done != 0;
}

// Whether every rank reaches this point within `seconds` (a non-blocking barrier, polled). Used on the error path to
// tell an error every rank saw (all end cleanly) from one only some saw (the others must be aborted).
bool all_ranks_arrive(double seconds) {
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &request) != MPI_SUCCESS) return false;
  return completes_within(request, seconds);
}

}  // namespace

void MpiEnvironment::abort_on(const Error& error) const {
  const bool everyone = error.scope() == ErrorScope::all_ranks;
  // An error every rank saw (deck, data decided collectively): rank 0 prints it once and the ranks end together with
  // MPI_Finalize and the exit code, so the launcher prints no abort banner. If some rank never arrives (it did not
  // see the error after all), rank 0 prints anyway and the job is aborted.
  const bool together = everyone && size_ > 1 && all_ranks_arrive(30.0);
  // Without agreement every rank prints: rank 0 may be the one that did not see it.
  const bool print_here = !everyone || rank_ == 0 || !together;
  const std::string prefix = everyone ? "" : rank_prefix(rank_, size_);
  if (print_here) {
    const std::string text = prefix + "hpctrain: error: " + error.what() + "\n" +
                             (error.hint().empty() ? "" : prefix + "  hint: " + error.hint() + "\n");
    std::fputs(text.c_str(), stderr);
    append_to_error_log(text);
  }
  std::fflush(stderr);
  std::fflush(stdout);
  if ((size_ == 1 || together) && shutdown_is_safe()) {
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

void broadcast_string(const MpiEnvironment& mpi, std::string& text) {
  auto length = static_cast<long long>(text.size());
  HPCTRAIN_MPI_CHECK(MPI_Bcast(&length, 1, MPI_LONG_LONG, 0, mpi.world()));
  text.resize(static_cast<std::size_t>(length));
  HPCTRAIN_MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, 0, mpi.world()));
}

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

std::optional<AgreedFailure> agree_on_failure(const MpiEnvironment& mpi, int failure, double seconds) {
  // One maximum carries both: the code in the high half, the rank counted down in the low half (lowest rank wins).
  constexpr long long rank_span = 1LL << 32;
  long long mine = failure * rank_span + (rank_span - 1 - mpi.rank()), agreed = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  HPCTRAIN_MPI_CHECK(MPI_Iallreduce(&mine, &agreed, 1, MPI_LONG_LONG, MPI_MAX, mpi.world(), &request));
  if (!completes_within(request, failure != 0 ? seconds : -1.0)) return std::nullopt;
  return AgreedFailure{static_cast<int>(agreed / rank_span), static_cast<int>(rank_span - 1 - agreed % rank_span)};
}

}  // namespace hpctrain
