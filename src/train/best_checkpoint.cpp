// The best-checkpoint decision: improvement by more than min_delta in the metric's direction, NaN never improving,
// patience counted in evaluations.
#include "hpctrain/train/best_checkpoint.hpp"

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"

namespace hpctrain {

BestTracker::BestTracker(MetricGoal goal, double min_delta, std::int64_t patience)
    : goal_(goal), min_delta_(min_delta), patience_(patience) {}

Observation BestTracker::observe(std::int64_t step, double value) {
  Observation observation;
  // Written so that a NaN comparison is false: a NaN (or an infinite value) never becomes the best.
  if (std::isfinite(value)) {
    if (!state_.has_best())
      observation.improved = true;
    else if (goal_ == MetricGoal::minimize)
      observation.improved = value < state_.value - min_delta_;
    else
      observation.improved = value > state_.value + min_delta_;
  }
  if (observation.improved) {
    state_.step = step;
    state_.value = value;
    state_.stale_evaluations = 0;
  } else {
    ++state_.stale_evaluations;
  }
  observation.stop = patience_exhausted();
  return observation;
}

bool BestTracker::patience_exhausted() const { return patience_ > 0 && state_.stale_evaluations >= patience_; }

MetricGoal goal_of(BestMetric metric) {
  switch (metric) {
    case BestMetric::accuracy:
    case BestMetric::top5_accuracy:
    case BestMetric::r2:
      return MetricGoal::maximize;
    default:
      return MetricGoal::minimize;
  }
}

double metric_value(const EvalMetrics& metrics, BestMetric metric) {
  switch (metric) {
    case BestMetric::loss:
      return metrics.loss;
    case BestMetric::accuracy:
      return metrics.accuracy;
    case BestMetric::top5_accuracy:
      return metrics.top5_accuracy;
    case BestMetric::mae:
      return metrics.mae;
    case BestMetric::mse:
      return metrics.mse;
    case BestMetric::r2:
      return metrics.r2;
    case BestMetric::none:
      break;
  }
  return NAN;
}

BestTracker tracker_for(const RunConfig& config) {
  return BestTracker(goal_of(config.checkpoint.best_metric), config.train.early_stopping_min_delta,
                     config.train.early_stopping_patience);
}

void check_best_metric_computed(const RunConfig& config, TaskKind task, std::int64_t outputs) {
  const BestMetric metric = config.checkpoint.best_metric;
  HPCTRAIN_VERIFY(metric != BestMetric::top5_accuracy || (task == TaskKind::classification && outputs > 5), InputError,
                  config.where("checkpoint.best_metric")
                      << ": checkpoint.best_metric = \"top5_accuracy\" but the model has " << outputs
                      << " outputs: top-5 accuracy is computed with more than 5 classes only",
                  "use best_metric = \"accuracy\" (or \"loss\")");
}

std::string describe_best(BestMetric metric, const BestState& state) {
  if (!state.has_best()) return "no best validation " + std::string(word_of(metric)) + " yet";
  return "validation " + std::string(word_of(metric)) + " " + number_text(state.value) + " at step " +
         std::to_string(state.step);
}

std::string observation_note(BestMetric metric, const BestTracker& tracker, const Observation& seen) {
  if (seen.improved) return "new best " + std::string(word_of(metric));
  const BestState& state = tracker.state();
  return "best: " + describe_best(metric, state) + "; " + std::to_string(state.stale_evaluations) +
         (tracker.patience() > 0 ? " of " + std::to_string(tracker.patience()) : std::string()) +
         " evaluations without improvement";
}

std::string early_stopping_reason(BestMetric metric, const BestTracker& tracker) {
  return "validation " + std::string(word_of(metric)) + " did not improve by more than " +
         number_text(tracker.min_delta()) + " in " + std::to_string(tracker.patience()) +
         " evaluations (train.early_stopping_patience)";
}

}  // namespace hpctrain
