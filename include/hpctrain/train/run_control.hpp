// What the ranks agree on after every step, in one small all-reduce: whether any rank has seen a checkpoint signal,
// and rank 0's time-based decision (its clock decides for everyone, so all ranks checkpoint and stop at the same step).
#pragma once

#include <mpi.h>

namespace hpctrain {

// Rank 0's clock: nothing, a checkpoint now (checkpoint.every_seconds), or a checkpoint and stop (train.time_limit).
enum class ClockRequest { none, checkpoint, checkpoint_and_stop };

struct RunControl {
  bool signal_seen = false;                 // in: this rank's; out: any rank's
  ClockRequest clock = ClockRequest::none;  // in: rank 0's (other ranks' are ignored); out: rank 0's

  // Collective: combines every rank's message in place.
  void agree(MPI_Comm world);
};

}  // namespace hpctrain
