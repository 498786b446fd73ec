#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"

namespace loom::engine {

/// How a replica speculates (server flags; a request may lower its own limit).
struct SpeculationConfig {
  // Draft tokens per step at most, for requests that do not say (0: off by default).
  int32_t num_speculative_tokens = 0;
  // true: each step picks k in [0, limit] from the measured acceptance and step cost
  // (off when it does not pay); false: always the request's limit.
  bool adaptive = true;
  // Plans are pipelined (two in flight): a speculating sequence sits out the plan built
  // while its step runs, so with other work to run it forgoes that plan's token.
  bool pipelined = true;
};

/// What the policy knows of one decoding sequence's past speculation.
struct SpeculationStats {
  int64_t num_steps = 0;            // speculative steps whose results came back
  int64_t num_steps_drafted = 0;    //   of them, steps that proposed at least one draft
  int64_t num_draft_tokens = 0;     // drafts proposed
  int64_t num_accepted_tokens = 0;  // drafts the model accepted

  /// Records one speculative step's outcome.
  void Record(int32_t drafts, int32_t accepted);
  /// Estimated probability that a draft is accepted given the ones before it were
  /// (a Beta prior of 0.5 worth two drafts, then the observed rate).
  double acceptance_rate() const;
  /// Estimated probability that a speculative step proposes anything.
  double proposal_rate() const;
};

/// A decode step's cost as a function of the tokens it computes, learned from the
/// worker's timings: an exponentially weighted mean per token-count bucket, interpolated
/// between measured buckets and extrapolated with an optimistic prior (a token adds 5%
/// of a step) where nothing was measured, so that the policy tries what it has not seen.
class StepCostModel {
 public:
  /// Records a step of `num_tokens` tokens whose forward pass took `seconds`.
  void Record(int64_t num_tokens, double seconds);
  /// Estimated seconds of a step of `num_tokens` tokens (arbitrary units before any
  /// measurement; only ratios matter).
  double Estimate(int64_t num_tokens) const;
  /// Whether any step was recorded (Estimate is in seconds only then).
  bool measured() const;
  /// What one more token adds to a step: the slope of a least-squares line through the
  /// measured buckets (each one point: a burst of one size weighs no more than the rest),
  /// steady where neighbouring buckets' means are noisy. 0 before the measured sizes span
  /// 16 tokens (a few decodes' steps differ by noise, not by their tokens) or when the line
  /// does not rise.
  double SecondsPerToken() const;
  /// Records a step of `decode_tokens` decodes beside `prefill_tokens` prompt tokens: what
  /// the prompt tokens added to the step, per token, over Estimate(decode_tokens) (a
  /// decay-weighted mean). Call before Record for the same step.
  void RecordPrefillBesideDecodes(int64_t decode_tokens, int64_t prefill_tokens, double seconds);
  /// What a prompt token beside decodes costs: the larger of the fitted slope and the
  /// stall measured by RecordPrefillBesideDecodes (a prompt token attends to its whole
  /// prompt so far, which the slope, fitted to step sizes alone, does not see: a chunk of
  /// a 2k-token prompt costs 1.5x the slope on a small model). nullopt before either is
  /// measured (a fast device's 0 is a measurement).
  std::optional<double> PrefillSecondsPerToken() const;

 private:
  static constexpr int kNumBuckets = 48;  // 1..16 tokens exactly, then 4 per octave
  static int Bucket(int64_t num_tokens);
  static int64_t BucketTokens(int bucket);
  std::array<double, kNumBuckets> mean_seconds_{};
  std::array<int64_t, kNumBuckets> count_{};
  // The slope, nullopt before the measured sizes span 16 tokens.
  std::optional<double> Slope() const;

  double prefill_seconds_per_token_ = 0;  // RecordPrefillBesideDecodes's mean
  int64_t num_prefill_stalls_ = 0;        // steps it has seen
};

/// Adaptive speculative decoding (the policy, not the mechanism): every step it picks the
/// number of draft tokens k for the decoding sequences that speculate, maximizing the
/// expected tokens emitted per second of step time. A sequence whose drafts are accepted
/// with probability a (and that proposes with probability r) emits
/// 1 + r * (a + a^2 + ... + a^k) tokens for k more computed tokens; the step's cost comes
/// from StepCostModel. Large batches, where extra tokens cost as much as they bring, end
/// up at k = 0: speculation switches itself off. With pipelined plans and other work, a
/// speculating sequence skips one plan, so its drafts must bring more than one token. Not thread-safe (the replica loop's).
class SpeculationPolicy {
 public:
  explicit SpeculationPolicy(const SpeculationConfig& config) : config_(config) {}

  /// Records a finished step (its computed tokens and the worker's forward time).
  void RecordStep(int64_t num_tokens, double seconds, int64_t num_decode_tokens = 0) {
    cost_.RecordPrefillBesideDecodes(num_decode_tokens, num_tokens - num_decode_tokens, seconds);
    cost_.Record(num_tokens, seconds);
  }

  /// The draft tokens for each of `limits.size()` decoding sequences this step:
  /// `limits[i]` is sequence i's cap (0: it does not speculate), `stats[i]` its history,
  /// `num_other_tokens` the step's other tokens (decodes that do not speculate, prefill),
  /// `other_work`: other sequences can fill the next plan (with pipelined plans a
  /// speculating sequence then pays the decode it skips: it speculates only when its
  /// drafts are expected to bring more than that one token). Writes `draft_tokens[i]` in
  /// [0, limits[i]].
  void Choose(absl::Span<const int32_t> limits, absl::Span<const SpeculationStats* const> stats,
              int64_t num_other_tokens, bool other_work, std::vector<int32_t>& draft_tokens) const;

  const SpeculationConfig& config() const { return config_; }
  const StepCostModel& cost_model() const { return cost_; }

 private:
  SpeculationConfig config_;
  StepCostModel cost_;
};

}  // namespace loom::engine
