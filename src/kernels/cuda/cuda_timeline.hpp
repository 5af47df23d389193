// Phase timing of the CUDA backend (--profile): a timing event on the stream at each phase mark, and an NVTX range
// per phase for profilers (Nsight Systems shows them on the CPU thread). The time of a phase is the device time
// between its mark and the next one, so asynchronous work is charged to the phase that queued it, not to the host
// call that happened to wait for it. Marks are resolved as their events complete, without waiting; seconds() waits.
// Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <deque>
#include <vector>

#include "cuda_memory.hpp"

namespace hpctrain::cuda {

class PhaseTimeline {
 public:
  static constexpr int max_phases = 16;
  explicit PhaseTimeline(cudaStream_t stream) : stream_(stream) {}
  PhaseTimeline(const PhaseTimeline&) = delete;
  PhaseTimeline& operator=(const PhaseTimeline&) = delete;
  ~PhaseTimeline();

  // Ends the running phase and starts `phase` (-1: none). Nothing is recorded while the stream is being captured.
  void mark(int phase, const char* name);
  // Seconds per phase so far; waits for the marks queued (polling, with `monitor`).
  std::vector<double> seconds(const WaitMonitor& monitor);

 private:
  struct Mark {
    int phase;
    cudaEvent_t event;
  };
  void resolve();  // adds the intervals whose end has completed
  cudaStream_t stream_;
  std::deque<Mark> marks_;
  std::vector<cudaEvent_t> spare_;
  std::array<double, max_phases> seconds_{};
  bool range_open_ = false;
};

}  // namespace hpctrain::cuda
