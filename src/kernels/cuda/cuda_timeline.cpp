// Phase timing of the CUDA backend with events and NVTX ranges (see cuda_timeline.hpp).
#include "cuda_timeline.hpp"

#include <nvtx3/nvToolsExt.h>

#include "hpctrain/kernels/cuda/cuda_check.hpp"

namespace hpctrain::cuda {

PhaseTimeline::~PhaseTimeline() {
  if (range_open_) nvtxRangePop();
  for (const Mark& mark : marks_) HPCTRAIN_CUDA_WARN(cudaEventDestroy(mark.event));
  for (cudaEvent_t event : spare_) HPCTRAIN_CUDA_WARN(cudaEventDestroy(event));
}

void PhaseTimeline::mark(int phase, const char* name) {
  if (range_open_) nvtxRangePop();
  range_open_ = phase >= 0;
  if (range_open_) nvtxRangePushA(name);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  HPCTRAIN_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;  // an event in a graph would time replays, not this step
  cudaEvent_t event = nullptr;
  if (spare_.empty()) {
    HPCTRAIN_CUDA_CHECK(cudaEventCreate(&event));
  } else {
    event = spare_.back();
    spare_.pop_back();
  }
  HPCTRAIN_CUDA_CHECK(cudaEventRecord(event, stream_));
  marks_.push_back({phase >= 0 && phase < max_phases ? phase : -1, event});
  if (marks_.size() > 1024) resolve();
}

void PhaseTimeline::resolve() {
  while (marks_.size() >= 2) {
    const cudaError_t state = cudaEventQuery(marks_[1].event);
    if (state == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return;
    }
    HPCTRAIN_CUDA_CHECK(state);
    float milliseconds = 0.0f;
    HPCTRAIN_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, marks_[0].event, marks_[1].event));
    if (marks_[0].phase >= 0) seconds_[static_cast<std::size_t>(marks_[0].phase)] += 1e-3 * milliseconds;
    spare_.push_back(marks_[0].event);
    marks_.pop_front();
  }
}

std::vector<double> PhaseTimeline::seconds(const WaitMonitor& monitor) {
  if (!marks_.empty()) wait_for_event(marks_.back().event, monitor);
  resolve();
  return {seconds_.begin(), seconds_.end()};
}

}  // namespace hpctrain::cuda
