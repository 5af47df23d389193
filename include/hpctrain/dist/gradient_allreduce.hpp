// Bucketed, overlapped gradient all-reduce: over MPI for the CPU backend, over NCCL for the CUDA backend.
//
// Buckets are runs of whole layers' gradients of about bucket_bytes, cut from the end of the flat gradient buffer
// (backward produces the last layers' gradients first). As soon as backward has finished every layer of a bucket, an
// all-reduce (sum, in place) starts on it, so communication overlaps the rest of backward; finish() completes all.
// The loss gradient is already divided by the global batch size, so the sum is the average gradient.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "hpctrain/core/numbers.hpp"
#include "hpctrain/dist/rank_order_allreduce.hpp"

namespace hpctrain {

class Backend;

// [begin, end) element ranges of the flat gradient buffer, from its end to its start.
using GradientBucket = ElementRange;
// layer_begins: element offsets where each layer's gradients start (any order, any number of layers).
std::vector<GradientBucket> gradient_buckets(std::int64_t count, const std::vector<std::int64_t>& layer_begins,
                                             std::int64_t bucket_bytes);
// The same buckets with every begin moved up to a multiple of `granule` (a bucket left empty joins the next): a bucket
// still starts as soon as backward has finished its layers, and its ranks' slices can be whole granules.
std::vector<GradientBucket> granule_aligned(const std::vector<GradientBucket>& buckets, std::int64_t granule);

// What the training step needs from a gradient all-reduce.
class GradientExchange {
 public:
  virtual ~GradientExchange() = default;
  virtual void begin_step() = 0;
  // Every gradient at [begin, count) is final: start the buckets that are now complete.
  virtual void ready_from(std::int64_t begin) = 0;
  // Start what is left and complete all buckets. NCCL: the backend's stream waits for them (an event); the host does
  // not wait, so the next step's host work overlaps the all-reduce.
  virtual void finish() = 0;
  // A sharded optimizer update (the MPI rank-order exchange with MpiOptimizer::sharded on more than one rank; every
  // rank agrees): finish() leaves on this rank the sums of its owned() elements only (its slice of every bucket,
  // whole Backend::gradient_statistics_chunk chunks; none where a model has fewer chunks than ranks); the rank updates
  // them alone and gathers the results with gather_owned. Not sharded: every rank holds every sum and updates
  // everything.
  [[nodiscard]] virtual bool sharded() const { return false; }
  [[nodiscard]] virtual std::span<const ElementRange> owned() const { return {}; }
  // Sharded update only: `values` (host memory), laid out like the gradients with elements of element_bytes, holds on
  // each rank its owned() elements up to date; afterwards every rank holds all of them. Collective.
  virtual void gather_owned(void* /*values*/, std::size_t /*element_bytes*/) {}
  // Sharded update only: sums `values` over the ranks, in place (the gradient norm's partial sums). Collective.
  virtual void add_over_ranks(std::span<double> /*values*/) {}
  // Ends the communication in order at the end of a run (NCCL: waits for it, then ncclCommDestroy). Call after
  // Backend::release_graphs(): NCCL 2.28's ncclCommDestroy waits until no graph uses the communicator. Does nothing
  // on an error path (an exception in flight, or after a communication error): MPI_Abort ends the processes then.
  virtual void release() {}
};

// How an NCCL communicator ends (a pure decision, tested on the CPU): destroyed in order at a normal end; aborted on
// an error path when no captured graph uses it (peers may be gone, so nothing may wait for them); left alone when a
// live graph uses it (aborting or destroying it would wait for the graph; MPI_Abort ends the process anyway).
enum class CommunicatorEnd : std::uint8_t { destroy, abort, leave };
inline CommunicatorEnd communicator_end(bool graph_uses_it, bool error_path) {
  if (graph_uses_it) return CommunicatorEnd::leave;
  return error_path ? CommunicatorEnd::abort : CommunicatorEnd::destroy;
}

// The bucket size of the MPI all-reduce: a quarter of the gradients, between 1 MiB and 25 MiB (PyTorch DDP's size).
// 25 MiB for every model made a model of up to 25 MiB one bucket that started only after the whole backward pass (no
// overlap at all); measured on the MLP of bench/run.sh (25 MB of gradients, 2 ranks): the all-reduce wait per step
// fell from 5.1 ms to 1.3 ms (docs/performance.md). The NCCL exchange keeps 25 MiB (not measured on a GPU yet).
std::int64_t mpi_bucket_bytes(std::int64_t parameters);

// How the buckets in flight progress while backward computes. Open MPI's point-to-point messages and non-blocking
// collectives advance only inside MPI calls, and backward's products make none for milliseconds. `calls` (the
// default) tests the buckets each time backward finishes a layer; `thread` also runs a thread that tests them every
// `interval` while the step's buckets are in flight (it needs MPI_THREAD_SERIALIZED: one mutex orders its calls and
// the step's, and finish() parks it before any other MPI call of the step). The sums are the same either way (neither
// algorithm's schedule depends on timing). On one node with every core computing, the thread gained nothing (the
// copies need the same cores) and cost much when cores were oversubscribed (docs/performance.md); it is for links
// whose transfers run without the CPU (RDMA between nodes), where only the schedule needs advancing.
enum class MpiProgress : std::uint8_t { calls, thread };
// How a bucket is summed: `rank_order` (the default) by RankOrderAllreduce (dist/rank_order_allreduce.hpp: a
// reduce-scatter and all-gather in point-to-point messages, each element summed in rank order whatever the MPI);
// `library` by the MPI library's MPI_Iallreduce (its own algorithm and summation order; Open MPI 4.1 runs a binomial
// tree, 2.5x slower on the benchmark MLP's 25 MB over 2 ranks). 2 ranks get the same bits from either.
enum class MpiAllreduce : std::uint8_t { rank_order, library };
// Who updates which parameters. `replicated`: every rank all-reduces the gradients and updates every parameter.
// `sharded` (rank-order only): the exchange is a reduce-scatter, each rank computes the gradient norm's chunks and
// the optimizer update of its own slice of each bucket, and the updated parameters are all-gathered: the same bytes on
// the wire as the all-reduce, 1/ranks of the optimizer's memory traffic per rank (the optimizer state keeps its full
// size; a checkpoint writes and reads each rank's own slices of it). The same bits either way: each element's sum and
// update, and the norm's chunks added in order, do not depend on which rank computes them.
enum class MpiOptimizer : std::uint8_t { replicated, sharded };
struct MpiExchangeSettings {
  MpiProgress mode = MpiProgress::calls;
  std::chrono::microseconds interval{100};
  MpiAllreduce algorithm = MpiAllreduce::rank_order;
  MpiOptimizer optimizer = MpiOptimizer::replicated;
};
// The settings a run uses: HPCTRAIN_MPI_PROGRESS=calls|thread (unset: calls), HPCTRAIN_MPI_ALLREDUCE=
// rank-order|library (unset: rank-order) and HPCTRAIN_MPI_OPTIMIZER=sharded|replicated (unset: sharded with
// rank-order, replicated with library); InputError for any other value, for `thread` when `serialized`, what
// MPI_Init_thread provided, is false, and for sharded with library.
MpiExchangeSettings mpi_exchange_settings(bool serialized);

// The bucketed all-reduce of gradients in host memory (CPU backend), over MPI.
class GradientAllreduce final : public GradientExchange {
 public:
  GradientAllreduce(MPI_Comm communicator, float* gradients, std::int64_t count,
                    const std::vector<std::int64_t>& layer_begins, std::int64_t bucket_bytes,
                    MpiExchangeSettings settings = {});
  ~GradientAllreduce() override;
  GradientAllreduce(const GradientAllreduce&) = delete;
  GradientAllreduce& operator=(const GradientAllreduce&) = delete;

