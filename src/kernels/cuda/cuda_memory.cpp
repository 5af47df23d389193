// Memory of the CUDA backend (see cuda_memory.hpp): device scratch, polling host waits, the pinned ring, batch uploads.
#include "cuda_memory.hpp"

#include <algorithm>
#include <cstring>

#include "cuda_elementwise.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/cuda/cuda_check.hpp"
#include "hpctrain/kernels/cuda/host_wait.hpp"

namespace hpctrain::cuda {

void* CudaAllocator::allocate(std::size_t bytes) {
  void* pointer = nullptr;
  HPCTRAIN_CUDA_CHECK(cudaMalloc(&pointer, bytes));
  return pointer;
}
void CudaAllocator::release(void* pointer) noexcept { HPCTRAIN_CUDA_WARN(cudaFree(pointer)); }

void wait_for_event(cudaEvent_t event, const WaitMonitor& monitor) {
  wait_polling(
      [event] {
        const cudaError_t state = cudaEventQuery(event);
        if (state == cudaSuccess) return true;
        if (state != cudaErrorNotReady) HPCTRAIN_CUDA_CHECK(state);
        return false;
      },
      monitor);
  (void)cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady must not surface at the next launch check
}

void wait_for_stream(cudaStream_t stream, cudaEvent_t scratch_event, const WaitMonitor& monitor) {
  HPCTRAIN_CUDA_CHECK(cudaEventRecord(scratch_event, stream));
  wait_for_event(scratch_event, monitor);
}

// ---- pinned ring ----

PinnedRing::PinnedRing(std::size_t capacity) : capacity_(capacity) {
  HPCTRAIN_CUDA_CHECK(cudaMallocHost(&data_, capacity));
}

PinnedRing::~PinnedRing() {
  for (const Region& region : in_flight_) {
    HPCTRAIN_CUDA_WARN(cudaEventSynchronize(region.event));
    HPCTRAIN_CUDA_WARN(cudaEventDestroy(region.event));
  }
  for (cudaEvent_t event : spare_events_) HPCTRAIN_CUDA_WARN(cudaEventDestroy(event));
  if (data_ != nullptr) HPCTRAIN_CUDA_WARN(cudaFreeHost(data_));
}

void PinnedRing::upload(void* destination, const void* source, std::size_t bytes, cudaStream_t stream,
                        const WaitMonitor& monitor) {
  HPCTRAIN_ASSERT(bytes <= capacity_, "pinned ring: " << bytes << " bytes in a ring of " << capacity_);
  if (head_ + bytes > capacity_) head_ = 0;
  const std::size_t begin = head_, end = head_ + bytes;
  // Retire finished regions, then wait for any region still in flight that overlaps [begin, end), oldest first
  // (regions of one stream finish in order; waiting for an older region of another stream only waits longer).
  while (!in_flight_.empty()) {
    const Region& oldest = in_flight_.front();
    bool overlapping = false;
    for (const Region& region : in_flight_) overlapping |= region.begin < end && begin < region.end;
    if (!overlapping) {
      const cudaError_t state = cudaEventQuery(oldest.event);
      if (state == cudaErrorNotReady) break;
      HPCTRAIN_CUDA_CHECK(state);
    } else {
      wait_for_event(oldest.event, monitor);
    }
    spare_events_.push_back(oldest.event);
    in_flight_.pop_front();
  }
  (void)cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady is not an error
  std::memcpy(data_ + begin, source, bytes);
  HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination, data_ + begin, bytes, cudaMemcpyHostToDevice, stream));
  cudaEvent_t event = nullptr;
  if (spare_events_.empty()) {
    HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  } else {
    event = spare_events_.back();
    spare_events_.pop_back();
  }
  HPCTRAIN_CUDA_CHECK(cudaEventRecord(event, stream));
  in_flight_.push_back({begin, end, event});
  head_ = end;
}

// ---- batch uploads ----

UploadQueue::UploadQueue(cudaStream_t compute, PinnedRing& ring) : compute_(compute), ring_(ring) {
  HPCTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  for (Slot& slot : slots_) {
    HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    HPCTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&slot.consumed, cudaEventDisableTiming));
  }
}

