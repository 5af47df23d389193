// Checkpoint signals through one watcher thread. The signals are blocked in every other thread (the mask is set in
// main before MPI or any thread starts, and threads inherit it), so they never interrupt MPI's progress engine, the
// data loader or a system call; the watcher takes them with sigwait and only sets a flag, which the trainer reads at
// step boundaries. A signal the deck does not checkpoint on gets its default action, as if nothing had been installed.
#include "hpctrain/train/signals.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

namespace {

constexpr std::size_t signal_count = choice_words<CheckpointSignal>().size();

int signal_number_of(CheckpointSignal signal) {
  switch (signal) {
    case CheckpointSignal::usr1:
      return SIGUSR1;
    case CheckpointSignal::usr2:
      return SIGUSR2;
    case CheckpointSignal::term:
      return SIGTERM;
    case CheckpointSignal::interrupt:
      return SIGINT;
    case CheckpointSignal::hangup:
      return SIGHUP;
  }
  return 0;
}

std::atomic<int> received_signal{0};
std::atomic<bool> checkpointing[signal_count];  // per CheckpointSignal: checkpoint on it (else its default action)
std::atomic<bool> watching{false};

sigset_t watched_set() {
  sigset_t set;
  sigemptyset(&set);
  for (std::size_t index = 0; index < signal_count; ++index)
    sigaddset(&set, signal_number_of(static_cast<CheckpointSignal>(index)));
  return set;
}

// The default action of a signal (ending the process), delivered to the calling thread. Should the action or the mask
// not change (raise would then return), the process still ends, with the status a shell reports for that signal.
void act_by_default(int number) {
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, number);
  int status = std::signal(number, SIG_DFL) == SIG_ERR ? errno : pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  if (status == 0 && std::raise(number) != 0) status = errno;
  std::fprintf(stderr, "hpctrain: ending on %s without its default action (%s)\n", signal_name(number).c_str(),
               status != 0 ? std::strerror(status) : "the signal was not delivered");
  std::_Exit(128 + number);
}

void watch(sigset_t set) {
  while (true) {
    int number = 0;
    if (sigwait(&set, &number) != 0) continue;
    std::size_t index = 0;
    while (index < signal_count && signal_number_of(static_cast<CheckpointSignal>(index)) != number) ++index;
    if (index < signal_count && checkpointing[index].load()) {
      int none = 0;
      received_signal.compare_exchange_strong(none, number);  // a second signal while writing changes nothing
      continue;
    }
    act_by_default(number);  // not a checkpoint signal of this run
  }
}

}  // namespace

void record_checkpoint_signals_early(const std::vector<CheckpointSignal>& signals) {
  for (const CheckpointSignal signal : signals) checkpointing[static_cast<std::size_t>(signal)] = true;
  const sigset_t set = watched_set();
  const int status = pthread_sigmask(SIG_BLOCK, &set, nullptr);
  HPCTRAIN_VERIFY(status == 0, Error, "blocking the checkpoint signals failed: " << std::strerror(status));
  std::thread(watch, set).detach();
  watching = true;
}

void install_checkpoint_signals(const std::vector<CheckpointSignal>& signals) {
  HPCTRAIN_ASSERT(watching.load(), "record_checkpoint_signals_early must run first (in main)");
  for (std::size_t index = 0; index < signal_count; ++index)
    checkpointing[index] =
        std::find(signals.begin(), signals.end(), static_cast<CheckpointSignal>(index)) != signals.end();
  // One that came during start-up but is not a checkpoint signal of this deck acts now, as it would have then.
  const int early = received_signal.load();
  for (std::size_t index = 0; index < signal_count; ++index)
    if (early == signal_number_of(static_cast<CheckpointSignal>(index)) && !checkpointing[index]) {
      received_signal = 0;
      act_by_default(early);
    }
}

int pending_checkpoint_signal() { return received_signal.load(); }

std::string signal_name(int signal_number) {
  for (std::size_t index = 0; index < signal_count; ++index) {
    const auto signal = static_cast<CheckpointSignal>(index);
    if (signal_number_of(signal) == signal_number) return "SIG" + std::string(word_of(signal));
  }
  return "signal " + std::to_string(signal_number);
}

}  // namespace hpctrain
