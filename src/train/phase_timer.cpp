// Per-phase step timing for --profile.
#include "hpctrain/train/phase_timer.hpp"

#include <mpi.h>

#include <cstdio>

namespace hpctrain {

namespace {
const char* const phase_names[] = {"data wait",       "forward + loss", "backward",
                                   "all-reduce wait", "optimizer",      "evaluation"};
}

void PhaseTimer::begin(Phase phase) {
  if (!enabled_) return;
  end();
  current_ = static_cast<int>(phase);
  started_ = MPI_Wtime();
}

void PhaseTimer::end() {
  if (!enabled_ || current_ < 0) return;
  seconds_[static_cast<std::size_t>(current_)] += MPI_Wtime() - started_;
  current_ = -1;
}

std::string PhaseTimer::report(long long steps) const {
  double total = 0.0;
  for (double seconds : seconds_) total += seconds;
  std::string text = "profile (rank 0):\n  phase              total s   ms/step   share\n";
  char line[128];
  for (std::size_t i = 0; i < seconds_.size(); ++i) {
    std::snprintf(line, sizeof line, "  %-17s %9.3f %9.3f %6.1f%%\n", phase_names[i], seconds_[i],
                  steps > 0 ? 1e3 * seconds_[i] / static_cast<double>(steps) : 0.0,
                  total > 0 ? 100.0 * seconds_[i] / total : 0.0);
    text += line;
  }
  return text;
}

}  // namespace hpctrain