UploadQueue::~UploadQueue() {
  if (copy_stream_ != nullptr) HPCTRAIN_CUDA_WARN(cudaStreamSynchronize(copy_stream_));
  for (const auto& [pointer, bytes] : pinned_) HPCTRAIN_CUDA_WARN(cudaHostUnregister(const_cast<char*>(pointer)));
  for (Slot& slot : slots_) {
    if (slot.copied != nullptr) HPCTRAIN_CUDA_WARN(cudaEventDestroy(slot.copied));
    if (slot.consumed != nullptr) HPCTRAIN_CUDA_WARN(cudaEventDestroy(slot.consumed));
  }
  if (copy_stream_ != nullptr) HPCTRAIN_CUDA_WARN(cudaStreamDestroy(copy_stream_));
}

bool UploadQueue::pin(const void* pointer, std::size_t bytes) {
  if (pointer == nullptr || bytes == 0) return false;
  if (pinned(pointer, bytes)) return true;
  const cudaError_t status = cudaHostRegister(const_cast<void*>(pointer), bytes, cudaHostRegisterDefault);
  if (status != cudaSuccess) {  // e.g. already registered by someone else, or the lock limit: copy through the ring
    (void)cudaGetLastError();
    return false;
  }
  pinned_[static_cast<const char*>(pointer)] = bytes;
  return true;
}

void UploadQueue::unpin(const void* pointer) {
  const auto found = pinned_.find(static_cast<const char*>(pointer));
  if (found == pinned_.end()) return;
  // A copy from it may still be queued.
  HPCTRAIN_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  HPCTRAIN_CUDA_CHECK(cudaHostUnregister(const_cast<void*>(pointer)));
  pinned_.erase(found);
}

bool UploadQueue::pinned(const void* pointer, std::size_t bytes) const {
  const auto* start = static_cast<const char*>(pointer);
  auto found = pinned_.upper_bound(start);
  if (found == pinned_.begin()) return false;
  --found;
  return start + bytes <= found->first + found->second;
}

void UploadQueue::upload(const float* source, const TensorView& destination, const WaitMonitor& monitor) {
  const std::size_t bytes = static_cast<std::size_t>(destination.size()) * sizeof(float);
  if (bytes == 0) return;
  // Small batches: through the ring on the compute stream (ordered after the step before, which is about as early).
  constexpr std::size_t small = std::size_t{1} << 20;
  if (bytes <= small && destination.dtype == DType::f32) {
    ring_.upload(destination.data, source, bytes, compute_, monitor);
    return;
  }
  Slot& slot = slots_[next_];
  next_ ^= 1;
  void* staged = slot.buffer.reserve(bytes);
  const bool direct = pinned(source, bytes);
  if (bytes <= small) {
    ring_.upload(staged, source, bytes, compute_, monitor);
  } else {
    // The slot's previous batch must have been consumed by the compute stream before it is overwritten.
    if (slot.used) HPCTRAIN_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, slot.consumed, 0));
    if (direct) {
      HPCTRAIN_CUDA_CHECK(cudaMemcpyAsync(staged, source, bytes, cudaMemcpyHostToDevice, copy_stream_));
    } else {
      const std::size_t chunk = ring_.capacity() / 4;
      for (std::size_t first = 0; first < bytes; first += chunk)
        ring_.upload(static_cast<char*>(staged) + first, reinterpret_cast<const char*>(source) + first,
                     std::min(chunk, bytes - first), copy_stream_, monitor);
    }
    HPCTRAIN_CUDA_CHECK(cudaEventRecord(slot.copied, copy_stream_));
    HPCTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, slot.copied, 0));
  }
  cast(compute_, {staged, DType::f32, destination.rows, destination.cols}, destination);
  HPCTRAIN_CUDA_CHECK(cudaEventRecord(slot.consumed, compute_));
  slot.used = true;
  // A pinned source is read by the DMA itself: the caller may overwrite it only after the copy (which overlaps the
  // step still computing, not this one).
  if (direct && bytes > small) wait_for_event(slot.copied, monitor);
}

}  // namespace hpctrain::cuda
