// Memory of the CUDA backend: grow-only device scratch that retires instead of freeing (a captured graph may still
// point at the old block), host waits that poll instead of blocking (so NCCL's asynchronous errors are seen), the
// pinned ring that small per-step uploads pass through, and the batch upload queue: a copy stream, two device staging
// slots used in turn, and events, so a batch is copied while the previous step computes. Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "hpctrain/core/tensor.hpp"
#include "hpctrain/kernels/cuda/retiring_buffer.hpp"

namespace hpctrain::cuda {

struct CudaAllocator {
  void* allocate(std::size_t bytes);
  void release(void* pointer) noexcept;
};
// Grow-only device scratch; a replaced block is kept until destruction (see retiring_buffer.hpp).
using DeviceScratch = RetiringBuffer<CudaAllocator>;

// Called while the host waits (NCCL's error check; may throw). Empty: nothing to check.
using WaitMonitor = std::function<void()>;

// Waits until `event` has completed, polling and calling `monitor` in between.
void wait_for_event(cudaEvent_t event, const WaitMonitor& monitor);
// Waits until everything queued on `stream` so far has run (an event recorded now, then wait_for_event).
void wait_for_stream(cudaStream_t stream, cudaEvent_t scratch_event, const WaitMonitor& monitor);

// Pinned host memory that per-step uploads pass through: cudaMemcpyAsync from pageable memory may wait for the stream,
// from pinned memory it does not. A ring: space is handed out in order and reused once the copies that read it have
// run (an event per region), so the host waits only for copies issued long before.
class PinnedRing {
 public:
  explicit PinnedRing(std::size_t capacity);
  PinnedRing(const PinnedRing&) = delete;
  PinnedRing& operator=(const PinnedRing&) = delete;
  ~PinnedRing();
  [[nodiscard]] std::size_t capacity() const { return capacity_; }
  // Copies `bytes` (<= capacity()) from host memory to `destination` on `stream` through the ring; the source may be
  // reused on return.
  void upload(void* destination, const void* source, std::size_t bytes, cudaStream_t stream,
              const WaitMonitor& monitor);

 private:
  struct Region {
    std::size_t begin, end;
    cudaEvent_t event;
  };
  char* data_ = nullptr;
  std::size_t capacity_;
  std::size_t head_ = 0;
  std::deque<Region> in_flight_;  // oldest first
  std::vector<cudaEvent_t> spare_events_;
};

// Batch uploads that overlap the step before: host rows are copied on a copy stream into one of two device staging
// slots (used in turn), the compute stream waits on the copy's event and converts the slot into the destination. A
// slot is overwritten only after the compute stream has consumed it (an event), so the next batch's copy runs while
// the current step computes. From host memory registered with pin() the copy is a DMA with no host-side copy; other
// sources go through the pinned ring in chunks.
class UploadQueue {
 public:
  UploadQueue(cudaStream_t compute, PinnedRing& ring);
  UploadQueue(const UploadQueue&) = delete;
  UploadQueue& operator=(const UploadQueue&) = delete;
  ~UploadQueue();

  // f32 host values -> destination (rows x cols of any storage dtype). Returns once `source` has been read.
  void upload(const float* source, const TensorView& destination, const WaitMonitor& monitor);
  // Page-locks [pointer, pointer + bytes) for DMA uploads until unpin(pointer); false when the driver refuses.
  bool pin(const void* pointer, std::size_t bytes);
  void unpin(const void* pointer);
  [[nodiscard]] bool pinned(const void* pointer, std::size_t bytes) const;

  [[nodiscard]] cudaStream_t copy_stream() const { return copy_stream_; }

 private:
  struct Slot {
    DeviceScratch buffer;
    cudaEvent_t copied = nullptr, consumed = nullptr;
    bool used = false;
  };
  cudaStream_t compute_;
  cudaStream_t copy_stream_ = nullptr;
  PinnedRing& ring_;
  Slot slots_[2];
  int next_ = 0;
  std::map<const char*, std::size_t> pinned_;  // start -> bytes
};

}  // namespace hpctrain::cuda
