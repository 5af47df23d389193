// Bucketed gradient all-reduce over MPI (rank-order exchange or MPI_Iallreduce), the bucket layout shared with the NCCL
// version, and the NCCL version's entry in the CUDA module.
#include "hpctrain/dist/gradient_allreduce.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <utility>

#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/part_exchange.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/kernels/cuda_module.hpp"

namespace hpctrain {

std::vector<GradientBucket> gradient_buckets(std::int64_t count, const std::vector<std::int64_t>& layer_begins,
                                             std::int64_t bucket_bytes) {
  // Walk layer boundaries from the end; close a bucket once it holds at least bucket_bytes.
  const std::int64_t bucket_elements =
      std::max<std::int64_t>(bucket_bytes / static_cast<std::int64_t>(sizeof(float)), 1);
  std::vector<std::int64_t> boundaries(layer_begins.begin(), layer_begins.end());
  boundaries.push_back(0);
  std::sort(boundaries.begin(), boundaries.end());
  boundaries.erase(std::unique(boundaries.begin(), boundaries.end()), boundaries.end());
  std::vector<GradientBucket> buckets;
  std::int64_t end = count;
  for (auto it = boundaries.rbegin(); it != boundaries.rend(); ++it) {
    const std::int64_t begin = *it;
    if (begin >= end) continue;
    if (end - begin >= bucket_elements || begin == 0) {
      buckets.push_back({begin, end});
      end = begin;
    }
  }
  return buckets;
}

std::vector<GradientBucket> granule_aligned(const std::vector<GradientBucket>& buckets, std::int64_t granule) {
  std::vector<GradientBucket> aligned;
  for (const GradientBucket& bucket : buckets) {  // from the buffer's end: each bucket ends where the one before begins
    const std::int64_t end = aligned.empty() ? buckets.front().end : aligned.back().begin;
    const std::int64_t begin = std::min(end, (bucket.begin + granule - 1) / granule * granule);
    if (begin < end) aligned.push_back({begin, end});
  }
  return aligned;
}

std::int64_t mpi_bucket_bytes(std::int64_t parameters) {
  constexpr std::int64_t smallest = std::int64_t{1} << 20, largest = std::int64_t{25} << 20;
  return std::clamp<std::int64_t>(parameters * static_cast<std::int64_t>(sizeof(float)) / 4, smallest, largest);
}

MpiExchangeSettings mpi_exchange_settings(bool serialized) {
  MpiExchangeSettings settings;
  if (const char* value = std::getenv("HPCTRAIN_MPI_PROGRESS"); value != nullptr && *value != '\0') {
    const std::string mode = value;
    HPCTRAIN_VERIFY(mode == "thread" || mode == "calls", InputError,
                    "HPCTRAIN_MPI_PROGRESS=" << mode << " is not a progress mode",
                    "set it to thread (a thread tests the gradient all-reduce during backward) or calls (tests "
                    "between layers only), or unset it");
    HPCTRAIN_VERIFY(mode == "calls" || serialized, InputError,
                    "HPCTRAIN_MPI_PROGRESS=thread needs MPI_THREAD_SERIALIZED, which this MPI library does not provide",
                    "unset HPCTRAIN_MPI_PROGRESS or use an MPI built with thread support");
    settings.mode = mode == "thread" ? MpiProgress::thread : MpiProgress::calls;
  }
  if (const char* value = std::getenv("HPCTRAIN_MPI_ALLREDUCE"); value != nullptr && *value != '\0') {
    const std::string algorithm = value;
    HPCTRAIN_VERIFY(algorithm == "rank-order" || algorithm == "library", InputError,
                    "HPCTRAIN_MPI_ALLREDUCE=" << algorithm << " is not an all-reduce algorithm",
                    "set it to rank-order (hpctrain's reduce-scatter and all-gather, the default) or library (the MPI "
                    "library's MPI_Iallreduce), or unset it");
    settings.algorithm = algorithm == "library" ? MpiAllreduce::library : MpiAllreduce::rank_order;
  }
  settings.optimizer =
      settings.algorithm == MpiAllreduce::rank_order ? MpiOptimizer::sharded : MpiOptimizer::replicated;
  if (const char* value = std::getenv("HPCTRAIN_MPI_OPTIMIZER"); value != nullptr && *value != '\0') {
    const std::string optimizer = value;
    HPCTRAIN_VERIFY(optimizer == "sharded" || optimizer == "replicated", InputError,
                    "HPCTRAIN_MPI_OPTIMIZER=" << optimizer << " is not an optimizer layout",
                    "set it to sharded (each rank updates its slice of the parameters, the default) or replicated "
                    "(every rank updates all of them), or unset it");
    HPCTRAIN_VERIFY(optimizer == "replicated" || settings.algorithm == MpiAllreduce::rank_order, InputError,
                    "HPCTRAIN_MPI_OPTIMIZER=sharded needs the rank-order all-reduce, and HPCTRAIN_MPI_ALLREDUCE is "
                    "library",
                    "unset HPCTRAIN_MPI_ALLREDUCE, or set HPCTRAIN_MPI_OPTIMIZER=replicated");
    settings.optimizer = optimizer == "sharded" ? MpiOptimizer::sharded : MpiOptimizer::replicated;
  }
  return settings;
}

GradientAllreduce::GradientAllreduce(MPI_Comm communicator, float* gradients, std::int64_t count,
                                     const std::vector<std::int64_t>& layer_begins, std::int64_t bucket_bytes,
                                     MpiExchangeSettings settings)
    : communicator_(communicator),
      gradients_(gradients),
      count_(count),
      buckets_(gradient_buckets(count, layer_begins, bucket_bytes)),
      settings_(settings) {
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(communicator, &ranks_));
  if (ranks_ == 1) return;
  HPCTRAIN_ASSERT(settings_.optimizer == MpiOptimizer::replicated || settings_.algorithm == MpiAllreduce::rank_order,
                  "a sharded optimizer needs the rank-order all-reduce");
  // Ranks with different settings would make different MPI calls and hang: compare them first (every rank decides
  // alike, so the error is reported once).
  const int code = static_cast<int>(settings_.algorithm) * 4 + static_cast<int>(settings_.optimizer) * 2 +
                   static_cast<int>(settings_.mode);
  int extremes[2] = {code, -code};  // the largest code and minus the smallest
  HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_INT, MPI_MAX, communicator));
  HPCTRAIN_VERIFY(extremes[0] == -extremes[1], InputError,
                  "the ranks were started with different HPCTRAIN_MPI_ALLREDUCE, HPCTRAIN_MPI_OPTIMIZER or "
                  "HPCTRAIN_MPI_PROGRESS values",
                  "give every rank the same environment (mpiexec -x VARIABLE, or export it before srun)");
  if (settings_.algorithm == MpiAllreduce::rank_order) {
    const bool sharded = sharded_ = settings_.optimizer == MpiOptimizer::sharded;
    // Sharded: each rank's slices are whole chunks of the gradient norm, so it can sum their squares alone.
    const std::int64_t granule = sharded ? Backend::gradient_statistics_chunk : 1;
    if (sharded) buckets_ = granule_aligned(buckets_, granule);
    HPCTRAIN_MPI_CHECK(MPI_Comm_dup(communicator, &exchange_communicator_));
    // Two tags per bucket; tags repeat only between buckets thousands apart, never in flight together.
    constexpr std::size_t tag_pairs = 16383;  // MPI guarantees tags up to 32767
    exchanges_.reserve(buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      exchanges_.emplace_back(
          exchange_communicator_, static_cast<int>(2 * (b % tag_pairs)), RankOrderAllreduce::default_piece_elements,
          sharded ? RankOrderAllreduce::Result::reduce_scatter : RankOrderAllreduce::Result::all_reduce, granule);
    if (sharded) {  // the slices' bounds, for owned() and each step's gathers
      int rank = 0;
      HPCTRAIN_MPI_CHECK(MPI_Comm_rank(communicator, &rank));
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        std::vector<std::int64_t>& bounds = slice_bounds_.emplace_back();
        for (int r = 0; r < ranks_; ++r)
          bounds.push_back(buckets_[b].begin + exchanges_[b].slice(buckets_[b].size(), r).first);
        bounds.push_back(buckets_[b].end);
      }
      for (std::size_t b = buckets_.size(); b-- > 0;) {  // ascending in the buffer
        const std::int64_t first = slice_bounds_[b][static_cast<std::size_t>(rank)];
        const std::int64_t end = slice_bounds_[b][static_cast<std::size_t>(rank) + 1];
        if (first < end) owned_.push_back({first, end});
      }
    }
  } else {
    requests_.assign(buckets_.size(), MPI_REQUEST_NULL);
  }
  if (settings_.mode == MpiProgress::thread) thread_ = std::thread([this] { progress_loop(); });
}

