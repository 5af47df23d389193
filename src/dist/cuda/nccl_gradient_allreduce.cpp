// Gradient all-reduce over NCCL for the CUDA backend, bucketed and overlapped with backward like the MPI version.
//
// Bootstrap (as nccl-tests does): the device is already chosen by the backend; rank 0 calls ncclGetUniqueId, MPI_Bcast
// gives the id to every rank, then ncclCommInitRank. Each bucket, once backward has produced it, is ordered after the
// compute stream's work with an event and all-reduced on a separate, highest-priority communication stream, so the
// rest of backward runs concurrently; buckets that become ready together are one NCCL group. finish() makes the
// compute stream wait for the last bucket (an event) and returns: the host does not wait for the all-reduce.
//
// Errors: a watchdog thread polls ncclCommGetAsyncError, and so does every host wait of the backend (its wait monitor,
// installed here). On an error the communicator is aborted, unless a captured graph uses it (NCCL would wait for the
// graph), and the main thread's next wait throws, so the job ends through MPI_Abort instead of hanging. Teardown
// order (see GradientExchange::release and communicator_end): graphs first, then the communicator.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/kernels/cuda/cuda_backend.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/cuda/host_wait.hpp"

#if defined(HPCTRAIN_HAVE_NCCL)
#include "hpctrain/kernels/cuda/nccl_check.hpp"
#endif

namespace hpctrain {

#if defined(HPCTRAIN_HAVE_NCCL)

namespace detail {
void throw_nccl_error(ncclResult_t code, ncclComm_t communicator, const char* call, const char* file, int line) {
  std::string text = ncclGetErrorString(code);
  const char* last = ncclGetLastError(communicator);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  throw LibraryError("NCCL", call, text, file, line);
}
}  // namespace detail

namespace {

// How often the watchdog asks NCCL for asynchronous errors, and how long it lets the main thread notice one before it
// ends the process itself (the main thread may be stuck in a call that cannot poll, e.g. a full launch queue).
constexpr std::chrono::milliseconds watchdog_period{50};
constexpr std::chrono::seconds watchdog_grace{120};

class NcclGradientAllreduce final : public GradientExchange {
 public:
  NcclGradientAllreduce(MPI_Comm communicator, Backend& backend, float* gradients, std::int64_t count,
                        const std::vector<std::int64_t>& layer_begins, std::int64_t bucket_bytes)
      : backend_(backend), gradients_(gradients), buckets_(gradient_buckets(count, layer_begins, bucket_bytes)) {
    int rank = 0;
    HPCTRAIN_MPI_CHECK(MPI_Comm_rank(communicator, &rank));
    HPCTRAIN_MPI_CHECK(MPI_Comm_size(communicator, &ranks_));
    if (ranks_ == 1) return;
    compute_stream_ = cuda_stream_of(backend);
    HPCTRAIN_CUDA_CHECK(cudaSetDevice(cuda_device_of(backend)));
    ncclUniqueId id{};
    if (rank == 0) HPCTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
    HPCTRAIN_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, communicator));
    HPCTRAIN_NCCL_CHECK(ncclCommInitRank(&nccl_, ranks_, id, rank));
    // Highest priority: the all-reduce kernels get SMs ahead of the backward kernels they overlap.
    int least = 0, greatest = 0;
    HPCTRAIN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    HPCTRAIN_CUDA_CHECK(cudaStreamCreateWithPriority(&communication_stream_, cudaStreamNonBlocking, greatest));
    HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    device_ = cuda_device_of(backend);
    watchdog_ = std::thread([this] { watch(); });
    backend_.set_wait_monitor([this] { check(); });
  }

  ~NcclGradientAllreduce() override {
    stop_watchdog();
    if (ranks_ > 1) backend_.set_wait_monitor({});  // it refers to this object
    if (nccl_ == nullptr) {
      destroy_streams();
      return;
    }
    const bool error_path = std::uncaught_exceptions() > 0 || failed_.load();
    switch (communicator_end(in_graph_, error_path)) {
      case CommunicatorEnd::leave:  // a live graph uses it; MPI_Abort ends the process
        return;
      case CommunicatorEnd::abort:
        ncclCommAbort(nccl_);
        break;
      case CommunicatorEnd::destroy:
        HPCTRAIN_CUDA_WARN(cudaStreamSynchronize(communication_stream_));
        ncclCommDestroy(nccl_);
        break;
    }
    nccl_ = nullptr;
    destroy_streams();
  }

