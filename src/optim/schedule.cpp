// Learning-rate schedules. Warm-up ramps linearly to the base rate over warmup_steps (step 0 already gets
// base/warmup, as PyTorch's LinearLR-style warm-ups do, so no step runs at rate 0).
#include "hpctrain/optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "hpctrain/config/run_config.hpp"

namespace hpctrain {

LearningRateSchedule::LearningRateSchedule(const ScheduleSection& schedule, double base_lr, std::int64_t total_steps,
                                           std::int64_t origin)
    : kind_(schedule.type),
      base_lr_(base_lr),
      min_lr_(schedule.min_lr),
      gamma_(schedule.gamma),
      warmup_(schedule.warmup_steps),
      step_size_(std::max<std::int64_t>(schedule.step_size, 1)),
      total_(std::max<std::int64_t>(total_steps - origin, 1)),
      origin_(origin) {}

double LearningRateSchedule::at(std::int64_t run_step) const {
  const std::int64_t step = run_step - origin_;
  if (step < warmup_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  const std::int64_t after_warmup = step - warmup_;
  switch (kind_) {
    case ScheduleKind::constant:
      return base_lr_;
    case ScheduleKind::step:
      return base_lr_ * std::pow(gamma_, static_cast<double>(after_warmup / step_size_));
    case ScheduleKind::cosine: {
      const double span = static_cast<double>(std::max<std::int64_t>(total_ - warmup_, 1));
      const double progress = std::min(1.0, static_cast<double>(after_warmup) / span);
      return min_lr_ + 0.5 * (base_lr_ - min_lr_) * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return base_lr_;
}

}  // namespace hpctrain
