// A non-blocking, in-place sum all-reduce of one float range over point-to-point messages, summed in rank order.
//
// Each rank owns the r-th of `ranks` near-equal slices of the range (rank_slice, core/numbers.hpp). Reduce: every
// rank sends each peer that peer's slice and receives every peer's copy of its own slice, then sums the copies in rank
// order, ((x_0 + x_1) + x_2) + ..., into the range. Gather: every rank sends its summed slice to every peer and
// receives theirs in place. Each rank sends and receives (ranks - 1) / ranks of the range twice, as a ring all-reduce
// does, in one round per phase instead of ranks - 1.
//
// The slices travel in pieces of `piece_elements` (256 KiB by default). A peer's pieces of the reduce land in two
// staging buffers per peer, small enough to stay in the core's cache, and each piece is summed as soon as every peer's
// copy of it is in, then sent on as the gather's piece: the sum reads the copies from the cache instead of from memory
// (on one node the shared-memory transport's copy into the staging buffer and the sum's reads are then one pass over
// memory, not two), and the gather starts while the reduce still runs.
//
// Why not MPI_Iallreduce: Open MPI 4.1's libnbc runs every in-place MPI_Iallreduce as a binomial tree, which sends
// every byte through log2(ranks) rounds of one rank's reduction: the benchmark MLP's 25 MB took 11.8 ms on 2 ranks,
// 4.75 ms as a reduce-scatter and all-gather (docs/performance.md). And the sums no longer depend on which algorithm
// an MPI library picks: every element is the same rank-order sum under any MPI, at any size, on every rank.
//
// Progress: MPI moves the messages only inside MPI calls; test() advances the exchange as far as it can (sums the
// pieces that are in, posts the next receives) and is cheap when nothing arrived.
//
// Reduce-scatter: with Result::reduce_scatter the exchange ends after the reduce, each rank holding the sums of its own
// slice only (the rest of the range keeps this rank's own values). A sharded optimizer update runs on that slice, and
// the updated values are then gathered (GradientAllreduce::gather_owned). Slices can be whole multiples of a granule
// (rank_slice), so that each of the gradient norm's chunks has one owner.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace hpctrain {

// Sums `sources` element by element in the order given, ((s_0 + s_1) + s_2) + ..., into `out` (which may be one of
// the sources).
void sum_in_order(float* out, std::span<const float* const> sources, std::int64_t count);

class RankOrderAllreduce {
 public:
  static constexpr std::int64_t default_piece_elements = std::int64_t{1} << 16;  // 256 KiB of floats

  enum class Result : std::uint8_t { all_reduce, reduce_scatter };

  // `communicator` carries only this exchange's messages with tags `tag` and `tag` + 1; the caller keeps both alive.
  // A rank's slice of a range is whole `granule`s of elements (but the last rank's).
  RankOrderAllreduce(MPI_Comm communicator, int tag, std::int64_t piece_elements = default_piece_elements,
                     Result result = Result::all_reduce, std::int64_t granule = 1);
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
  // The slice [first, second) of a `count`-element range whose sums `rank` computes.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> slice(std::int64_t count, int rank) const;

 private:
  enum class Phase : std::uint8_t { idle, reduce, gather };
  [[nodiscard]] std::int64_t pieces(std::int64_t length) const { return (length + piece_ - 1) / piece_; }
  void receive_piece(std::int64_t piece);  // posts every peer's copy of this rank's piece into its staging buffer
  bool sum_arrived_pieces();               // true once every piece of this rank's slice is summed and sent on
  void post_gather();                      // the reduce's sends are done: receive the peers' sums into their slices
  void release_requests() noexcept;

  MPI_Comm communicator_;
  int tag_, rank_ = 0, ranks_ = 1;
  std::int64_t piece_;
  Result result_;
  std::int64_t granule_;
  Phase phase_ = Phase::idle;
  float* data_ = nullptr;
  std::int64_t count_ = 0;
  std::int64_t own_begin_ = 0, own_length_ = 0;  // this rank's slice
  std::int64_t stride_ = 0;                      // elements of a staging buffer: a piece, or the slice if shorter
  std::int64_t summed_pieces_ = 0;               // reduce phase: pieces of the slice summed and sent on
  std::vector<float> staging_;                   // (peers x 2 x piece): each peer's copies of the pieces in flight
  std::vector<const float*> sources_;            // (ranks) a piece's copies in rank order, for sum_in_order
  // Reduce: (peers x 2) the staging buffers' receives; gather: one per piece of every peer's slice.
  std::vector<MPI_Request> receives_;
  std::vector<MPI_Request> slice_sends_;  // the reduce's sends, one per piece of every peer's slice
  std::vector<MPI_Request> sum_sends_;    // the gather's sends, peers x pieces of this rank's slice (all_reduce)
};

}  // namespace hpctrain
