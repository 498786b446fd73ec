#include "engine/speculation_policy.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace loom::engine {
namespace {

// Prior: a draft is accepted half the time, worth two observed drafts; a step proposes.
constexpr double kPriorAcceptance = 0.5;
constexpr double kPriorDrafts = 2.0;
constexpr double kPriorProposal = 1.0;
constexpr double kPriorSteps = 1.0;
// Unmeasured step sizes: each extra token costs this fraction of a measured step.
constexpr double kOptimisticTokenCost = 0.05;
// Weight of a new measurement in a bucket's running mean (after its first).
constexpr double kCostDecay = 0.1;

}  // namespace

void SpeculationStats::Record(int32_t drafts, int32_t accepted) {
  ++num_steps;
  if (drafts > 0) ++num_steps_drafted;
  num_draft_tokens += drafts;
  num_accepted_tokens += accepted;
}

double SpeculationStats::acceptance_rate() const {
  return (static_cast<double>(num_accepted_tokens) + kPriorAcceptance * kPriorDrafts) /
         (static_cast<double>(num_draft_tokens) + kPriorDrafts);
}

double SpeculationStats::proposal_rate() const {
  return (static_cast<double>(num_steps_drafted) + kPriorProposal) /
         (static_cast<double>(num_steps) + kPriorSteps);
}

int StepCostModel::Bucket(int64_t num_tokens) {
  if (num_tokens <= 16) return static_cast<int>(std::max<int64_t>(num_tokens, 1) - 1);
  const int bucket =
      16 + static_cast<int>(std::floor(4.0 * std::log2(static_cast<double>(num_tokens) / 16.0)));
  return std::min(bucket, kNumBuckets - 1);
}

int64_t StepCostModel::BucketTokens(int bucket) {
  if (bucket < 16) return bucket + 1;
  return static_cast<int64_t>(std::llround(16.0 * std::exp2((bucket - 16) / 4.0)));
}

void StepCostModel::Record(int64_t num_tokens, double seconds) {
  if (num_tokens < 1 || !(seconds > 0)) return;
  const int bucket = Bucket(num_tokens);
  // Normalize to the bucket's representative size, so one bucket mixes like with like.
  const double scaled = seconds * static_cast<double>(BucketTokens(bucket)) /
                        static_cast<double>(std::max<int64_t>(num_tokens, 1));
  const double value = bucket < 16 ? seconds : scaled;
  double& mean = mean_seconds_[bucket];
  mean = count_[bucket] == 0 ? value : mean + kCostDecay * (value - mean);
  ++count_[bucket];
}

void StepCostModel::RecordPrefillBesideDecodes(int64_t decode_tokens, int64_t prefill_tokens,
                                               double seconds) {
  if (decode_tokens < 1 || prefill_tokens < 1 || !(seconds > 0) || !measured()) return;
  // Steps of the decodes alone measured at this size (or interpolated between sizes that
  // were): the rest of the step is the prompt tokens'.
  const double stall = std::max(0.0, seconds - Estimate(decode_tokens));
  const double per_token = stall / static_cast<double>(prefill_tokens);
  prefill_seconds_per_token_ =
      num_prefill_stalls_++ == 0
          ? per_token
          : prefill_seconds_per_token_ + kCostDecay * (per_token - prefill_seconds_per_token_);
}

std::optional<double> StepCostModel::PrefillSecondsPerToken() const {
  const std::optional<double> slope = Slope();
  if (num_prefill_stalls_ == 0) return slope;
  return std::max(slope.value_or(0.0), prefill_seconds_per_token_);
}

bool StepCostModel::measured() const {
  return std::any_of(count_.begin(), count_.end(), [](int64_t count) { return count > 0; });
}

double StepCostModel::SecondsPerToken() const { return Slope().value_or(0.0); }

std::optional<double> StepCostModel::Slope() const {
  constexpr double kMinSpread = 16;
  double n = 0, sum_x = 0, sum_y = 0, sum_xx = 0, sum_xy = 0;
  double smallest = 0, largest = 0;
  for (int b = 0; b < kNumBuckets; ++b) {
    if (count_[b] == 0) continue;
    const double x = static_cast<double>(BucketTokens(b));
    if (n == 0) smallest = x;
    largest = x;
    const double y = mean_seconds_[b];
    n += 1;
    sum_x += x;
    sum_y += y;
    sum_xx += x * x;
    sum_xy += x * y;
  }
  const double variance = n * sum_xx - sum_x * sum_x;
  if (largest - smallest < kMinSpread || variance <= 0) return std::nullopt;
  return std::max(0.0, (n * sum_xy - sum_x * sum_y) / variance);
}

