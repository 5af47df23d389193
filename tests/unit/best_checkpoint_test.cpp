// The best-checkpoint and early-stopping decision (train/best_checkpoint.hpp): improvement in the metric's direction by
// more than min_delta, NaN and infinities never improving, patience counted in evaluations, and a restored state
// deciding exactly as the uninterrupted tracker.
#include "hpctrain/train/best_checkpoint.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "hpctrain/core/error.hpp"

namespace hpctrain {
namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

struct Expected {
  bool improved, stop;
};

// Feeds values at steps 10, 20, 30, ... and checks each observation and where the best ends up.
void expect_sequence(BestTracker& tracker, const std::vector<double>& values, const std::vector<Expected>& expected) {
  ASSERT_EQ(values.size(), expected.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    SCOPED_TRACE("evaluation " + std::to_string(i) + " value " + std::to_string(values[i]));
    const auto step = static_cast<std::int64_t>(10 * (i + 1));
    const Observation seen = tracker.observe(step, values[i]);
    EXPECT_EQ(seen.improved, expected[i].improved);
    EXPECT_EQ(seen.stop, expected[i].stop);
    if (seen.improved) {
      EXPECT_EQ(tracker.state().step, step);
      EXPECT_EQ(tracker.state().value, values[i]);
      EXPECT_EQ(tracker.state().stale_evaluations, 0);
    }
  }
}

TEST(BestTracker, LossIsMinimisedAccuracyMaximised) {
  BestTracker loss(MetricGoal::minimize, 0.0, 0);
  expect_sequence(loss, {0.9, 0.7, 0.8, 0.7, 0.6},
                  {{true, false}, {true, false}, {false, false}, {false, false}, {true, false}});
  EXPECT_EQ(loss.state().step, 50);
  EXPECT_EQ(loss.state().value, 0.6);

  BestTracker accuracy(MetricGoal::maximize, 0.0, 0);
  expect_sequence(accuracy, {0.5, 0.7, 0.6, 0.7, 0.71},
                  {{true, false}, {true, false}, {false, false}, {false, false}, {true, false}});
  EXPECT_EQ(accuracy.state().step, 50);
  EXPECT_EQ(accuracy.state().stale_evaluations, 0);
}

TEST(BestTracker, NanAndInfinityNeverImprove) {
  // A NaN first: no best yet, and it counts against patience.
  BestTracker first(MetricGoal::minimize, 0.0, 3);
  expect_sequence(first, {nan, inf, 0.5, nan, -inf, 0.4},
                  {{false, false}, {false, false}, {true, false}, {false, false}, {false, false}, {true, false}});
  EXPECT_EQ(first.state().step, 60);
  EXPECT_EQ(first.state().value, 0.4);

  // Only NaN: never a best, and early stopping ends the run after `patience` of them.
  BestTracker only_nan(MetricGoal::maximize, 0.0, 2);
  expect_sequence(only_nan, {nan, nan}, {{false, false}, {false, true}});
  EXPECT_FALSE(only_nan.state().has_best());
  EXPECT_TRUE(std::isnan(only_nan.state().value));

  // NaN after a best, for either goal: the best stays.
  for (const MetricGoal goal : {MetricGoal::minimize, MetricGoal::maximize}) {
    BestTracker tracker(goal, 0.0, 0);
    expect_sequence(tracker, {0.5, nan, nan}, {{true, false}, {false, false}, {false, false}});
    EXPECT_EQ(tracker.state().value, 0.5);
    EXPECT_EQ(tracker.state().step, 10);
    EXPECT_EQ(tracker.state().stale_evaluations, 2);
  }
}

TEST(BestTracker, MinDeltaAndPatience) {
  // Improvements must beat the best by more than 0.05; three evaluations in a row without one stop the run.
  BestTracker tracker(MetricGoal::maximize, 0.05, 3);
  expect_sequence(tracker, {0.50, 0.54, 0.56, 0.60, 0.58, 0.605},
                  {{true, false}, {false, false}, {true, false}, {false, false}, {false, false}, {false, true}});
  EXPECT_EQ(tracker.state().step, 30);
  EXPECT_EQ(tracker.state().value, 0.56);
  EXPECT_TRUE(tracker.patience_exhausted());

  // Exactly min_delta better is not an improvement.
  BestTracker exact(MetricGoal::minimize, 0.25, 1);
  expect_sequence(exact, {1.0, 0.75}, {{true, false}, {false, true}});

  // Patience 0: never stops.
  BestTracker patient(MetricGoal::minimize, 0.0, 0);
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(patient.observe(i, 1.0 + i).stop);
  EXPECT_EQ(patient.state().stale_evaluations, 99);
  EXPECT_FALSE(patient.patience_exhausted());
}

TEST(BestTracker, RestoredStateDecidesAsTheUninterruptedTracker) {
  const std::vector<double> values = {0.9, 0.8, 0.85, nan, 0.79, 0.81, 0.82, 0.83, 0.7};
  BestTracker whole(MetricGoal::minimize, 0.005, 3);
  std::vector<Observation> uninterrupted;
  for (std::size_t i = 0; i < values.size(); ++i) uninterrupted.push_back(whole.observe(10 * (i + 1), values[i]));

  for (std::size_t cut = 0; cut <= values.size(); ++cut) {
    SCOPED_TRACE("resumed after evaluation " + std::to_string(cut));
    BestTracker before(MetricGoal::minimize, 0.005, 3);
    for (std::size_t i = 0; i < cut; ++i) before.observe(10 * (i + 1), values[i]);
    BestTracker after(MetricGoal::minimize, 0.005, 3);
    after.restore(before.state());
    for (std::size_t i = cut; i < values.size(); ++i) {
      const Observation seen = after.observe(10 * (i + 1), values[i]);
      EXPECT_EQ(seen.improved, uninterrupted[i].improved) << i;
      EXPECT_EQ(seen.stop, uninterrupted[i].stop) << i;
    }
    EXPECT_TRUE(after.state() == whole.state());
  }
  // The sequence stops at evaluation 8 (0.81, 0.82, 0.83 after the best 0.79): the test above covered a stop.
  EXPECT_TRUE(uninterrupted[7].stop);
}

TEST(BestTracker, LogTexts) {
  BestTracker tracker(MetricGoal::maximize, 0.0, 3);
  EXPECT_EQ(describe_best(BestMetric::accuracy, tracker.state()), "no best validation accuracy yet");
  const Observation first = tracker.observe(40, 0.75);
  EXPECT_EQ(observation_note(BestMetric::accuracy, tracker, first), "new best accuracy");
  const Observation second = tracker.observe(80, 0.5);
  EXPECT_EQ(observation_note(BestMetric::accuracy, tracker, second),
            "best: validation accuracy 0.75 at step 40; 1 of 3 evaluations without improvement");
  EXPECT_EQ(early_stopping_reason(BestMetric::accuracy, tracker),
            "validation accuracy did not improve by more than 0 in 3 evaluations (train.early_stopping_patience)");
}

TEST(BestMetricChoice, DirectionAndValue) {
  EXPECT_EQ(goal_of(BestMetric::loss), MetricGoal::minimize);
  EXPECT_EQ(goal_of(BestMetric::mae), MetricGoal::minimize);
  EXPECT_EQ(goal_of(BestMetric::mse), MetricGoal::minimize);
  EXPECT_EQ(goal_of(BestMetric::accuracy), MetricGoal::maximize);
  EXPECT_EQ(goal_of(BestMetric::top5_accuracy), MetricGoal::maximize);
  EXPECT_EQ(goal_of(BestMetric::r2), MetricGoal::maximize);

  EvalMetrics metrics;
  metrics.loss = 0.25;
  metrics.accuracy = 0.5;
  metrics.top5_accuracy = 0.75;
  metrics.mae = 1.5;
  metrics.mse = 2.5;
  metrics.r2 = -0.5;
  EXPECT_EQ(metric_value(metrics, BestMetric::loss), 0.25);
  EXPECT_EQ(metric_value(metrics, BestMetric::accuracy), 0.5);
  EXPECT_EQ(metric_value(metrics, BestMetric::top5_accuracy), 0.75);
  EXPECT_EQ(metric_value(metrics, BestMetric::mae), 1.5);
  EXPECT_EQ(metric_value(metrics, BestMetric::mse), 2.5);
  EXPECT_EQ(metric_value(metrics, BestMetric::r2), -0.5);
  EXPECT_TRUE(std::isnan(metric_value(metrics, BestMetric::none)));
}

TEST(BestMetricChoice, TopFiveNeedsMoreThanFiveClasses) {
  RunConfig config;
  config.deck_path = "deck.toml";
  config.checkpoint.best_metric = BestMetric::top5_accuracy;
  EXPECT_NO_THROW(check_best_metric_computed(config, TaskKind::classification, 10));
  try {
    check_best_metric_computed(config, TaskKind::classification, 5);
    FAIL() << "no error";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("top-5 accuracy is computed with more than 5 classes only"),
              std::string::npos)
        << error.what();
  }
  config.checkpoint.best_metric = BestMetric::accuracy;
  EXPECT_NO_THROW(check_best_metric_computed(config, TaskKind::classification, 2));
}

}  // namespace
}  // namespace hpctrain
