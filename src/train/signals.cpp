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

// The signals checkpoint.on_signal may name (src/config validates the deck against the same names).
struct NamedSignal {
  const char* name;
  int number;
};
constexpr NamedSignal checkpoint_signals[] = {
    {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"INT", SIGINT}, {"HUP", SIGHUP}};

int signal_number_of(const std::string& name) {
  std::string names;
  for (const NamedSignal& signal : checkpoint_signals) {
    if (name == signal.name) return signal.number;
    names += std::string(names.empty() ? "" : ", ") + signal.name;
  }
  throw InputError("checkpoint.on_signal: unknown signal '" + name + "'", "use one of " + names);
}
}  // namespace

void install_checkpoint_signals(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    struct sigaction action {};
    action.sa_handler = record_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(signal_number_of(name), &action, nullptr);
  }
}

int pending_checkpoint_signal() { return received_signal; }

std::string signal_name(int signal_number) {
  for (const NamedSignal& signal : checkpoint_signals)
    if (signal.number == signal_number) return std::string("SIG") + signal.name;
  return "signal " + std::to_string(signal_number);
}

}  // namespace hpctrain
