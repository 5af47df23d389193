// The rank-order all-reduce: a reduce-scatter and an all-gather in point-to-point messages, one round each.
#include "hpctrain/dist/rank_order_allreduce.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"

namespace hpctrain {

void sum_in_order(float* out, std::span<const float* const> sources, std::int64_t count) {
  if (sources.empty()) return;
  if (sources.size() == 2) {  // each element is read before it is written: no staging needed
    const float* a = sources[0];
    const float* b = sources[1];
    for (std::int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
    return;
  }
  // out may be any of the sources: sum a block into a staging buffer before it overwrites one.
  constexpr std::int64_t block = 1024;
  alignas(64) float sums[block];
  for (std::int64_t first = 0; first < count; first += block) {
    const std::int64_t n = std::min(block, count - first);
    const float* source = sources[0] + first;
    for (std::int64_t i = 0; i < n; ++i) sums[i] = source[i];
    for (std::size_t k = 1; k < sources.size(); ++k) {
      source = sources[k] + first;
      for (std::int64_t i = 0; i < n; ++i) sums[i] += source[i];
    }
    std::memcpy(out + first, sums, static_cast<std::size_t>(n) * sizeof(float));
  }
}

RankOrderAllreduce::RankOrderAllreduce(MPI_Comm communicator, int tag, std::int64_t piece_elements, Result result,
                                       std::int64_t granule)
    : communicator_(communicator), tag_(tag), piece_(piece_elements), result_(result), granule_(granule) {
  HPCTRAIN_ASSERT(piece_elements > 0 && piece_elements <= INT_MAX, "a piece of " << piece_elements << " elements");
  HPCTRAIN_ASSERT(granule > 0, "a granule of " << granule << " elements");
  HPCTRAIN_MPI_CHECK(MPI_Comm_rank(communicator, &rank_));
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(communicator, &ranks_));
  sources_.resize(static_cast<std::size_t>(ranks_));
}

RankOrderAllreduce::RankOrderAllreduce(RankOrderAllreduce&& other) noexcept
    : communicator_(other.communicator_),
      tag_(other.tag_),
      rank_(other.rank_),
      ranks_(other.ranks_),
      piece_(other.piece_),
      result_(other.result_),
      granule_(other.granule_),
      phase_(std::exchange(other.phase_, Phase::idle)),
      data_(other.data_),
      count_(other.count_),
      own_begin_(other.own_begin_),
      own_length_(other.own_length_),
      stride_(other.stride_),
      summed_pieces_(other.summed_pieces_),
      staging_(std::move(other.staging_)),
      sources_(std::move(other.sources_)),
      receives_(std::move(other.receives_)),
      slice_sends_(std::move(other.slice_sends_)),
      sum_sends_(std::move(other.sum_sends_)) {}

RankOrderAllreduce::~RankOrderAllreduce() { release_requests(); }

std::pair<std::int64_t, std::int64_t> RankOrderAllreduce::slice(std::int64_t count, int rank) const {
  return rank_slice(count, ranks_, rank, granule_);
}

void RankOrderAllreduce::release_requests() noexcept {
  // Only on an error path (an exception during backward): receives are cancelled, so nothing writes into the range
  // after this; sends are let go (MPI_Abort ends the job on that path; waiting for a peer could hang it).
  for (MPI_Request& request : receives_)
    if (request != MPI_REQUEST_NULL) {
      MPI_Cancel(&request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
  for (auto* sends : {&slice_sends_, &sum_sends_})
    for (MPI_Request& request : *sends)
      if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  phase_ = Phase::idle;
}

void RankOrderAllreduce::start(float* data, std::int64_t count) {
  HPCTRAIN_ASSERT(phase_ == Phase::idle, "a rank-order all-reduce started while one is in flight");
  data_ = data;
  count_ = count;
  if (ranks_ == 1 || count == 0) return;
  const auto [own_begin, own_end] = slice(count, rank_);
  own_begin_ = own_begin;
  own_length_ = own_end - own_begin;
  stride_ = std::min(piece_, own_length_);
  const auto peers = static_cast<std::size_t>(ranks_ - 1);
  std::size_t peer_pieces = 0;  // pieces of all the peers' slices
  for (int peer = 0; peer < ranks_; ++peer) {
    const auto [begin, end] = slice(count, peer);
    if (peer != rank_) peer_pieces += static_cast<std::size_t>(pieces(end - begin));
  }
  // The same sizes every step: these allocate in the first step only.
  staging_.resize(peers * 2 * static_cast<std::size_t>(stride_));
  receives_.assign(std::max(peers * 2, peer_pieces), MPI_REQUEST_NULL);
  slice_sends_.assign(peer_pieces, MPI_REQUEST_NULL);
  const bool gathers = result_ == Result::all_reduce;
  sum_sends_.assign(gathers ? peers * static_cast<std::size_t>(pieces(own_length_)) : 0, MPI_REQUEST_NULL);

  // Receives first, so a peer's sends find their match at once.
  summed_pieces_ = 0;
  for (std::int64_t piece = 0; piece < std::min<std::int64_t>(2, pieces(own_length_)); ++piece) receive_piece(piece);
  std::size_t next = 0;
  for (int peer = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    const auto [begin, end] = slice(count, peer);
    for (std::int64_t first = begin; first < end; first += piece_)
      HPCTRAIN_MPI_CHECK(MPI_Isend(data_ + first, static_cast<int>(std::min(piece_, end - first)), MPI_FLOAT, peer,
                                   tag_, communicator_, &slice_sends_[next++]));
  }
  phase_ = Phase::reduce;
}

void RankOrderAllreduce::receive_piece(std::int64_t piece) {
  const std::int64_t slot = piece % 2;
  const auto length = static_cast<int>(std::min(piece_, own_length_ - piece * piece_));
  for (int peer = 0, index = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    const std::int64_t buffer = index * 2 + slot;
    HPCTRAIN_MPI_CHECK(MPI_Irecv(staging_.data() + buffer * stride_, length, MPI_FLOAT, peer, tag_, communicator_,
                                 &receives_[static_cast<std::size_t>(buffer)]));
    ++index;
  }
}

bool RankOrderAllreduce::sum_arrived_pieces() {
  const std::int64_t total = pieces(own_length_);
  while (summed_pieces_ < total) {
    const std::int64_t piece = summed_pieces_, slot = piece % 2;
    for (int index = 0; index < ranks_ - 1; ++index) {
      int done = 0;
      HPCTRAIN_MPI_CHECK(MPI_Test(&receives_[static_cast<std::size_t>(index * 2 + slot)], &done, MPI_STATUS_IGNORE));
      if (done == 0) return false;
    }
    const std::int64_t first = own_begin_ + piece * piece_, length = std::min(piece_, own_length_ - piece * piece_);
    for (int source = 0, index = 0; source < ranks_; ++source)
      sources_[static_cast<std::size_t>(source)] =
          source == rank_ ? data_ + first : staging_.data() + ((index++) * 2 + slot) * stride_;
    sum_in_order(data_ + first, sources_, length);
    // The piece's sums go to every peer at once: the gather overlaps the rest of the reduce.
    for (int peer = 0, index = 0; peer < ranks_ && result_ == Result::all_reduce; ++peer) {
      if (peer == rank_) continue;
      HPCTRAIN_MPI_CHECK(MPI_Isend(data_ + first, static_cast<int>(length), MPI_FLOAT, peer, tag_ + 1, communicator_,
                                   &sum_sends_[static_cast<std::size_t>(index * total + piece)]));
      ++index;
    }
    ++summed_pieces_;
    if (piece + 2 < total) receive_piece(piece + 2);  // into the staging buffers just summed
  }
  return true;
}

void RankOrderAllreduce::post_gather() {
  std::size_t next = 0;
  for (int peer = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    const auto [begin, end] = slice(count_, peer);
    for (std::int64_t first = begin; first < end; first += piece_)
      HPCTRAIN_MPI_CHECK(MPI_Irecv(data_ + first, static_cast<int>(std::min(piece_, end - first)), MPI_FLOAT, peer,
                                   tag_ + 1, communicator_, &receives_[next++]));
  }
  phase_ = Phase::gather;
}

bool RankOrderAllreduce::test() {
  const auto all_done = [](std::vector<MPI_Request>& requests) {
    int done = 0;
    HPCTRAIN_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
    return done != 0;
  };
  if (phase_ == Phase::reduce) {
    if (!sum_arrived_pieces()) return false;
    // The gather receives into the slices the reduce's sends read: only once those are done.
    if (!all_done(slice_sends_)) return false;
    if (result_ == Result::reduce_scatter) {
      phase_ = Phase::idle;
      return true;
    }
    post_gather();
  }
  if (phase_ == Phase::gather) {
    if (!all_done(receives_) || !all_done(sum_sends_)) return false;
    phase_ = Phase::idle;
  }
  return true;
}

void RankOrderAllreduce::wait() {
  while (!test()) {
  }
}

}  // namespace hpctrain
