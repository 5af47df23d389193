// Gradient all-reduce over NCCL for the CUDA backend, bucketed and overlapped with backward like the MPI version.
//
// Bootstrap (as nccl-tests does): the device is already chosen by the backend; rank 0 calls ncclGetUniqueId, MPI_Bcast
// gives the id to every rank, then ncclCommInitRank. Each bucket, once backward has produced it, is ordered after the
// compute stream's work with an event and all-reduced on a separate communication stream, so the rest of backward runs
// concurrently. finish() makes the compute stream wait for the last bucket (an event, no host round trip) and then
// waits on the host for it, polling ncclCommGetAsyncError: a failing peer aborts the communicator and throws instead
// of hanging the job.
#include <cuda_runtime.h>

#include <exception>
#include <string>
#include <thread>

#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/kernels/cuda/cuda_backend.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"

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

class NcclGradientAllreduce final : public GradientExchange {
 public:
  NcclGradientAllreduce(MPI_Comm communicator, Backend& backend, float* gradients, std::int64_t count,
                        const std::vector<std::int64_t>& layer_begins, std::int64_t bucket_bytes)
      : gradients_(gradients), buckets_(gradient_buckets(count, layer_begins, bucket_bytes)) {
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
    HPCTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&communication_stream_, cudaStreamNonBlocking));
    HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  ~NcclGradientAllreduce() override {
    if (nccl_ != nullptr) {
      // Leaving on an exception: peers may be gone, so abort rather than wait for them in ncclCommDestroy.
      if (std::uncaught_exceptions() > 0) {
        ncclCommAbort(nccl_);
      } else {
        HPCTRAIN_CUDA_WARN(cudaStreamSynchronize(communication_stream_));
        ncclCommDestroy(nccl_);
      }
    }
    if (done_ != nullptr) HPCTRAIN_CUDA_WARN(cudaEventDestroy(done_));
    if (ready_ != nullptr) HPCTRAIN_CUDA_WARN(cudaEventDestroy(ready_));
    if (communication_stream_ != nullptr) HPCTRAIN_CUDA_WARN(cudaStreamDestroy(communication_stream_));
  }

  void begin_step() override { started_ = 0; }

  void ready_from(std::int64_t begin) override {
    if (ranks_ == 1) return;
    bool any = false;
    while (started_ < buckets_.size() && buckets_[started_].begin >= begin) {
      if (!any) {
        // Everything backward enqueued so far (this bucket's gradients included) before the all-reduce.
        HPCTRAIN_CUDA_CHECK(cudaEventRecord(ready_, compute_stream_));
        HPCTRAIN_CUDA_CHECK(cudaStreamWaitEvent(communication_stream_, ready_, 0));
        any = true;
      }
      const GradientBucket& bucket = buckets_[started_];
      float* data = gradients_ + bucket.begin;
      HPCTRAIN_NCCL_CHECK_ON(nccl_, ncclAllReduce(data, data, static_cast<std::size_t>(bucket.end - bucket.begin),
                                                  ncclFloat, ncclSum, nccl_, communication_stream_));
      ++started_;
    }
  }

  void finish() override {
    if (ranks_ == 1) return;
    ready_from(0);
    HPCTRAIN_CUDA_CHECK(cudaEventRecord(done_, communication_stream_));
    HPCTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, done_, 0));
    // Being captured into a CUDA graph: nothing runs now, so there is nothing to wait for (the graph holds the order).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    HPCTRAIN_CUDA_CHECK(cudaStreamIsCapturing(compute_stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) return;
    // Wait here, polling NCCL's asynchronous error, so a failed peer ends the job instead of hanging a later
    // synchronisation.
    for (;;) {
      const cudaError_t state = cudaEventQuery(done_);
      if (state == cudaSuccess) break;
      if (state != cudaErrorNotReady) HPCTRAIN_CUDA_CHECK(state);
      ncclResult_t async_error = ncclSuccess;
      HPCTRAIN_NCCL_CHECK_ON(nccl_, ncclCommGetAsyncError(nccl_, &async_error));
      if (async_error != ncclSuccess && async_error != ncclInProgress) {
        const std::string text = ncclGetErrorString(async_error);
        ncclCommAbort(nccl_);
        nccl_ = nullptr;
        throw LibraryError("NCCL", "ncclAllReduce (asynchronous)", text + "; the communicator was aborted", __FILE__,
                           __LINE__);
      }
      std::this_thread::yield();
    }
    (void)cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady must not surface at the next launch check
  }

 private:
  float* gradients_;
  std::vector<GradientBucket> buckets_;  // from the end of the buffer to its start
  int ranks_ = 1;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t compute_stream_ = nullptr, communication_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::size_t started_ = 0;
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
