#include "engine/speculation_policy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

SpeculationStats Observed(int64_t steps, int64_t drafted, int64_t accepted) {
  SpeculationStats stats;
  stats.num_steps = steps;
  stats.num_steps_drafted = steps;
  stats.num_draft_tokens = drafted;
  stats.num_accepted_tokens = accepted;
  return stats;
}

// A cost model from measured steps: `fixed` seconds plus `per_token` for each token.
void Teach(SpeculationPolicy& policy, double fixed, double per_token) {
  for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256,
                         384, 512, 768, 1024}) {
    for (int repeat = 0; repeat < 3; ++repeat) {
      policy.RecordStep(tokens, fixed + per_token * static_cast<double>(tokens));
    }
  }
}

std::vector<int32_t> Choose(const SpeculationPolicy& policy, int32_t num_seqs, int32_t limit,
                            const SpeculationStats& stats, int64_t other_tokens = 0) {
  std::vector<int32_t> limits(static_cast<size_t>(num_seqs), limit);
  std::vector<const SpeculationStats*> all(static_cast<size_t>(num_seqs), &stats);
  std::vector<int32_t> drafts;
  policy.Choose(limits, all, other_tokens, /*other_work=*/false, drafts);
  return drafts;
}

TEST(SpeculationStatsTest, AcceptanceStartsAtThePriorAndFollowsObservations) {
  SpeculationStats stats;
  EXPECT_DOUBLE_EQ(stats.acceptance_rate(), 0.5);
  for (int i = 0; i < 100; ++i) stats.Record(4, 4);
  EXPECT_GT(stats.acceptance_rate(), 0.98);
  SpeculationStats rejected;
  for (int i = 0; i < 100; ++i) rejected.Record(4, 0);
  EXPECT_LT(rejected.acceptance_rate(), 0.01);
  SpeculationStats no_match;
  for (int i = 0; i < 100; ++i) no_match.Record(0, 0);
  EXPECT_LT(no_match.proposal_rate(), 0.02);
}

TEST(StepCostModelTest, InterpolatesMeasuredSizesAndIsOptimisticElsewhere) {
  StepCostModel model;
  // Nothing measured: an extra token costs 5% of a step.
  EXPECT_DOUBLE_EQ(model.Estimate(1), 1.0);
  EXPECT_DOUBLE_EQ(model.Estimate(21), 2.0);
  model.Record(1, 0.010);
  model.Record(9, 0.050);
  EXPECT_NEAR(model.Estimate(1), 0.010, 1e-12);
  EXPECT_NEAR(model.Estimate(5), 0.030, 1e-12);  // halfway between the measured sizes
  EXPECT_NEAR(model.Estimate(9), 0.050, 1e-12);
  EXPECT_GT(model.Estimate(20), model.Estimate(9));
}

TEST(StepCostModelTest, APromptTokenBesideDecodesCostsWhatItAddsToTheirStep) {
  StepCostModel model;
  model.RecordPrefillBesideDecodes(4, 8, 0.05);  // nothing to compare with yet: ignored
  EXPECT_FALSE(model.PrefillSecondsPerToken().has_value());
  model.Record(4, 0.010);  // 4 decodes alone: 10 ms
  EXPECT_FALSE(model.PrefillSecondsPerToken().has_value());
  // 4 decodes and 8 prompt tokens: 26 ms, 2 ms a prompt token; then 34 ms, 3 ms.
  model.RecordPrefillBesideDecodes(4, 8, 0.026);
  EXPECT_NEAR(model.PrefillSecondsPerToken().value_or(-1), 0.002, 1e-12);
  model.RecordPrefillBesideDecodes(4, 8, 0.034);
  EXPECT_NEAR(model.PrefillSecondsPerToken().value_or(-1), 0.002 + 0.1 * 0.001,
              1e-12);                           // decay-weighted
  model.RecordPrefillBesideDecodes(0, 8, 1.0);  // no decodes beside: not this measure
  model.RecordPrefillBesideDecodes(4, 0, 1.0);
  EXPECT_NEAR(model.PrefillSecondsPerToken().value_or(-1), 0.0021, 1e-12);
  // The fitted slope, where it is larger, wins.
  model.Record(1, 0.010);
  model.Record(101, 1.010);  // 10 ms a token between 1 and 101 tokens
  EXPECT_NEAR(model.PrefillSecondsPerToken().value_or(-1), model.SecondsPerToken(), 1e-12);
  EXPECT_GT(model.SecondsPerToken(), 0.0021);
}

