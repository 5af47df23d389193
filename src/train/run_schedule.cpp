// Evaluation and checkpoint intervals in steps, and the clock decisions.
#include "hpctrain/train/run_schedule.hpp"

#include <limits>
#include <vector>

#include "hpctrain/core/numbers.hpp"

namespace hpctrain {

namespace {

// An interval in steps from one given in steps or in epochs (the deck allows one of the two). An interval longer than
// any run is never reached.
std::int64_t interval_steps(std::int64_t steps, std::int64_t epochs, std::int64_t steps_per_epoch) {
  if (steps > 0) return steps;
  std::int64_t result = 0;
  if (__builtin_mul_overflow(epochs, steps_per_epoch, &result)) return std::numeric_limits<std::int64_t>::max();
  return result;
}

std::string seconds_text(double seconds) {
  const auto whole = static_cast<std::int64_t>(seconds);
  if (static_cast<double>(whole) == seconds && whole >= 60 && whole % 60 == 0)
    return std::to_string(whole / 60) + " min";
  return number_text(seconds) + " s";
}

}  // namespace

RunSchedule::RunSchedule(const RunConfig& config, std::int64_t steps_per_epoch)
    : eval_every_(interval_steps(config.train.eval_every, config.train.eval_every_epochs, steps_per_epoch)),
      checkpoint_every_(interval_steps(config.checkpoint.every_steps, config.checkpoint.every_epochs, steps_per_epoch)),
      checkpoint_seconds_(config.checkpoint.every_seconds),
      time_limit_(config.train.time_limit.seconds) {}

bool RunSchedule::evaluate_after(std::int64_t step, bool last) const {
  return last || (eval_every_ > 0 && step % eval_every_ == 0);
}

bool RunSchedule::checkpoint_after(std::int64_t step) const {
  return checkpoint_every_ > 0 && step % checkpoint_every_ == 0;
}

ClockRequest RunSchedule::clock_request(const ClockReading& clock) const {
  if (time_limit_ > 0 &&
      clock.now - clock.started + 3 * clock.recent_step + 2 * clock.longest_checkpoint >= time_limit_)
    return ClockRequest::checkpoint_and_stop;
  if (checkpoint_seconds_ > 0 && clock.now - clock.last_checkpoint >= checkpoint_seconds_)
    return ClockRequest::checkpoint;
  return ClockRequest::none;
}

std::string RunSchedule::describe(bool at_end, bool validation) const {
  std::vector<std::string> when;
  if (checkpoint_every_ > 0) when.push_back("every " + std::to_string(checkpoint_every_) + " steps");
  if (checkpoint_seconds_ > 0)
    when.push_back("at least every " + seconds_text(checkpoint_seconds_) + " (checkpoint.every_seconds)");
  if (at_end) when.push_back("at the end");
  std::string text = "checkpoints: ";
  for (std::size_t i = 0; i < when.size(); ++i) text += (i > 0 ? ", " : "") + when[i];
  if (when.empty()) text += "on a signal or train.time_limit only";
  if (validation)
    text += "; evaluation: " + (eval_every_ > 0 ? "every " + std::to_string(eval_every_) + " steps and at the end"
                                                : std::string("at the end"));
  return text;
}

}  // namespace hpctrain
