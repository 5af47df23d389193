// Checkpoint-on-signal: a watcher thread records which signal came (the signals are blocked in every other thread, so
// they never interrupt MPI or a system call); the trainer asks at each step boundary, the ranks agree with a reduction
// (so a signal that reached one rank is enough), write a checkpoint and exit with exit_checkpointed so a job script
// can requeue.
#pragma once

#include <string>
#include <vector>

#include "hpctrain/config/choices.hpp"

namespace hpctrain {

// Exit status after a checkpoint written because of a signal or train.time_limit (EX_TEMPFAIL: "try again").
inline constexpr int exit_checkpointed = 75;

// From the first instruction of `train` (in main, before MPI or any thread starts): block the checkpoint signals in
// this thread (and so in every thread started later) and start the watcher; these (the default checkpoint.on_signal)
// are recorded instead of ending the process, so a signal during start-up still ends in a checkpoint (launchers such
// as `timeout` signal mpiexec and the ranks together, at any moment).
void record_checkpoint_signals_early(const std::vector<CheckpointSignal>& signals);
// Install handlers for the deck's checkpoint.on_signal signals; early-recorded signals the deck does not list get
// their default action back (and act now if one already came).
void install_checkpoint_signals(const std::vector<CheckpointSignal>& signals);
// The signal number received since installation, or 0.
int pending_checkpoint_signal();
// "SIGUSR1"
std::string signal_name(int signal_number);

}  // namespace hpctrain
