// When a run evaluates and checkpoints (train/run_schedule.hpp): intervals given in epochs become steps, and rank 0's
// clock decisions, checked on clock readings instead of a clock (the default checkpoint every 30 minutes included).
#include "hpctrain/train/run_schedule.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace hpctrain {
namespace {

std::vector<std::int64_t> steps_where(const std::function<bool(std::int64_t)>& decide, std::int64_t steps) {
  std::vector<std::int64_t> chosen;
  for (std::int64_t step = 1; step <= steps; ++step)
    if (decide(step)) chosen.push_back(step);
  return chosen;
}

TEST(RunSchedule, EpochIntervalsBecomeSteps) {
  RunConfig config;
  config.train.eval_every_epochs = 2;
  config.checkpoint.every_epochs = 3;
  const RunSchedule schedule(config, 7);  // 7 steps per epoch
  EXPECT_EQ(schedule.evaluation_interval(), 14);
  EXPECT_EQ(schedule.checkpoint_interval(), 21);
  EXPECT_EQ(steps_where([&](std::int64_t step) { return schedule.evaluate_after(step, step == 50); }, 50),
            (std::vector<std::int64_t>{14, 28, 42, 50}));
  EXPECT_EQ(steps_where([&](std::int64_t step) { return schedule.checkpoint_after(step); }, 50),
            (std::vector<std::int64_t>{21, 42}));
}

TEST(RunSchedule, StepIntervalsAndNone) {
  RunConfig config;
  config.train.eval_every = 5;
  config.checkpoint.every_steps = 4;
  const RunSchedule schedule(config, 1000);
  EXPECT_EQ(steps_where([&](std::int64_t step) { return schedule.evaluate_after(step, step == 12); }, 12),
            (std::vector<std::int64_t>{5, 10, 12}));
  EXPECT_EQ(steps_where([&](std::int64_t step) { return schedule.checkpoint_after(step); }, 12),
            (std::vector<std::int64_t>{4, 8, 12}));

  const RunSchedule none(RunConfig{}, 10);
  EXPECT_EQ(steps_where([&](std::int64_t step) { return none.evaluate_after(step, step == 9); }, 9),
            (std::vector<std::int64_t>{9}));
  EXPECT_TRUE(steps_where([&](std::int64_t step) { return none.checkpoint_after(step); }, 100).empty());

  // An interval in epochs longer than any run (overflowing int64) is never reached instead of wrapping around.
  RunConfig huge;
  huge.checkpoint.every_epochs = std::numeric_limits<std::int64_t>::max() / 2;
  EXPECT_FALSE(RunSchedule(huge, 4).checkpoint_after(4));
}

TEST(RunSchedule, DefaultCheckpointEveryThirtyMinutes) {
  const RunConfig config;  // the deck's defaults
  ASSERT_EQ(config.checkpoint.every_seconds, 1800.0);
  const RunSchedule schedule(config, 10);
  ClockReading clock;
  clock.last_checkpoint = 100.0;
  clock.now = 100.0 + 1799.5;
  EXPECT_EQ(schedule.clock_request(clock), ClockRequest::none);
  clock.now = 100.0 + 1800.0;
  EXPECT_EQ(schedule.clock_request(clock), ClockRequest::checkpoint);
  clock.now = 100.0 + 7200.0;
  EXPECT_EQ(schedule.clock_request(clock), ClockRequest::checkpoint);

  // Turned off (0, which `false` in the deck also gives): never by time.
  RunConfig off;
  off.checkpoint.every_seconds = 0.0;
  EXPECT_EQ(RunSchedule(off, 10).clock_request(clock), ClockRequest::none);
}

TEST(RunSchedule, TimeLimitWinsOverThePeriodicCheckpoint) {
  RunConfig config;
  config.checkpoint.every_seconds = 60.0;
  config.train.time_limit = TimeLimit{600.0, "00:10:00"};
  const RunSchedule schedule(config, 10);
  ClockReading clock;
  clock.started = 0.0;
  clock.recent_step = 10.0;
  clock.longest_checkpoint = 5.0;
  clock.last_checkpoint = 0.0;
  clock.now = 559.0;  // 559 + 3 x 10 + 2 x 5 = 599 < 600: only the periodic checkpoint
  EXPECT_EQ(schedule.clock_request(clock), ClockRequest::checkpoint);
  clock.now = 560.0;  // 600: stop
  EXPECT_EQ(schedule.clock_request(clock), ClockRequest::checkpoint_and_stop);
  clock.last_checkpoint = 559.0;
  EXPECT_EQ(schedule.clock_request(clock), ClockRequest::checkpoint_and_stop);
}

TEST(RunSchedule, Describe) {
  RunConfig config;
  config.checkpoint.every_steps = 100;
  config.train.eval_every_epochs = 1;
  EXPECT_EQ(RunSchedule(config, 25).describe(true, true),
            "checkpoints: every 100 steps, at least every 30 min (checkpoint.every_seconds), at the end; evaluation: "
            "every 25 steps and at the end");
  RunConfig off;
  off.checkpoint.every_seconds = 90.0;
  EXPECT_EQ(RunSchedule(off, 25).describe(false, false), "checkpoints: at least every 90 s (checkpoint.every_seconds)");
  off.checkpoint.every_seconds = 0.0;
  EXPECT_EQ(RunSchedule(off, 25).describe(false, true),
            "checkpoints: on a signal or train.time_limit only; evaluation: at the end");
}

}  // namespace
}  // namespace hpctrain