TEST(SpeculationPolicyTest, FixedModeAlwaysUsesTheLimit) {
  SpeculationConfig config;
  config.adaptive = false;
  SpeculationPolicy policy(config);
  EXPECT_EQ(Choose(policy, 3, 5, Observed(10, 40, 0)), (std::vector<int32_t>{5, 5, 5}));
}

TEST(SpeculationPolicyTest, SpeculatesWhenStepsCostLittleMoreAndDraftsAreAccepted) {
  SpeculationPolicy policy({});
  Teach(policy, /*fixed=*/0.010, /*per_token=*/0.0002);  // memory-bound: tokens are cheap
  const std::vector<int32_t> drafts = Choose(policy, 1, 8, Observed(50, 200, 180));
  EXPECT_GE(drafts[0], 6);
}

TEST(SpeculationPolicyTest, DoesNotSpeculateWhenDraftsAreRejected) {
  SpeculationPolicy policy({});
  Teach(policy, 0.010, 0.0002);
  EXPECT_EQ(Choose(policy, 1, 8, Observed(50, 200, 2))[0], 0);
}

TEST(SpeculationPolicyTest, SwitchesOffForLargeBatches) {
  SpeculationPolicy policy({});
  Teach(policy, 0.010, 0.0004);  // 25 tokens cost as much as the fixed part
  const SpeculationStats good = Observed(50, 200, 140);  // 70% accepted
  const std::vector<int32_t> small = Choose(policy, 2, 6, good);
  const std::vector<int32_t> large = Choose(policy, 256, 6, good);
  EXPECT_GT(small[0], 0);
  for (int32_t drafts : large) EXPECT_EQ(drafts, 0);
}

TEST(SpeculationPolicyTest, GivesMoreDraftsToSequencesThatAcceptMore) {
  SpeculationPolicy policy({});
  Teach(policy, 0.010, 0.0010);
  const SpeculationStats often = Observed(50, 200, 190);
  const SpeculationStats rarely = Observed(50, 200, 40);
  std::vector<int32_t> limits = {8, 8};
  std::vector<const SpeculationStats*> stats = {&often, &rarely};
  std::vector<int32_t> drafts;
  policy.Choose(limits, stats, 0, /*other_work=*/false, drafts);
  EXPECT_GT(drafts[0], drafts[1]);
  EXPECT_LE(drafts[0], 8);
}

TEST(SpeculationPolicyTest, RespectsEachSequencesLimit) {
  SpeculationPolicy policy({});
  Teach(policy, 0.010, 0.0001);
  const SpeculationStats good = Observed(50, 200, 199);
  std::vector<int32_t> limits = {0, 2, 16};
  std::vector<const SpeculationStats*> stats = {&good, &good, &good};
  std::vector<int32_t> drafts;
  policy.Choose(limits, stats, 0, /*other_work=*/false, drafts);
  EXPECT_EQ(drafts[0], 0);
  EXPECT_LE(drafts[1], 2);
  EXPECT_LE(drafts[2], 16);
  EXPECT_GT(drafts[2], 2);
}

TEST(SpeculationPolicyTest, WithPipelinedPlansDraftsMustPayForTheSkippedPlan) {
  SpeculationPolicy policy({});
  Teach(policy, 0.010, 0.0001);
  // 45% acceptance: a few drafts bring about 0.8 tokens, less than the skipped decode.
  const SpeculationStats middling = Observed(50, 200, 90);
  const SpeculationStats good = Observed(50, 200, 180);
  std::vector<int32_t> limits = {4, 4};
  std::vector<const SpeculationStats*> stats = {&middling, &good};
  std::vector<int32_t> alone, busy;
  policy.Choose(limits, stats, 0, /*other_work=*/false, alone);
  policy.Choose(limits, stats, 0, /*other_work=*/true, busy);
  EXPECT_GT(alone[0], 0);
  EXPECT_EQ(busy[0], 0);
  EXPECT_GT(busy[1], 0);
}

}  // namespace
}  // namespace loom::engine
