#include "coordinator/step_liveness.h"

#include <algorithm>

namespace loom::coordinator {
namespace {

// A unit of progress may take this many times its expected time before the step counts
// as stuck: generous, since the rate is an average and a step's cost varies with its
// context (attention over a long prompt's later chunks costs more than its first).
constexpr double kExpectedUnitFactor = 10;
// The no-progress limit spans at least this many heartbeat intervals, so one late or
// lost report never decides.
constexpr int kMinReportsPerLimit = 4;
// Heartbeats that must show no progress before a step counts as stuck.
constexpr int kMinUnchangedReports = 3;

bool SameProgress(const loom::v1::StepProgress& a, const loom::v1::StepProgress& b) {
  return a.step_id() == b.step_id() && a.running() == b.running() &&
         a.units_done() == b.units_done() && a.steps_started() == b.steps_started();
}

}  // namespace

void StepLiveness::Reset(int world_size, absl::Time now) {
  ranks_.assign(std::max(world_size, 1), Rank{loom::v1::StepProgress(), now});
  last_progress_ = now;
  head_started_ = now;
  head_tokens_ = 0;
  unchanged_reports_ = 0;
  seconds_per_token_ = 0;
  units_per_step_ = 1;
}

bool StepLiveness::OnHeartbeat(int rank, const loom::v1::StepProgress& progress, absl::Time now) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return false;
  Rank& state = ranks_[rank];
  state.last_heartbeat = now;
  units_per_step_ = std::max(units_per_step_, progress.units_per_step());
  if (SameProgress(state.last, progress)) {
    ++unchanged_reports_;
    return false;
  }
  state.last = progress;
  last_progress_ = now;
  unchanged_reports_ = 0;
  return true;
}

void StepLiveness::OnHeadStarted(int64_t num_tokens, absl::Time now) {
  head_started_ = now;
  head_tokens_ = static_cast<uint64_t>(std::max<int64_t>(num_tokens, 0));
  unchanged_reports_ = 0;
}

bool StepLiveness::Stuck(absl::Time now) const {
  return now >= StuckAt() && unchanged_reports_ >= kMinUnchangedReports;
}

absl::Time StepLiveness::NextCheck(absl::Time now) const {
  const absl::Time stuck_at = StuckAt();
  return now < stuck_at ? stuck_at : now + options_.heartbeat_interval;
}

void StepLiveness::OnStepDone(int64_t num_tokens, double seconds) {
  if (num_tokens <= 0 || seconds <= 0) return;
  const double rate = seconds / static_cast<double>(num_tokens);
  seconds_per_token_ = seconds_per_token_ == 0 ? rate : 0.8 * seconds_per_token_ + 0.2 * rate;
}

absl::Duration StepLiveness::NoProgressLimit() const {
  absl::Duration limit =
      std::max(options_.no_progress_timeout, kMinReportsPerLimit * options_.heartbeat_interval);
  if (seconds_per_token_ > 0 && head_tokens_ > 0) {
    const double expected_step = static_cast<double>(head_tokens_) * seconds_per_token_;
    const double expected_unit = expected_step / std::max<uint32_t>(units_per_step_, 1);
    limit = std::max(limit, absl::Seconds(kExpectedUnitFactor * expected_unit));
  }
  return limit;
}

absl::Duration StepLiveness::LongestSilence(absl::Time now) const {
  absl::Duration longest = absl::ZeroDuration();
  for (const Rank& rank : ranks_) longest = std::max(longest, now - rank.last_heartbeat);
  return longest;
}

}  // namespace loom::coordinator