  void begin_step() override { started_ = 0; }

  void ready_from(std::int64_t begin) override {
    if (ranks_ == 1) return;
    check();
    const std::size_t first = started_;
    while (started_ < buckets_.size() && buckets_[started_].begin >= begin) ++started_;
    if (started_ == first) return;
    // Everything backward enqueued so far (these buckets' gradients included) before the all-reduce.
    HPCTRAIN_CUDA_CHECK(cudaEventRecord(ready_, compute_stream_));
    HPCTRAIN_CUDA_CHECK(cudaStreamWaitEvent(communication_stream_, ready_, 0));
    const std::lock_guard lock(nccl_mutex_);
    // Buckets that start together are one group: one launch instead of one per bucket.
    const bool grouped = started_ - first > 1;
    if (grouped) HPCTRAIN_NCCL_CHECK_ON(nccl_, ncclGroupStart());
    for (std::size_t i = first; i < started_; ++i) {
      float* data = gradients_ + buckets_[i].begin;
      HPCTRAIN_NCCL_CHECK_ON(
          nccl_, ncclAllReduce(data, data, static_cast<std::size_t>(buckets_[i].end - buckets_[i].begin), ncclFloat,
                               ncclSum, nccl_, communication_stream_));
    }
    if (grouped) HPCTRAIN_NCCL_CHECK_ON(nccl_, ncclGroupEnd());
  }

