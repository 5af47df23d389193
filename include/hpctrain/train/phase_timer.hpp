// Time per phase of the training step (--profile): where a step's time goes. On the CPU backend every kernel is
// synchronous, so host timestamps around a phase measure it. A backend with a timeline of its own (CUDA: events on its
// stream, NVTX ranges for profilers) marks the phases there instead, and the report gives device time: what the GPU
// spent between one phase's mark and the next, idle time waiting for the host (data) or for NCCL (all-reduce)
// included.
#pragma once

#include <array>
#include <string>

namespace hpctrain {

class Backend;

enum class Phase { data, forward, backward, allreduce, optimizer, evaluation, count };

class PhaseTimer {
 public:
  // backend: whose timeline to use when it has one (may be null: host time).
  explicit PhaseTimer(bool enabled, Backend* backend = nullptr);
  [[nodiscard]] bool enabled() const { return enabled_; }
  void begin(Phase phase);  // ends the phase that was running
  void end();
  // A table: phase, seconds, share of the total (rank 0's view; `steps` for per-step times). Waits for the backend's
  // marks when it times on its own timeline.
  [[nodiscard]] std::string report(long long steps) const;

 private:
  bool enabled_;
  Backend* backend_ = nullptr;
  bool device_time_ = false;  // the backend marks the phases on its timeline
  int current_ = -1;
  double started_ = 0.0;
  std::array<double, static_cast<std::size_t>(Phase::count)> seconds_{};
};

}  // namespace hpctrain
