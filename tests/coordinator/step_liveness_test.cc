#include "coordinator/step_liveness.h"

#include <gtest/gtest.h>

namespace loom::coordinator {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

loom::v1::StepProgress Progress(uint64_t step_id, uint64_t units, uint32_t units_per_step = 10) {
  loom::v1::StepProgress progress;
  progress.set_step_id(step_id);
  progress.set_running(true);
  progress.set_units_done(units);
  progress.set_units_per_step(units_per_step);
  progress.set_steps_started(step_id);
  return progress;
}

StepLiveness Make(absl::Duration no_progress, absl::Duration interval = absl::Milliseconds(100)) {
  LivenessOptions options;
  options.no_progress_timeout = no_progress;
  options.heartbeat_interval = interval;
  StepLiveness liveness(options);
  liveness.Reset(1, kStart);
  return liveness;
}

TEST(StepLivenessTest, AStepThatKeepsProgressingIsNeverStuck) {
  StepLiveness liveness = Make(absl::Seconds(2));
  liveness.OnHeadStarted(512, kStart);
  // A 60 s step that reports a new unit every second: always a fresh deadline ahead.
  for (int second = 1; second <= 60; ++second) {
    const absl::Time now = kStart + absl::Seconds(second);
    EXPECT_LT(now, liveness.StuckAt()) << "at " << second << " s";
    EXPECT_TRUE(liveness.OnHeartbeat(0, Progress(1, second), now));
  }
  EXPECT_EQ(liveness.StuckAt(), kStart + absl::Seconds(62));
}

TEST(StepLivenessTest, AReportWithoutProgressDoesNotExtendTheDeadline) {
  StepLiveness liveness = Make(absl::Seconds(2));
  liveness.OnHeadStarted(16, kStart);
  EXPECT_TRUE(liveness.OnHeartbeat(0, Progress(1, 5), kStart + absl::Milliseconds(500)));
  // The heartbeat thread goes on, the count does not move (a step stuck inside).
  for (int ms = 600; ms < 3000; ms += 100) {
    EXPECT_FALSE(liveness.OnHeartbeat(0, Progress(1, 5), kStart + absl::Milliseconds(ms)));
  }
  EXPECT_EQ(liveness.StuckAt(), kStart + absl::Milliseconds(2500));
  EXPECT_FALSE(liveness.Stuck(kStart + absl::Milliseconds(2400)));
  EXPECT_TRUE(liveness.Stuck(kStart + absl::Milliseconds(2500)));
  EXPECT_EQ(liveness.LongestSilence(kStart + absl::Milliseconds(3000)), absl::Milliseconds(100));
}

TEST(StepLivenessTest, LateReportsAreNoEvidenceOfAStuckStep) {
  StepLiveness liveness = Make(absl::Seconds(2));
  liveness.OnHeadStarted(16, kStart);
  // A starved machine: past the limit, only two reports came, both unchanged.
  liveness.OnHeartbeat(0, Progress(1, 5), kStart + absl::Milliseconds(100));
  liveness.OnHeartbeat(0, Progress(1, 5), kStart + absl::Milliseconds(2600));
  liveness.OnHeartbeat(0, Progress(1, 5), kStart + absl::Milliseconds(2700));
  const absl::Time now = kStart + absl::Milliseconds(2800);
  EXPECT_FALSE(liveness.Stuck(now));
  EXPECT_EQ(liveness.NextCheck(now), now + absl::Milliseconds(100));  // a heartbeat interval
  liveness.OnHeartbeat(0, Progress(1, 5), now);
  EXPECT_TRUE(liveness.Stuck(now));
  // A new head plan starts the count again.
  liveness.OnHeadStarted(1, now);
  EXPECT_EQ(liveness.NextCheck(now), now + absl::Seconds(2));
  EXPECT_FALSE(liveness.Stuck(now + absl::Seconds(3)));
}

TEST(StepLivenessTest, AQueuedPlanIsTimedFromWhenItsPredecessorFinished) {
  StepLiveness liveness = Make(absl::Seconds(2));
  liveness.OnHeadStarted(512, kStart);
  // The first plan's result arrives after 10 s of progress; the second plan, sent at once
  // with the first, starts now.
  const absl::Time done = kStart + absl::Seconds(10);
  liveness.OnStepDone(512, 10.0);
  liveness.OnHeadStarted(1, done);
  EXPECT_GE(liveness.StuckAt(), done + absl::Seconds(2));
}

TEST(StepLivenessTest, TheLimitGrowsWithTheExpectedTimePerUnitOfABigStep) {
  StepLiveness liveness = Make(absl::Seconds(2));
  EXPECT_EQ(liveness.NoProgressLimit(), absl::Seconds(2));
  liveness.OnHeartbeat(0, Progress(1, 1, /*units_per_step=*/4), kStart);
  // Measured: 0.1 s per token. A 512-token step is expected to take 51.2 s, 12.8 s per
  // unit of its 4: the limit is ten times that, not the configured 2 s.
  liveness.OnStepDone(100, 10.0);
  liveness.OnHeadStarted(512, kStart);
  EXPECT_NEAR(absl::ToDoubleSeconds(liveness.NoProgressLimit()), 128.0, 1e-6);
  // A one-token step of the same worker keeps the configured floor.
  liveness.OnHeadStarted(1, kStart);
  EXPECT_EQ(liveness.NoProgressLimit(), absl::Seconds(2));
}

TEST(StepLivenessTest, TheLimitSpansSeveralHeartbeats) {
  StepLiveness liveness = Make(absl::Milliseconds(100), absl::Milliseconds(500));
  EXPECT_EQ(liveness.NoProgressLimit(), absl::Seconds(2));
}

TEST(StepLivenessTest, AnyRankProgressingCountsAndTheMostSilentRankDecidesSilence) {
  LivenessOptions options;
  options.no_progress_timeout = absl::Seconds(1);
  StepLiveness liveness(options);
  liveness.Reset(2, kStart);
  liveness.OnHeadStarted(8, kStart);
  EXPECT_TRUE(liveness.OnHeartbeat(1, Progress(1, 3), kStart + absl::Seconds(3)));
  EXPECT_EQ(liveness.LastActivity(), kStart + absl::Seconds(3));
  EXPECT_EQ(liveness.LongestSilence(kStart + absl::Seconds(4)), absl::Seconds(4));  // rank 0
  EXPECT_FALSE(liveness.OnHeartbeat(2, Progress(1, 9), kStart + absl::Seconds(4)));  // no rank 2
  EXPECT_FALSE(liveness.OnHeartbeat(-1, Progress(1, 9), kStart + absl::Seconds(4)));
}

}  // namespace
}  // namespace loom::coordinator
