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

RankOrderAllreduce::RankOrderAllreduce(MPI_Comm communicator, int tag) : communicator_(communicator), tag_(tag) {
  HPCTRAIN_MPI_CHECK(MPI_Comm_rank(communicator, &rank_));
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(communicator, &ranks_));
  const auto peers = static_cast<std::size_t>(ranks_ - 1);
  sources_.resize(static_cast<std::size_t>(ranks_));
  receives_.assign(peers, MPI_REQUEST_NULL);
  slice_sends_.assign(peers, MPI_REQUEST_NULL);
  sum_sends_.assign(peers, MPI_REQUEST_NULL);
}

RankOrderAllreduce::RankOrderAllreduce(RankOrderAllreduce&& other) noexcept
    : communicator_(other.communicator_),
      tag_(other.tag_),
      rank_(other.rank_),
      ranks_(other.ranks_),
      phase_(std::exchange(other.phase_, Phase::idle)),
      data_(other.data_),
      count_(other.count_),
      summed_(other.summed_),
      received_(std::move(other.received_)),
      sources_(std::move(other.sources_)),
      receives_(std::move(other.receives_)),
      slice_sends_(std::move(other.slice_sends_)),
      sum_sends_(std::move(other.sum_sends_)) {}

RankOrderAllreduce::~RankOrderAllreduce() { release_requests(); }

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
  std::int64_t longest = 0;
  for (int rank = 0; rank < ranks_; ++rank) {
    const auto [begin, end] = rank_slice(count, ranks_, rank);
    longest = std::max(longest, end - begin);
  }
  HPCTRAIN_VERIFY(longest <= INT_MAX, NotSupported,
                  "an all-reduce of " << count << " floats over " << ranks_
                                      << " ranks (a slice of over 2^31 elements: a single layer that large)");
  post_reduce();
}

void RankOrderAllreduce::post_reduce() {
  const auto [own_begin, own_end] = rank_slice(count_, ranks_, rank_);
  const std::int64_t length = own_end - own_begin;
  received_.resize(static_cast<std::size_t>(length * (ranks_ - 1)));  // grows once: same buckets every step
  // Receives first, so a peer's send finds its match at once.
  for (int peer = 0, slot = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    HPCTRAIN_MPI_CHECK(MPI_Irecv(received_.data() + slot * length, static_cast<int>(length), MPI_FLOAT, peer, tag_,
                                 communicator_, &receives_[static_cast<std::size_t>(slot)]));
    ++slot;
  }
  for (int peer = 0, slot = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    const auto [their_begin, their_end] = rank_slice(count_, ranks_, peer);
    HPCTRAIN_MPI_CHECK(MPI_Isend(data_ + their_begin, static_cast<int>(their_end - their_begin), MPI_FLOAT, peer, tag_,
                                 communicator_, &slice_sends_[static_cast<std::size_t>(slot)]));
    ++slot;
  }
  summed_ = false;
  phase_ = Phase::reduce;
}

void RankOrderAllreduce::sum_and_send() {
  const auto [own_begin, own_end] = rank_slice(count_, ranks_, rank_);
  const std::int64_t length = own_end - own_begin;
  for (int source = 0, slot = 0; source < ranks_; ++source)
    sources_[static_cast<std::size_t>(source)] =
        source == rank_ ? data_ + own_begin : received_.data() + (slot++) * length;
  sum_in_order(data_ + own_begin, sources_, length);
  // This rank's sums go out now: the reduce's sends still in flight read the other slices only.
  for (int peer = 0, slot = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    HPCTRAIN_MPI_CHECK(MPI_Isend(data_ + own_begin, static_cast<int>(length), MPI_FLOAT, peer, tag_ + 1, communicator_,
                                 &sum_sends_[static_cast<std::size_t>(slot)]));
    ++slot;
  }
  summed_ = true;
}

void RankOrderAllreduce::post_gather() {
  for (int peer = 0, slot = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    const auto [their_begin, their_end] = rank_slice(count_, ranks_, peer);
    HPCTRAIN_MPI_CHECK(MPI_Irecv(data_ + their_begin, static_cast<int>(their_end - their_begin), MPI_FLOAT, peer,
                                 tag_ + 1, communicator_, &receives_[static_cast<std::size_t>(slot)]));
    ++slot;
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
    if (!summed_) {
      if (!all_done(receives_)) return false;
      sum_and_send();
    }
    // The gather receives into the slices the reduce's sends read: only once those are done.
    if (!all_done(slice_sends_)) return false;
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
