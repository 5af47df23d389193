// A non-blocking, in-place sum all-reduce of one float range over point-to-point messages, summed in rank order.
//
// Each rank owns the r-th of `ranks` near-equal slices of the range (rank_slice, core/numbers.hpp). Reduce: every rank
// sends each peer that peer's slice and receives every peer's copy of its own slice, then sums the copies of its slice
// in rank order,
// ((x_0 + x_1) + x_2) + ..., into the range. Gather: every rank sends its summed slice to every peer and receives
// theirs in place. Each rank sends and receives (ranks - 1) / ranks of the range twice, as a ring all-reduce does,
// in one round per phase instead of ranks - 1.
//
// Why not MPI_Iallreduce: Open MPI 4.1's libnbc runs every in-place MPI_Iallreduce as a binomial tree, which sends
// every byte through log2(ranks) rounds of one rank's reduction: the benchmark MLP's 25 MB took 11.8 ms on 2 ranks,
// 4.75 ms as a reduce-scatter and all-gather (docs/performance.md). And the sums no longer depend on which algorithm
// an MPI library picks: every element is the same rank-order sum under any MPI, at any size, on every rank.
//
// Progress: MPI moves the messages only inside MPI calls; test() advances the exchange as far as it can (it posts the
// gather once the reduce is summed and the reduce's sends are done) and is cheap when nothing arrived.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

namespace hpctrain {

// Sums `sources` element by element in the order given, ((s_0 + s_1) + s_2) + ..., into `out` (which may be one of
// the sources).
void sum_in_order(float* out, std::span<const float* const> sources, std::int64_t count);

class RankOrderAllreduce {
 public:
  // `communicator` carries only this exchange's messages with tag `tag` (and tag + 1); the caller keeps both alive.
  RankOrderAllreduce(MPI_Comm communicator, int tag);
  ~RankOrderAllreduce();  // an exchange still in flight (an error path) is cancelled where MPI allows
  RankOrderAllreduce(const RankOrderAllreduce&) = delete;
  RankOrderAllreduce& operator=(const RankOrderAllreduce&) = delete;
  RankOrderAllreduce(RankOrderAllreduce&& other) noexcept;
  RankOrderAllreduce& operator=(RankOrderAllreduce&&) = delete;

  // Starts summing data[0, count) over the communicator's ranks; every rank starts with the same count.
  void start(float* data, std::int64_t count);
  // Advances the exchange; true once it is complete (and the range holds the sums).
  bool test();
  void wait();
  [[nodiscard]] bool active() const { return phase_ != Phase::idle; }

 private:
  enum class Phase : std::uint8_t { idle, reduce, gather };
  void post_reduce();
  void sum_and_send();  // the reduce's receives are in: sum this rank's slice, send it to every peer
  void post_gather();   // the reduce's sends are done: receive the peers' sums into their slices
  void release_requests() noexcept;

  MPI_Comm communicator_;
  int tag_, rank_ = 0, ranks_ = 1;
  Phase phase_ = Phase::idle;
  float* data_ = nullptr;
  std::int64_t count_ = 0;
  bool summed_ = false;                // reduce phase: this rank's slice holds its sums, their sends are posted
  std::vector<float> received_;        // the peers' copies of this rank's slice, in peer order
  std::vector<const float*> sources_;  // (ranks) the copies in rank order, for sum_in_order
  // One per peer each (peer order: the ranks but this one): the phase's receives, the reduce's sends of the peers'
  // slices, the gather's sends of this rank's sums.
  std::vector<MPI_Request> receives_, slice_sends_, sum_sends_;
};

}  // namespace hpctrain
