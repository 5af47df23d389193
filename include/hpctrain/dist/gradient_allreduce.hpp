// Bucketed, overlapped gradient all-reduce: over MPI for the CPU backend, over NCCL for the CUDA backend.
//
// Buckets are runs of whole layers' gradients of about bucket_bytes, cut from the end of the flat gradient buffer
// (backward produces the last layers' gradients first). As soon as backward has finished every layer of a bucket, an
// all-reduce (sum, in place) starts on it, so communication overlaps the rest of backward; finish() completes all.
// The loss gradient is already divided by the global batch size, so the sum is the average gradient.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace hpctrain {

class Backend;

// [begin, end) element ranges of the flat gradient buffer, from its end to its start.
struct GradientBucket {
  std::int64_t begin, end;
};
// layer_begins: element offsets where each layer's gradients start (any order, any number of layers).
std::vector<GradientBucket> gradient_buckets(std::int64_t count, const std::vector<std::int64_t>& layer_begins,
                                             std::int64_t bucket_bytes);

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

// MPI_Iallreduce on host memory (CPU backend).
class GradientAllreduce final : public GradientExchange {
 public:
  GradientAllreduce(MPI_Comm communicator, float* gradients, std::int64_t count,
                    const std::vector<std::int64_t>& layer_begins, std::int64_t bucket_bytes);
  ~GradientAllreduce() override;
  GradientAllreduce(const GradientAllreduce&) = delete;
  GradientAllreduce& operator=(const GradientAllreduce&) = delete;

  void begin_step() override;
  void ready_from(std::int64_t begin) override;
  void finish() override;

  [[nodiscard]] std::size_t bucket_count() const { return buckets_.size(); }

 private:
  MPI_Comm communicator_;
  int ranks_ = 1;
  float* gradients_;
  std::int64_t count_;
  std::vector<GradientBucket> buckets_;  // from the end of the buffer to its start
  std::vector<MPI_Request> requests_;
  std::size_t started_ = 0;
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