  // The compute stream waits for the last bucket (an event): the host returns at once and its next step's work
  // overlaps the all-reduce. Host waits later (read-backs, checkpoints) poll NCCL's errors through the backend's
  // wait monitor, and the watchdog polls meanwhile.
  void finish() override {
    if (ranks_ == 1) return;
    ready_from(0);
    HPCTRAIN_CUDA_CHECK(cudaEventRecord(done_, communication_stream_));
    HPCTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, done_, 0));
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    HPCTRAIN_CUDA_CHECK(cudaStreamIsCapturing(compute_stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) in_graph_ = true;  // a graph now holds these NCCL operations
  }

  // Never throws (it runs at teardown): a failure while waiting leaves the communicator to the destructor's abort.
  void release() override {
    if (nccl_ == nullptr || std::uncaught_exceptions() > 0 || failed_.load()) return;
    in_graph_ = false;  // the caller released the graphs first, so an error found now may abort the communicator
    try {
      // Waits for the last all-reduce, still checking for errors (a peer may fail at the very end).
      cuda::wait_polling(
          [this] {
            if (failed_.load()) return true;
            const cudaError_t state = cudaStreamQuery(communication_stream_);
            if (state == cudaSuccess) return true;
            if (state != cudaErrorNotReady) HPCTRAIN_CUDA_CHECK(state);
            return false;
          },
          [this] { poll(); });
    } catch (const std::exception& error) {
      std::fprintf(stderr, "warning: NCCL teardown: %s\n", error.what());
      failed_.store(true);
    }
    (void)cudaGetLastError();
    stop_watchdog();
    if (failed_.load()) return;
    backend_.set_wait_monitor({});
    const ncclResult_t status = ncclCommDestroy(nccl_);
    if (status != ncclSuccess) std::fprintf(stderr, "warning: ncclCommDestroy: %s\n", ncclGetErrorString(status));
    nccl_ = nullptr;
    destroy_streams();
  }

 private:
  // Main thread: throws when the watchdog (or this poll) saw an asynchronous error.
  void check() {
    if (!failed_.load()) poll();
    if (failed_.load()) {
      const std::lock_guard lock(error_mutex_);
      noticed_ = true;
      throw LibraryError("NCCL", "ncclAllReduce (asynchronous)", error_text_, __FILE__, __LINE__);
    }
  }

  // Either thread: asks NCCL; on an error records it and, unless a graph uses the communicator, aborts it so that
  // kernels waiting for a lost peer end (and with them the host's waits).
  void poll() {
    if (failed_.load()) return;
    const std::unique_lock lock(nccl_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || nccl_ == nullptr) return;  // the main thread is enqueueing or destroying: next time
    ncclResult_t async_error = ncclSuccess;
    if (ncclCommGetAsyncError(nccl_, &async_error) != ncclSuccess) async_error = ncclInternalError;
    if (async_error == ncclSuccess || async_error == ncclInProgress) return;
    {
      const std::lock_guard error_lock(error_mutex_);
      error_text_ = std::string(ncclGetErrorString(async_error)) +
                    (in_graph_ ? "; the communicator is left to MPI_Abort (a CUDA graph uses it)"
                               : "; the communicator was aborted");
    }
    if (!in_graph_) {
      ncclCommAbort(nccl_);
      nccl_ = nullptr;
    }
    failed_.store(true);
  }

  void watch() {
    HPCTRAIN_CUDA_WARN(cudaSetDevice(device_));
    std::unique_lock lock(stop_mutex_);
    std::chrono::steady_clock::time_point failed_at{};
    while (!stop_) {
      stop_changed_.wait_for(lock, watchdog_period);
      if (stop_) break;
      lock.unlock();
      poll();
      lock.lock();
      if (!failed_.load()) continue;
      const auto now = std::chrono::steady_clock::now();
      if (failed_at == std::chrono::steady_clock::time_point{}) failed_at = now;
      bool noticed = false;
      {
        const std::lock_guard error_lock(error_mutex_);
        noticed = noticed_;
      }
      if (!noticed && now - failed_at > watchdog_grace) {
        // The main thread never came to look: it is blocked where it cannot poll. End this process; the launcher
        // then ends the others.
        const std::lock_guard error_lock(error_mutex_);
        std::fprintf(stderr, "error: NCCL: %s; the main thread did not respond for %lld s, exiting\n",
                     error_text_.c_str(), static_cast<long long>(watchdog_grace.count()));
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }

  void stop_watchdog() {
    if (!watchdog_.joinable()) return;
    {
      const std::lock_guard lock(stop_mutex_);
      stop_ = true;
    }
    stop_changed_.notify_all();
    watchdog_.join();
  }

  void destroy_streams() {
    if (done_ != nullptr) HPCTRAIN_CUDA_WARN(cudaEventDestroy(done_));
    if (ready_ != nullptr) HPCTRAIN_CUDA_WARN(cudaEventDestroy(ready_));
    if (communication_stream_ != nullptr) HPCTRAIN_CUDA_WARN(cudaStreamDestroy(communication_stream_));
    done_ = ready_ = nullptr;
    communication_stream_ = nullptr;
  }

  Backend& backend_;
  float* gradients_;
  std::vector<GradientBucket> buckets_;  // from the end of the buffer to its start
  int ranks_ = 1, device_ = 0;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t compute_stream_ = nullptr, communication_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::size_t started_ = 0;
  bool in_graph_ = false;  // a captured graph holds NCCL operations of nccl_ (main thread writes, before capture ends)
  std::mutex nccl_mutex_;  // nccl_'s use: enqueueing (main thread) against aborting (either thread)
  std::atomic<bool> failed_{false};
  std::mutex error_mutex_;  // error_text_, noticed_
  std::string error_text_;
  bool noticed_ = false;
  std::thread watchdog_;
  std::mutex stop_mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<GradientExchange> make_nccl_gradient_allreduce(MPI_Comm communicator, Backend& backend,
                                                               float* gradients, std::int64_t count,
                                                               const std::vector<std::int64_t>& layer_begins,
                                                               std::int64_t bucket_bytes) {
  return std::make_unique<NcclGradientAllreduce>(communicator, backend, gradients, count, layer_begins, bucket_bytes);
}

#else  // CUDA without NCCL: one rank needs no communication; more are refused.

namespace {
class NoExchange final : public GradientExchange {
 public:
  void begin_step() override {}
  void ready_from(std::int64_t) override {}
  void finish() override {}
};
}  // namespace

std::unique_ptr<GradientExchange> make_nccl_gradient_allreduce(MPI_Comm communicator, Backend&, float*, std::int64_t,
                                                               const std::vector<std::int64_t>&, std::int64_t) {
  int ranks = 1;
  HPCTRAIN_MPI_CHECK(MPI_Comm_size(communicator, &ranks));
  if (ranks > 1)
    throw NotSupported("run.device = \"cuda\" on " + std::to_string(ranks) +
                       " ranks: this build has no NCCL; rebuild with NCCL (set NCCL_ROOT)");
  return std::make_unique<NoExchange>();
}

#endif

}  // namespace hpctrain
