// The clock of the trainer's time-based decisions: checkpoint.every_seconds, train.time_limit, and the step and
// checkpoint durations train.time_limit's estimate uses. Normally MPI_Wtime. The test hook
// HPCTRAIN_TEST_SECONDS_PER_STEP=S makes it simulated: it stands still except that each finished training step
// advances it by S seconds, so tests assert exact checkpoint steps and stop steps whatever the machine's speed.
#pragma once

#include <string>

namespace hpctrain {

class RunClock {
 public:
  RunClock();  // reads HPCTRAIN_TEST_SECONDS_PER_STEP; a value that is not a positive number is an InputError
  [[nodiscard]] double now() const;
  void step_finished();
  [[nodiscard]] bool simulated() const { return seconds_per_step_ > 0.0; }

 private:
  double seconds_per_step_ = 0.0;
  double simulated_seconds_ = 0.0;
};

// "H:MM:SS" (seconds rounded; negative as 0), for logs.
std::string format_duration(double seconds);

}  // namespace hpctrain
