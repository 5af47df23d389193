// When a run evaluates and checkpoints: the intervals of the deck in steps (given in steps or in epochs), and rank 0's
// clock decisions (checkpoint.every_seconds, train.time_limit) as a pure function of the clock readings, so tests
// check them without a clock. The ranks agree on the clock decision through RunControl.
#pragma once

#include <cstdint>
#include <string>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/train/run_control.hpp"

namespace hpctrain {

// What rank 0's clock says before a step (seconds on RunClock's scale).
struct ClockReading {
  double now = 0.0;
  double last_checkpoint = 0.0;     // when the last checkpoint (or the run's loop) ended
  double started = 0.0;             // when the run started (train.time_limit counts from here)
  double recent_step = 0.0;         // moving average of the step time
  double longest_checkpoint = 1.0;  // the longest checkpoint write so far (at least 1 s)
};

class RunSchedule {
 public:
  // steps_per_epoch: full global batches per pass over data.train (epoch intervals become steps).
  RunSchedule(const RunConfig& config, std::int64_t steps_per_epoch);

  // Whether to evaluate after `step` steps (last: the run's last step, always evaluated).
  [[nodiscard]] bool evaluate_after(std::int64_t step, bool last) const;
  // Whether the step interval asks for a checkpoint after `step` steps.
  [[nodiscard]] bool checkpoint_after(std::int64_t step) const;
  // Rank 0's decision before a step: checkpoint_and_stop when the next steps and a checkpoint would not fit in
  // train.time_limit (3 x recent_step + 2 x longest_checkpoint), else checkpoint when checkpoint.every_seconds have
  // passed since the last checkpoint, else none.
  [[nodiscard]] ClockRequest clock_request(const ClockReading& clock) const;

  [[nodiscard]] std::int64_t evaluation_interval() const { return eval_every_; }        // steps; 0 = at the end only
  [[nodiscard]] std::int64_t checkpoint_interval() const { return checkpoint_every_; }  // steps; 0 = none
  // "checkpoints: every 100 steps, at least every 30 min (checkpoint.every_seconds), at the end; evaluation: every 50
  // steps and at the end" (for the log). at_end: checkpoint.at_end; validation: the run has a validation set.
  [[nodiscard]] std::string describe(bool at_end, bool validation) const;

 private:
  std::int64_t eval_every_ = 0, checkpoint_every_ = 0;
  double checkpoint_seconds_ = 0.0, time_limit_ = 0.0;
};

}  // namespace hpctrain
