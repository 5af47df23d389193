// Wall time per phase of checkpoint writes and reads, on when HPCTRAIN_CHECKPOINT_PHASES is set.
#include "hpctrain/io/checkpoint_phases.hpp"

#include <mpi.h>

#include <array>
#include <cstdio>
#include <cstdlib>

namespace hpctrain {

namespace {

constexpr std::array<const char*, static_cast<std::size_t>(CheckpointPhase::count)> phase_names = {
    "other", "copy", "create/open", "metadata", "data", "checksum", "gather", "agree", "close", "commit", "rotate"};

// One write or read at a time, on the main thread (checkpoints are collective calls of the training loop).
struct PhaseTimes {
  bool enabled = std::getenv("HPCTRAIN_CHECKPOINT_PHASES") != nullptr;
  CheckpointPhase current = CheckpointPhase::other;
  double since = 0.0, started = 0.0;
  std::array<double, phase_names.size()> seconds{};

  void switch_to(CheckpointPhase phase) {
    const double now = MPI_Wtime();
    seconds[static_cast<std::size_t>(current)] += now - since;
    since = now;
    current = phase;
  }
};

PhaseTimes& times() {
  static PhaseTimes state;
  return state;
}

}  // namespace

CheckpointPhaseScope::CheckpointPhaseScope(CheckpointPhase phase) : previous_(times().current) {
  if (times().enabled) times().switch_to(phase);
}

CheckpointPhaseScope::~CheckpointPhaseScope() {
  if (times().enabled) times().switch_to(previous_);
}

void checkpoint_phases_start() {
  PhaseTimes& state = times();
  if (!state.enabled) return;
  state.seconds.fill(0.0);
  state.current = CheckpointPhase::other;
  state.since = state.started = MPI_Wtime();
}

void checkpoint_phases_report(const std::string& operation, bool is_root) {
  PhaseTimes& state = times();
  if (!state.enabled) return;
  state.switch_to(CheckpointPhase::other);
  if (!is_root) return;
  std::string line = "checkpoint " + operation + " phases (ms):";
  char item[64];
  for (std::size_t i = 0; i < phase_names.size(); ++i)
    if (state.seconds[i] > 0.0) {
      std::snprintf(item, sizeof item, " %s %.2f", phase_names[i], 1e3 * state.seconds[i]);
      line += item;
    }
  std::snprintf(item, sizeof item, "; total %.2f", 1e3 * (MPI_Wtime() - state.started));
  std::fprintf(stderr, "%s%s\n", line.c_str(), item);
}

}  // namespace hpctrain
