// Learning-rate schedules: constant, linear warm-up + cosine, step decay (all with optional linear warm-up).
#pragma once

#include <cstdint>

#include "hpctrain/config/choices.hpp"

namespace hpctrain {

struct ScheduleSection;

class LearningRateSchedule {
 public:
  // origin: the step the schedule starts from (warm-up at origin, cosine down to total_steps); 0 but for a run
  // extended with its schedule restarted.
  LearningRateSchedule(const ScheduleSection& schedule, double base_lr, std::int64_t total_steps,
                       std::int64_t origin = 0);
  // The learning rate of optimizer step `step` (0-based).
  [[nodiscard]] double at(std::int64_t step) const;

 private:
  ScheduleKind kind_;
  double base_lr_, min_lr_, gamma_;
  std::int64_t warmup_, step_size_, total_, origin_;
};

}  // namespace hpctrain
