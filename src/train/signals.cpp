// Signal handlers that only set a flag (async-signal-safe); everything else happens at the step boundary.
#include "hpctrain/train/signals.hpp"

#include <csignal>
#include <cstring>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

namespace {
volatile std::sig_atomic_t received_signal = 0;

extern "C" void record_signal(int signal_number) {
  if (received_signal == 0) received_signal = signal_number;  // a second signal while writing changes nothing
}

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
}  // namespace

void install_checkpoint_signals(const std::vector<CheckpointSignal>& signals) {
  for (const CheckpointSignal signal : signals) {
    struct sigaction action {};
    action.sa_handler = record_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    HPCTRAIN_VERIFY(sigaction(signal_number_of(signal), &action, nullptr) == 0, Error,
                    "installing the handler for SIG" << word_of(signal) << " failed: " << std::strerror(errno));
  }
}

int pending_checkpoint_signal() { return received_signal; }

std::string signal_name(int signal_number) {
  for (std::size_t index = 0; index < choice_words<CheckpointSignal>().size(); ++index) {
    const auto signal = static_cast<CheckpointSignal>(index);
    if (signal_number_of(signal) == signal_number) return "SIG" + std::string(word_of(signal));
  }
  return "signal " + std::to_string(signal_number);
}

}  // namespace hpctrain
