// Where the time of a checkpoint write or read goes, for measuring it (docs/performance.md): with the environment
// variable HPCTRAIN_CHECKPOINT_PHASES set, rank 0 prints one line per write or read to stderr with the wall time of
// each phase. Off (the default), a phase costs one branch.
#pragma once

#include <string>

namespace hpctrain {

// copy: between the backend's buffers and host vectors (none on the CPU backend); commit: the flushes and renames of
// the file and its `latest` (and `best`) pointer; rotate: removing checkpoints beyond checkpoint.keep.
enum class CheckpointPhase {
  other,
  copy,
  create_open,
  metadata,
  data,
  checksum,
  gather,
  agree,
  close,
  commit,
  rotate,
  count
};

// Charges the wall time from construction to destruction to `phase` (the phase that was running resumes afterwards:
// nested scopes give exclusive times).
class CheckpointPhaseScope {
 public:
  explicit CheckpointPhaseScope(CheckpointPhase phase);
  ~CheckpointPhaseScope();
  CheckpointPhaseScope(const CheckpointPhaseScope&) = delete;
  CheckpointPhaseScope& operator=(const CheckpointPhaseScope&) = delete;

 private:
  CheckpointPhase previous_;
};

// Starts timing a write or read (clears the times); checkpoint_phases_report prints them on rank 0 (`operation`:
// "write", "read") when timing is on.
void checkpoint_phases_start();
void checkpoint_phases_report(const std::string& operation, bool is_root);

}  // namespace hpctrain
