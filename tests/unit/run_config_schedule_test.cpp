// Deck keys of the checkpoint and evaluation schedule: intervals in epochs, the periodic checkpoint's default and its
// `false`, checkpoint.best_metric against the task, and early stopping's keys; their errors and the resolved deck.
#include <gtest/gtest.h>

#include "hpctrain/config/run_config.hpp"
#include "run_config_test_support.hpp"

namespace hpctrain {
namespace {

using namespace deck_test;

const std::string with_validation =
    "[data]\n"
    "train = \"train.h5\"\n"
    "validation = \"validation.h5\"\n"
    "\n"
    "[train]\n"
    "steps = 100\n"
    "\n"
    "[[model.layers]]\n"
    "type = \"linear\"\n"
    "out = 10\n";

TEST(ScheduleKeys, Defaults) {
  const RunConfig config = parse(minimal_body);
  EXPECT_EQ(config.checkpoint.every_seconds, 1800.0);  // a checkpoint at least every 30 minutes
  EXPECT_EQ(config.checkpoint.every_epochs, 0);
  EXPECT_EQ(config.checkpoint.best_metric, BestMetric::none);
  EXPECT_EQ(config.train.eval_every_epochs, 0);
  EXPECT_EQ(config.train.early_stopping_patience, 0);
  EXPECT_EQ(config.train.early_stopping_min_delta, 0.0);
  EXPECT_CONTAINS(to_toml(config), "every_seconds = 1800.0\n");
  EXPECT_CONTAINS(to_toml(config), "best_metric = \"none\"\n");
}

TEST(ScheduleKeys, PeriodicCheckpointTurnedOff) {
  EXPECT_EQ(parse(deck_with("checkpoint.every_seconds", "false")).checkpoint.every_seconds, 0.0);
  EXPECT_EQ(parse(deck_with("checkpoint.every_seconds", "0")).checkpoint.every_seconds, 0.0);
  EXPECT_EQ(parse(minimal_body, {"checkpoint.every_seconds=false"}).checkpoint.every_seconds, 0.0);
  EXPECT_EQ(parse(minimal_body, {"checkpoint.every_seconds=600"}).checkpoint.every_seconds, 600.0);
  const CaughtError on = error_of(deck_with("checkpoint.every_seconds", "true"));
  EXPECT_CONTAINS(on.message,
                  "decks/test.toml:2:1: checkpoint.every_seconds must be a number of seconds, or false (off), got a "
                  "boolean (true)");
}

TEST(ScheduleKeys, EpochIntervalsAndTheirConflicts) {
  const RunConfig config =
      parse(minimal_body, {"train.eval_every_epochs=2", "checkpoint.every_epochs=3", "checkpoint.every_seconds=0"});
  EXPECT_EQ(config.train.eval_every_epochs, 2);
  EXPECT_EQ(config.checkpoint.every_epochs, 3);
  {  // the resolved deck keeps them
    const RunConfig again = parse(to_toml(config));
    EXPECT_EQ(again.train.eval_every_epochs, 2);
    EXPECT_EQ(again.checkpoint.every_epochs, 3);
    EXPECT_EQ(again.checkpoint.every_seconds, 0.0);
  }
  const CaughtError both_eval = error_of(minimal_body, {"train.eval_every=10", "train.eval_every_epochs=1"});
  EXPECT_CONTAINS(both_eval.message,
                  "train.eval_every (10) and train.eval_every_epochs (1) are both set: give the interval in steps or "
                  "in epochs");
  const CaughtError both_checkpoint = error_of(deck_with("checkpoint.every_steps", "5"), {"checkpoint.every_epochs=2"});
  EXPECT_CONTAINS(both_checkpoint.message,
                  "--set checkpoint.every_epochs=2: checkpoint.every_steps (5) and "
                  "checkpoint.every_epochs (2) are both set");
  EXPECT_CONTAINS(error_of(deck_with("checkpoint.every_epochs", "-1")).message,
                  "checkpoint.every_epochs must be >= 0 (got -1)");
}

TEST(ScheduleKeys, BestMetricMustBeComputedByTheRun) {
  const RunConfig classification = parse(with_validation, {"checkpoint.best_metric=accuracy"});
  EXPECT_EQ(classification.checkpoint.best_metric, BestMetric::accuracy);
  EXPECT_EQ(parse(to_toml(classification)).checkpoint.best_metric, BestMetric::accuracy);
  EXPECT_EQ(parse(with_validation, {"checkpoint.best_metric=r2", "model.loss=mse"}).checkpoint.best_metric,
            BestMetric::r2);

  const CaughtError wrong_task = error_of(with_validation, {"checkpoint.best_metric=r2"});
  EXPECT_CONTAINS(wrong_task.message,
                  "checkpoint.best_metric = \"r2\" is not computed by a model.loss = \"cross_entropy\" run: its "
                  "validation metrics are loss, accuracy, top5_accuracy");
  const CaughtError accuracy_of_regression =
      error_of(with_validation, {"checkpoint.best_metric=accuracy", "model.loss=mse"});
  EXPECT_CONTAINS(accuracy_of_regression.message, "its validation metrics are loss, mae, mse, r2");
  const CaughtError unknown = error_of(with_validation, {"checkpoint.best_metric=acc"});
  EXPECT_CONTAINS(unknown.message, "checkpoint.best_metric must be one of none, loss, accuracy");
  const CaughtError no_validation = error_of(minimal_body, {"checkpoint.best_metric=loss"});
  EXPECT_CONTAINS(no_validation.message, "needs a validation set, and data.validation is empty");
}

TEST(ScheduleKeys, EarlyStoppingNeedsAMetricAndEvaluations) {
  const RunConfig config =
      parse(with_validation, {"checkpoint.best_metric=loss", "train.eval_every=10", "train.early_stopping_patience=3",
                              "train.early_stopping_min_delta=0.001"});
  EXPECT_EQ(config.train.early_stopping_patience, 3);
  EXPECT_EQ(config.train.early_stopping_min_delta, 0.001);
  const RunConfig again = parse(to_toml(config));
  EXPECT_EQ(again.train.early_stopping_patience, 3);
  EXPECT_EQ(again.train.early_stopping_min_delta, 0.001);

  EXPECT_CONTAINS(error_of(with_validation, {"train.early_stopping_patience=3", "train.eval_every=10"}).message,
                  "train.early_stopping_patience is set but checkpoint.best_metric is \"none\": there is no metric to "
                  "watch");
  EXPECT_CONTAINS(error_of(with_validation, {"train.early_stopping_min_delta=0.5"}).message,
                  "train.early_stopping_min_delta is set but checkpoint.best_metric is \"none\"");
  EXPECT_CONTAINS(error_of(with_validation, {"checkpoint.best_metric=loss", "train.early_stopping_patience=3"}).message,
                  "train.early_stopping_patience = 3 counts evaluations, but the run evaluates only at the end");
  EXPECT_CONTAINS(
      error_of(with_validation, {"checkpoint.best_metric=loss", "train.early_stopping_min_delta=-1"}).message,
      "train.early_stopping_min_delta must be >= 0 (got -1)");
  // Epoch intervals count as periodic evaluation.
  EXPECT_NO_THROW(parse(with_validation, {"checkpoint.best_metric=loss", "train.early_stopping_patience=2",
                                          "train.eval_every_epochs=1"}));
}

}  // namespace
}  // namespace hpctrain
