// The best checkpoint and early stopping: which validation metric decides (checkpoint.best_metric) and in which
// direction, and the decision after each evaluation (BestTracker: a new best? patience exhausted?). The tracker's
// state is part of every checkpoint of a run that watches a metric, so a resumed run decides as an uninterrupted one.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/train/evaluation.hpp"

namespace hpctrain {

// What a checkpoint keeps of the decision (/train/best_step, /train/best_value,
// /train/evaluations_without_improvement).
struct BestState {
  std::int64_t step = -1;              // step of the best evaluation; -1 before the first finite value
  double value = NAN;                  // its metric value
  std::int64_t stale_evaluations = 0;  // evaluations after the best one (or from the start) without improvement
  [[nodiscard]] bool has_best() const { return step >= 0; }
  bool operator==(const BestState& other) const {
    return step == other.step && stale_evaluations == other.stale_evaluations &&
           (value == other.value || (std::isnan(value) && std::isnan(other.value)));
  }
};

enum class MetricGoal { minimize, maximize };

struct Observation {
  bool improved = false;  // a new best: this step's checkpoint becomes checkpoints/best
  bool stop = false;      // patience exhausted: stop training now
};

class BestTracker {
 public:
  // min_delta: an improvement beats the best by more than this; patience: evaluations in a row without improvement
  // that stop the run (0: never).
  BestTracker(MetricGoal goal, double min_delta, std::int64_t patience);

  // One evaluation's value after `step`. A value that is not finite (NaN, inf) never improves; the first finite one
  // always does.
  Observation observe(std::int64_t step, double value);

  [[nodiscard]] bool patience_exhausted() const;
  [[nodiscard]] const BestState& state() const { return state_; }
  void restore(const BestState& state) { state_ = state; }
  [[nodiscard]] MetricGoal goal() const { return goal_; }
  [[nodiscard]] std::int64_t patience() const { return patience_; }
  [[nodiscard]] double min_delta() const { return min_delta_; }

 private:
  MetricGoal goal_;
  double min_delta_;
  std::int64_t patience_;
  BestState state_;
};

// Larger is better for accuracy, top5_accuracy and r2; smaller for loss, mae and mse.
MetricGoal goal_of(BestMetric metric);

// The metric's value in an evaluation (NaN when the evaluation has none).
double metric_value(const EvalMetrics& metrics, BestMetric metric);

// The tracker a run's deck asks for (checkpoint.best_metric, train.early_stopping_*).
BestTracker tracker_for(const RunConfig& config);

// Checks that the run computes checkpoint.best_metric (the deck reader checked the task; top5_accuracy also needs more
// than 5 classes). Throws InputError naming the key.
void check_best_metric_computed(const RunConfig& config, TaskKind task, std::int64_t outputs);

// "validation accuracy 0.9731 at step 400", or "no best validation accuracy yet" (for the log).
std::string describe_best(BestMetric metric, const BestState& state);

// What an evaluation's log line adds: "new best accuracy", or "best: validation accuracy 0.97 at step 40; 2 of 3
// evaluations without improvement".
std::string observation_note(BestMetric metric, const BestTracker& tracker, const Observation& seen);

// Why early stopping ended a run: "validation accuracy did not improve by more than 0 in 3 evaluations
// (train.early_stopping_patience)" (train.log and metrics.h5's `early_stopping`).
std::string early_stopping_reason(BestMetric metric, const BestTracker& tracker);

}  // namespace hpctrain