GradientAllreduce::~GradientAllreduce() {
  if (thread_.joinable()) {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
      in_flight_ = false;
    }
    wake_.notify_one();
    thread_.join();
  }
  // Never leave a request in flight on the way out (an exception during backward).
  for (auto& request : requests_)
    if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
  exchanges_.clear();  // cancels what is in flight
  if (exchange_communicator_ != MPI_COMM_NULL) MPI_Comm_free(&exchange_communicator_);
}

std::int64_t GradientAllreduce::progress_tests() const {
  const std::lock_guard lock(mutex_);
  return tests_;
}

void GradientAllreduce::begin_step() { started_ = 0; }

void GradientAllreduce::start_bucket(std::size_t bucket) {
  const GradientBucket& range = buckets_[bucket];
  if (settings_.algorithm == MpiAllreduce::rank_order)
    exchanges_[bucket].start(gradients_ + range.begin, range.end - range.begin);
  else
    HPCTRAIN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, gradients_ + range.begin, static_cast<int>(range.end - range.begin),
                                      MPI_FLOAT, MPI_SUM, communicator_, &requests_[bucket]));
}

bool GradientAllreduce::test_started() {
  if (settings_.algorithm == MpiAllreduce::library) {
    int done = 0;
    HPCTRAIN_MPI_CHECK(MPI_Testall(static_cast<int>(started_), requests_.data(), &done, MPI_STATUSES_IGNORE));
    return done != 0 && started_ == buckets_.size();
  }
  bool done = true;
  for (std::size_t b = 0; b < started_; ++b)
    if (exchanges_[b].active()) done = exchanges_[b].test() && done;
  return done && started_ == buckets_.size();
}

