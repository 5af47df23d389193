// Checkpoint-on-signal: the handler only records which signal came; the trainer asks at each step boundary, the ranks
// agree with a reduction (so a signal that reached one rank is enough), write a checkpoint and exit with
// exit_checkpointed so a job script can requeue.
#pragma once

#include <string>
#include <vector>

#include "hpctrain/config/choices.hpp"

namespace hpctrain {

// Exit status after a checkpoint written because of a signal or train.time_limit (EX_TEMPFAIL: "try again").
inline constexpr int exit_checkpointed = 75;

// Install handlers for the deck's checkpoint.on_signal signals.
void install_checkpoint_signals(const std::vector<CheckpointSignal>& signals);
// The signal number received since installation, or 0.
int pending_checkpoint_signal();
// "SIGUSR1"
std::string signal_name(int signal_number);

}  // namespace hpctrain