double StepCostModel::Estimate(int64_t num_tokens) const {
  num_tokens = std::max<int64_t>(num_tokens, 1);
  const int bucket = Bucket(num_tokens);
  int below = -1;
  int above = -1;
  for (int b = bucket; b >= 0; --b) {
    if (count_[b] > 0) {
      below = b;
      break;
    }
  }
  // A bucket's mean is the cost at its representative size (the smallest of the bucket):
  // past it, interpolate toward the next measured bucket.
  for (int b = bucket + 1; b < kNumBuckets; ++b) {
    if (count_[b] > 0) {
      above = b;
      break;
    }
  }
  const auto tokens_of = [](int b) { return static_cast<double>(BucketTokens(b)); };
  const double t = static_cast<double>(num_tokens);
  if (below >= 0 && above >= 0 && below != above) {
    const double t0 = tokens_of(below), t1 = tokens_of(above);
    const double w = std::clamp((t - t0) / (t1 - t0), 0.0, 1.0);
    return mean_seconds_[below] + w * (mean_seconds_[above] - mean_seconds_[below]);
  }
  if (below >= 0) {
    // At or past the largest measured size: the measured cost plus the optimistic slope
    // (past the last bucket, linear in the tokens).
    const double t0 = tokens_of(below);
    const double base = mean_seconds_[below];
    if (below == kNumBuckets - 1) return base * std::max(1.0, t / t0);
    return base * (1.0 + kOptimisticTokenCost * std::max(0.0, t - t0));
  }
  if (above >= 0) return mean_seconds_[above];  // nothing smaller measured: no cheaper
  return 1.0 + kOptimisticTokenCost * (t - 1.0);
}

void SpeculationPolicy::Choose(absl::Span<const int32_t> limits,
                               absl::Span<const SpeculationStats* const> stats,
                               int64_t num_other_tokens, bool other_work,
                               std::vector<int32_t>& draft_tokens) const {
  draft_tokens.assign(limits.size(), 0);
  if (!config_.adaptive) {
    for (size_t i = 0; i < limits.size(); ++i) draft_tokens[i] = std::max(limits[i], 0);
    return;
  }
  // Every draft slot (sequence i, position j) brings r_i * a_i^j expected useful tokens
  // and costs one computed token. Slots of one sequence are worth less and less, so the
  // best m slots overall always form a prefix per sequence: take the m that maximizes
  // useful tokens per second.
  struct Slot {
    double value;
    size_t seq;
  };
  std::vector<Slot> slots;
  int64_t base_tokens = num_other_tokens;
  for (size_t i = 0; i < limits.size(); ++i) {
    ++base_tokens;  // its computed token, speculating or not
    if (limits[i] <= 0) continue;
    const double acceptance = stats[i]->acceptance_rate();
    double value = stats[i]->proposal_rate();
    for (int32_t j = 0; j < limits[i]; ++j) {
      value *= acceptance;
      slots.push_back({value, i});
    }
  }
  if (slots.empty()) return;
  std::sort(slots.begin(), slots.end(),
            [](const Slot& a, const Slot& b) { return a.value > b.value; });
  double useful = static_cast<double>(base_tokens);
  double best_rate = useful / cost_.Estimate(base_tokens);
  size_t best_m = 0;
  for (size_t m = 1; m <= slots.size(); ++m) {
    useful += slots[m - 1].value;
    const double rate = useful / cost_.Estimate(base_tokens + static_cast<int64_t>(m));
    if (rate > best_rate) {
      best_rate = rate;
      best_m = m;
    }
  }
  std::vector<double> expected(limits.size(), 0.0);
  for (size_t m = 0; m < best_m; ++m) {
    ++draft_tokens[slots[m].seq];
    expected[slots[m].seq] += slots[m].value;
  }
  if (config_.pipelined && other_work) {
    // The plan it sits out would have brought one token: the drafts must beat that.
    for (size_t i = 0; i < limits.size(); ++i) {
      if (expected[i] < 1.0) draft_tokens[i] = 0;
    }
  }
}

}  // namespace loom::engine
