// Signal handlers that only set a flag (async-signal-safe); everything else happens at the step boundary.
#include "hpctrain/train/signals.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

namespace {
volatile std::sig_atomic_t received_signal = 0;

extern "C" void record_signal(int signal_number) {
  if (received_signal == 0) received_signal = signal_number;  // a second signal while writing changes nothing
}

int signal_number_of(const std::string& name) {
  if (name == "USR1") return SIGUSR1;
  if (name == "USR2") return SIGUSR2;
  if (name == "TERM") return SIGTERM;
  if (name == "INT") return SIGINT;
  if (name == "HUP") return SIGHUP;
  throw InputError("checkpoint.on_signal: unknown signal '" + name + "'", "use USR1, USR2, TERM, INT or HUP");
}
}  // namespace

void install_checkpoint_signals(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    struct sigaction action {};
    action.sa_handler = record_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (sigaction(signal_number_of(name), &action, nullptr) != 0)
      throw LibraryError("the C library", "sigaction(SIG" + name + ")", std::strerror(errno), __FILE__, __LINE__);
  }
}

int pending_checkpoint_signal() { return received_signal; }

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "signal " + std::to_string(signal_number);
  }
}

}  // namespace hpctrain
