// Per-phase step timing for --profile: host clocks, or the backend's own timeline (CUDA events).
#include "hpctrain/train/phase_timer.hpp"

#include <mpi.h>

#include <cstdio>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

namespace {
const char* const phase_names[] = {"data wait",       "forward + loss", "backward",
                                   "all-reduce wait", "optimizer",      "evaluation"};
}

PhaseTimer::PhaseTimer(bool enabled, Backend* backend) : enabled_(enabled), backend_(backend) {
  // A probe mark that ends nothing: tells whether the backend keeps a timeline.
  device_time_ = enabled_ && backend_ != nullptr && backend_->mark_phase(-1, "");
}

void PhaseTimer::begin(Phase phase) {
  if (!enabled_) return;
  if (device_time_) {
    backend_->mark_phase(static_cast<int>(phase), phase_names[static_cast<std::size_t>(phase)]);
    return;
  }
  end();
  current_ = static_cast<int>(phase);
  started_ = MPI_Wtime();
}

void PhaseTimer::end() {
  if (!enabled_) return;
  if (device_time_) {
    backend_->mark_phase(-1, "");
    return;
  }
  if (current_ < 0) return;
  seconds_[static_cast<std::size_t>(current_)] += MPI_Wtime() - started_;
  current_ = -1;
}

std::string PhaseTimer::report(long long steps) const {
  auto seconds = seconds_;
  if (device_time_) {
    const std::vector<double> device = backend_->phase_seconds();
    for (std::size_t i = 0; i < seconds.size() && i < device.size(); ++i) seconds[i] = device[i];
  }
  double total = 0.0;
  for (double value : seconds) total += value;
  std::string text = std::string("profile (rank 0, ") + (device_time_ ? "device time from CUDA events" : "host time") +
                     "):\n  phase              total s   ms/step   share\n";
  char line[128];
  for (std::size_t i = 0; i < seconds.size(); ++i) {
    std::snprintf(line, sizeof line, "  %-17s %9.3f %9.3f %6.1f%%\n", phase_names[i], seconds[i],
                  steps > 0 ? 1e3 * seconds[i] / static_cast<double>(steps) : 0.0,
                  total > 0 ? 100.0 * seconds[i] / total : 0.0);
    text += line;
  }
  return text;
}

}  // namespace hpctrain
