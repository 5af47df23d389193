// Wall-clock time per phase of the training step (--profile): where a step's time goes. On the CPU backend every
// kernel is synchronous, so host timestamps around a phase measure it.
#pragma once

#include <array>
#include <string>

namespace hpctrain {

enum class Phase { data, forward, backward, allreduce, optimizer, evaluation, count };

class PhaseTimer {
 public:
  explicit PhaseTimer(bool enabled) : enabled_(enabled) {}
  [[nodiscard]] bool enabled() const { return enabled_; }
  void begin(Phase phase);  // ends the phase that was running
  void end();
  // A table: phase, seconds, share of the total (rank 0's view; `steps` for per-step times).
  [[nodiscard]] std::string report(long long steps) const;

 private:
  bool enabled_;
  int current_ = -1;
  double started_ = 0.0;
  std::array<double, static_cast<std::size_t>(Phase::count)> seconds_{};
};

}  // namespace hpctrain
