#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "loom/v1/worker.pb.h"

namespace loom::coordinator {

struct LivenessOptions {
  // --step-timeout-ms: how long the step at the head of a worker's queue may go without
  // any progress report before the worker counts as stuck (never a bound on a step that
  // keeps progressing).
  absl::Duration no_progress_timeout = absl::Seconds(30);
  // How often workers report (RegisterResponse.heartbeat_interval_ms): the no-progress
  // limit always spans several reports.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
};

/// Tells a slow worker from a stuck one for one replica, from the progress its ranks
/// report in their heartbeats (loom.v1.StepProgress, sent by a thread that does not
/// compute). The step at the head of the worker's queue is stuck when neither it started
/// nor any rank's progress changed for NoProgressLimit() and at least three heartbeats
/// since said so (late reports from a starved machine are no evidence of a stuck step).
/// The limit is the larger of the configured no-progress timeout, four heartbeat
/// intervals, and ten times the time one unit of progress is expected to take (the head
/// step's tokens times the measured seconds per token, divided by the units a step
/// reports). A step whose count keeps moving is never stuck, however long it takes.
/// Silence (no heartbeat at all) is the other failure and is measured per rank. Not
/// thread-safe: the Replica guards it with its mutex.
class StepLiveness {
 public:
  explicit StepLiveness(LivenessOptions options = {}) : options_(options) {}

  /// A new connection to `world_size` ranks at `now`: forgets every report and rate.
  void Reset(int world_size, absl::Time now);
  /// Rank `rank` heartbeated at `now` with `progress`; true when the report shows progress
  /// (differs from that rank's previous one). Ranks outside the world are ignored.
  bool OnHeartbeat(int rank, const loom::v1::StepProgress& progress, absl::Time now);
  /// The plan at the head of the worker's queue, of `num_tokens` tokens, starts on the
  /// worker at `now`: sent to an idle worker, or its predecessor's result arrived (the
  /// worker runs plans in order, so a queued plan's time does not count).
  void OnHeadStarted(int64_t num_tokens, absl::Time now);
  /// A step of `num_tokens` took `seconds` on the worker (plan received to result sent):
  /// updates the measured seconds per token.
  void OnStepDone(int64_t num_tokens, double seconds);

  /// How long the head step may go without progress (see the class comment).
  absl::Duration NoProgressLimit() const;
  /// When the head step counts as stuck unless it progresses first (given enough reports).
  absl::Time StuckAt() const { return LastActivity() + NoProgressLimit(); }
  /// True when the head step is stuck at `now`: past StuckAt() with enough unchanged reports.
  bool Stuck(absl::Time now) const;
  /// When to look again at `now`: StuckAt(), or one heartbeat interval on once that passed
  /// without enough reports.
  absl::Time NextCheck(absl::Time now) const;
  /// The head step's start or the last progress, whichever is later.
  absl::Time LastActivity() const { return std::max(head_started_, last_progress_); }
  /// How long the most silent rank has not heartbeated, at `now`.
  absl::Duration LongestSilence(absl::Time now) const;
  /// Measured seconds per token (an average over recent steps; 0 before the first).
  double seconds_per_token() const { return seconds_per_token_; }
  uint64_t head_tokens() const { return head_tokens_; }

 private:
  struct Rank {
    loom::v1::StepProgress last;
    absl::Time last_heartbeat;
  };

  const LivenessOptions options_;
  std::vector<Rank> ranks_;
  absl::Time last_progress_ = absl::InfinitePast();
  absl::Time head_started_ = absl::InfinitePast();
  uint64_t head_tokens_ = 0;
  // Heartbeats received since the last progress or head start that showed no progress.
  int unchanged_reports_ = 0;
  // Exponential average of step seconds / step tokens (weight 0.2 for the newest step).
  double seconds_per_token_ = 0;
  // The largest units_per_step a rank reported (1 before any report).
  uint32_t units_per_step_ = 1;
};

}  // namespace loom::coordinator
