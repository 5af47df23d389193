// Wall-clock or simulated time for the trainer's time-based decisions.
#include "hpctrain/train/run_clock.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "hpctrain/core/error.hpp"

namespace hpctrain {

RunClock::RunClock() {
  const char* text = std::getenv("HPCTRAIN_TEST_SECONDS_PER_STEP");
  if (text == nullptr || *text == '\0') return;
  char* end = nullptr;
  seconds_per_step_ = std::strtod(text, &end);
  HPCTRAIN_VERIFY(*end == '\0' && std::isfinite(seconds_per_step_) && seconds_per_step_ > 0.0, InputError,
                  "HPCTRAIN_TEST_SECONDS_PER_STEP='" << text << "' is not a positive number of seconds",
                  "unset it (it is a test hook that simulates the clock) or give e.g. 1.5");
}

double RunClock::now() const { return simulated() ? simulated_seconds_ : MPI_Wtime(); }

void RunClock::step_finished() { simulated_seconds_ += seconds_per_step_; }

std::string format_duration(double seconds) {
  const auto total = static_cast<long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", total / 3600, (total / 60) % 60, total % 60);
  return text;
}

}  // namespace hpctrain