void GradientAllreduce::progress_loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (!in_flight_) {
      wake_.wait(lock, [this] { return in_flight_ || stopping_; });
      continue;
    }
    // An error here cannot be thrown across threads: keep it for finish() to rethrow, and stop testing.
    try {
      if (test_started()) in_flight_ = false;  // nothing left to progress until the next step's first bucket
    } catch (...) {
      thread_error_ = std::current_exception();
      in_flight_ = false;
    }
    ++tests_;
    // Sleep unlocked, so the step's thread can start buckets and finish() can park this one at any time.
    wake_.wait_for(lock, settings_.interval, [this] { return stopping_; });
  }
}

void GradientAllreduce::park_progress() {
  if (!thread_.joinable()) return;
  const std::lock_guard lock(mutex_);
  in_flight_ = false;  // the thread makes no MPI call until the next step's ready_from
}

void GradientAllreduce::ready_from(std::int64_t begin) {
  if (ranks_ == 1) return;
  bool woke = false;
  {
    const std::lock_guard lock(mutex_);
    while (started_ < buckets_.size() && buckets_[started_].begin >= begin) start_bucket(started_++);
    // Give MPI a chance to progress the buckets already in flight while backward continues.
    if (started_ > 0) test_started();
    if (thread_.joinable() && started_ > 0 && !in_flight_) woke = in_flight_ = true;
  }
  if (woke) wake_.notify_one();
}

void GradientAllreduce::finish() {
  if (ranks_ == 1) return;
  ready_from(0);
  park_progress();
  {
    const std::lock_guard lock(mutex_);  // the parked thread makes no MPI call; the lock orders its last one
    if (thread_error_) std::rethrow_exception(std::exchange(thread_error_, nullptr));
  }
  if (settings_.algorithm == MpiAllreduce::library)
    HPCTRAIN_MPI_CHECK(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
  else
    while (!test_started()) {
    }
}

void GradientAllreduce::gather_owned(void* values, std::size_t element_bytes) {
  if (!sharded_) return;
  const std::lock_guard lock(mutex_);  // the progress thread is parked; the lock orders its last call before these
  for (const std::vector<std::int64_t>& bounds : slice_bounds_)
    allgather_parts(values, element_bytes, bounds, communicator_);
}

void GradientAllreduce::add_over_ranks(std::span<double> values) {
  if (!sharded_) return;
  const std::lock_guard lock(mutex_);
  for (std::size_t first = 0; first < values.size(); first += INT_MAX)
    HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data() + first,
                                     static_cast<int>(std::min<std::size_t>(INT_MAX, values.size() - first)),
                                     MPI_DOUBLE, MPI_SUM, communicator_));
}

StagedGradientAllreduce::StagedGradientAllreduce(MPI_Comm communicator, Backend& backend, float* gradients,
                                                 std::int64_t count)
    : communicator_(communicator), backend_(backend), gradients_(gradients) {
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(communicator, &ranks_));
  if (ranks_ > 1) host_.resize(static_cast<std::size_t>(count));
}

void StagedGradientAllreduce::finish() {
  if (ranks_ == 1 || host_.empty()) return;
  const std::size_t bytes = host_.size() * sizeof(float);
  backend_.copy_to_host(host_.data(), gradients_, bytes);
  constexpr std::size_t chunk = std::size_t{1} << 30;  // MPI counts are int
  for (std::size_t first = 0; first < host_.size(); first += chunk)
    HPCTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, host_.data() + first,
                                     static_cast<int>(std::min(chunk, host_.size() - first)), MPI_FLOAT, MPI_SUM,
                                     communicator_));
  backend_.copy_to_backend(gradients_, host_.data(), bytes);
}

// The NCCL exchange is part of the CUDA module (src/dist/cuda/); the executable reaches it through the module's table.
std::unique_ptr<GradientExchange> make_nccl_gradient_allreduce(MPI_Comm communicator, Backend& backend,
                                                               float* gradients, std::int64_t count,
                                                               const std::vector<std::int64_t>& layer_begins,
                                                               std::int64_t bucket_bytes) {
  std::string why;
  const CudaModuleTable* module = load_cuda_module(&why);
  if (module == nullptr) throw InputError("NCCL gradient all-reduce: " + why, {}, ErrorScope::this_rank);
  return module->make_nccl_gradient_allreduce(communicator, backend, gradients, count, layer_begins, bucket_bytes);
}

}  // namespace hpctrain