  void begin_step() override;
  void ready_from(std::int64_t begin) override;
  void finish() override;
  [[nodiscard]] bool sharded() const override { return sharded_; }
  [[nodiscard]] std::span<const ElementRange> owned() const override { return owned_; }
  void gather_owned(void* values, std::size_t element_bytes) override;
  void add_over_ranks(std::span<double> values) override;

  [[nodiscard]] std::size_t bucket_count() const { return buckets_.size(); }
  // Tests made by the progress thread so far (0 without one).
  [[nodiscard]] std::int64_t progress_tests() const;

 private:
  void start_bucket(std::size_t bucket);  // the caller holds mutex_
  bool test_started();                    // advances the started buckets; true once all are done; holds mutex_
  void progress_loop();
  void park_progress();  // the thread stops calling MPI until the next step's first bucket

  MPI_Comm communicator_;
  int ranks_ = 1;
  float* gradients_;
  std::int64_t count_;
  std::vector<GradientBucket> buckets_;  // from the end of the buffer to its start
  MpiExchangeSettings settings_;
  MPI_Comm exchange_communicator_ = MPI_COMM_NULL;       // rank_order: a duplicate, so no other message can match
  std::vector<RankOrderAllreduce> exchanges_;            // rank_order: one per bucket
  bool sharded_ = false;                                 // a sharded update on more than one rank
  std::vector<ElementRange> owned_;                      // sharded: this rank's slices of the buckets, ascending
  std::vector<std::vector<std::int64_t>> slice_bounds_;  // sharded: per bucket, where each rank's slice begins, + end
  std::vector<MPI_Request> requests_;                    // library: one per bucket
  std::size_t started_ = 0;

  mutable std::mutex mutex_;  // orders every MPI call of this object between the two threads
  std::condition_variable wake_;
  bool in_flight_ = false, stopping_ = false;  // guarded by mutex_
  std::int64_t tests_ = 0;                     // guarded by mutex_
  std::exception_ptr thread_error_;            // guarded by mutex_: an MPI error the thread met, rethrown by finish()
  std::thread thread_;
};

// Backend-memory gradients all-reduced through host memory with one MPI_Allreduce in finish() (no overlap): for CUDA
// ranks that share a GPU, which NCCL refuses ("duplicate GPU").
class StagedGradientAllreduce final : public GradientExchange {
 public:
  StagedGradientAllreduce(MPI_Comm communicator, Backend& backend, float* gradients, std::int64_t count);
  void begin_step() override {}
  void ready_from(std::int64_t) override {}
  void finish() override;

 private:
  MPI_Comm communicator_;
  Backend& backend_;
  int ranks_ = 1;
  float* gradients_;
  std::vector<float> host_;  // (count)
};

// NCCL all-reduce of device gradients of a CUDA backend, on its own highest-priority stream (src/dist/cuda/). The
// communicator is bootstrapped from `communicator` (rank 0's ncclGetUniqueId broadcast with MPI). While it lives, the
// backend's host waits check NCCL's asynchronous errors (Backend::set_wait_monitor) and a watchdog thread polls them,
// so a failed peer ends the job instead of hanging it. In the CUDA module (kernels/cuda_module.hpp): InputError when
// that cannot be loaded; NotSupported in a module built without NCCL when more than one rank runs.
std::unique_ptr<GradientExchange> make_nccl_gradient_allreduce(MPI_Comm communicator, Backend& backend,
                                                               float* gradients, std::int64_t count,
                                                               const std::vector<std::int64_t>& layer_begins,
                                                               std::int64_t bucket_bytes);

}  // namespace hpctrain
