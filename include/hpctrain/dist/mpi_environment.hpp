// The MPI world of one hpctrain process: initialisation, ranks, the node-local rank (for device choice and threads),
// and the one place where an error ends every rank.
#pragma once

#include <mpi.h>

#include <functional>
#include <optional>
#include <string>

namespace hpctrain {

class Error;

class MpiEnvironment {
 public:
  // MPI_Init_thread asking for MPI_THREAD_SERIALIZED (the gradient all-reduce's progress thread); FUNNELED is enough.
  MpiEnvironment(int* argc, char*** argv);
  ~MpiEnvironment();  // MPI_Finalize unless aborted
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] int local_rank() const { return local_rank_; }  // rank among the ranks on this node
  [[nodiscard]] int local_size() const { return local_size_; }
  // The ranks of this node (MPI_COMM_TYPE_SHARED), by world rank.
  [[nodiscard]] MPI_Comm node() const { return node_; }
  // This node's place among the nodes (ordered by their lowest world rank), and how many there are.
  [[nodiscard]] int node_index() const { return node_index_; }
  [[nodiscard]] int node_count() const { return node_count_; }
  // Whether every node runs the same number of ranks.
  [[nodiscard]] bool uniform_nodes() const { return uniform_nodes_; }
  [[nodiscard]] bool is_root() const { return rank_ == 0; }
  [[nodiscard]] MPI_Comm world() const { return MPI_COMM_WORLD; }
  // Whether MPI provides MPI_THREAD_SERIALIZED (calls from several threads, one at a time).
  [[nodiscard]] bool serialized() const { return serialized_; }

  // Print the error once (by the rank that saw it; by rank 0 alone when every rank sees it) and end every rank.
  [[noreturn]] void abort_on(const Error& error) const;
  // The same for an unexpected exception.
  [[noreturn]] void abort_on(const std::string& message, int exit_code) const;

 private:
  void find_nodes();  // the node communicator, local rank and node numbering (collective)

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, node_index_ = 0, node_count_ = 1;
  bool uniform_nodes_ = true;
  MPI_Comm node_ = MPI_COMM_NULL;
  bool serialized_ = false;
};

// "[rank 3] " in multi-rank runs, "" otherwise.
std::string rank_prefix(int rank, int size);

// Rank 0's value of `text` on every rank (collective).
void broadcast_string(const MpiEnvironment& mpi, std::string& text);

// Run `action` on rank 0 only (creating a directory, writing a file); if it throws, every rank throws the same error,
// so rank 0 alone prints it and no rank waits forever for the others.
void run_on_root(const MpiEnvironment& mpi, const std::function<void()>& action);

// The outcome of a collective step that may fail on some ranks only (a write that fills the disk).
struct AgreedFailure {
  int failure = 0;  // the largest failure code of any rank (0: every rank succeeded)
  int rank = 0;     // the lowest rank that reported it
};

// Agree on `failure`, this rank's failure code (0: none; larger codes say more), through a non-blocking all-reduce
// polled so that a failed rank cannot hang: another rank may be stuck in a collective call this rank left, so a rank
// whose failure is non-zero waits at most `seconds` and then gets nullopt (the caller ends the job from this rank). A
// rank that did not fail waits for the others as long as they take. Collective.
std::optional<AgreedFailure> agree_on_failure(const MpiEnvironment& mpi, int failure, double seconds);
}  // namespace hpctrain
