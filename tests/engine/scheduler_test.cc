#include "engine/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "engine/step_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::unique_ptr<Sequence> MakeSequence(uint64_t id, int32_t prompt_len, int32_t max_tokens,
                                       int32_t priority = 0) {
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = id;
  seq->priority = priority;
  seq->prompt_ids.resize(static_cast<size_t>(prompt_len));
  // Distinct tokens per id: no two sequences share a prefix (SchedulerPrefixTest covers
  // sharing), though a preempted one may still find its own blocks cached.
  std::iota(seq->prompt_ids.begin(), seq->prompt_ids.end(), static_cast<int32_t>(1000 * id));
  seq->max_tokens = max_tokens;
  return seq;
}

SchedulerConfig Config(int32_t block_size, int64_t num_blocks, int64_t max_batched_tokens,
                       int32_t max_num_seqs = 256) {
  SchedulerConfig config;
  config.block_size = block_size;
  config.num_blocks = num_blocks;
  config.max_num_batched_tokens = max_batched_tokens;
  config.max_num_seqs = max_num_seqs;
  return config;
}

SchedulerConfig NoCacheConfig(int32_t block_size, int64_t num_blocks, int64_t max_batched_tokens,
                              int32_t max_num_seqs = 256) {
  SchedulerConfig config = Config(block_size, num_blocks, max_batched_tokens, max_num_seqs);
  config.enable_prefix_caching = false;
  return config;
}

std::vector<uint64_t> ScheduledIds(const SchedulerOutput& out) {
  std::vector<uint64_t> ids;
  for (const ScheduledWork& work : out.scheduled) ids.push_back(work.seq->seq_id);
  return ids;
}

const ScheduledWork* WorkFor(const SchedulerOutput& out, uint64_t id) {
  for (const ScheduledWork& work : out.scheduled) {
    if (work.seq->seq_id == id) return &work;
  }
  return nullptr;
}

// Applies a fake token for every sampled sequence of a plan, in plan order.
void ApplySamples(Scheduler& scheduler, const SchedulerOutput& out, int32_t token = 7) {
  for (const ScheduledWork& work : out.scheduled) {
    if (work.sample) {
      ASSERT_NE(scheduler.ApplyOutput(work.seq->seq_id, token), nullptr);
    }
  }
}

TEST(SchedulerTest, AssignsArrivalInAddOrderOverwritingTheCallers) {
  Scheduler scheduler(Config(4, 16, 64));
  auto first = MakeSequence(1, 4, 2);
  first->arrival = 99;
  Sequence* first_raw = first.get();
  ASSERT_TRUE(scheduler.Add(std::move(first)).ok());
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 4, 2)).ok());
  EXPECT_LT(first_raw->arrival, scheduler.Find(2)->arrival);
  EXPECT_EQ(first_raw->status, SequenceStatus::kWaiting);
  EXPECT_EQ(scheduler.num_waiting(), 2);
  EXPECT_TRUE(scheduler.has_work());
}

TEST(SchedulerTest, NewSequenceGetsItsPromptBlocksAndSamplesOnItsOnlyChunk) {
  Scheduler scheduler(Config(4, 16, 64));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 10, 4)).ok());
  SchedulerOutput out = scheduler.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  const ScheduledWork& work = out.scheduled[0];
  EXPECT_TRUE(work.is_new);
  EXPECT_EQ(work.num_tokens, 10);
  EXPECT_TRUE(work.sample);
  EXPECT_THAT(work.new_block_ids, ElementsAre(0, 1, 2));
  EXPECT_THAT(work.seq->blocks, ElementsAre(0, 1, 2));
  EXPECT_EQ(work.seq->num_computed, 10);
  EXPECT_EQ(work.seq->samples_in_flight, 1);
  EXPECT_EQ(work.seq->status, SequenceStatus::kRunning);
  EXPECT_TRUE(work.seq->on_worker);
  EXPECT_EQ(out.num_prefill_tokens, 10);
  EXPECT_EQ(out.num_decode_tokens, 0);
  EXPECT_EQ(scheduler.num_running(), 1);
  EXPECT_EQ(scheduler.num_waiting(), 0);
  EXPECT_EQ(scheduler.block_manager().num_free(), 13);
}

TEST(SchedulerTest, SchedulesRunningDecodesBeforePrefillChunks) {
  Scheduler scheduler(Config(4, 64, 10));
  // 1 has the worse priority but starts decoding first; 2 is still mid-prefill.
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 2, 8, /*priority=*/5)).ok());
  SchedulerOutput first = scheduler.Schedule();
  ASSERT_THAT(ScheduledIds(first), ElementsAre(1u));
  ApplySamples(scheduler, first);
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 40, 8, /*priority=*/0)).ok());

  SchedulerOutput second = scheduler.Schedule();
  ASSERT_THAT(ScheduledIds(second), ElementsAre(1u, 2u));
  EXPECT_EQ(second.scheduled[1].num_tokens, 9);
  EXPECT_FALSE(second.scheduled[1].sample);
  ApplySamples(scheduler, second);
  // Two running, one of them past its prompt: the decode a prefill chunk stalls.
  EXPECT_EQ(scheduler.num_running(), 2);
  EXPECT_EQ(scheduler.num_decoding(), 1);

  SchedulerOutput third = scheduler.Schedule();
  ASSERT_THAT(ScheduledIds(third), ElementsAre(1u, 2u));
  EXPECT_EQ(third.scheduled[0].num_tokens, 1);
  EXPECT_TRUE(third.scheduled[0].sample);
  EXPECT_FALSE(third.scheduled[1].is_new);
  EXPECT_EQ(third.scheduled[1].num_tokens, 9);
  EXPECT_EQ(third.num_decode_tokens, 1);
  EXPECT_EQ(third.num_prefill_tokens, 9);
}

TEST(SchedulerTest, ChunkedPrefillRespectsTheTokenBudgetAndSamplesOnlyTheLastChunk) {
  Scheduler scheduler(Config(4, 64, 8));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 20, 4)).ok());
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 3, 4)).ok());
  std::vector<int32_t> chunks;
  std::vector<bool> samples;
  std::vector<int32_t> all_blocks;
  for (int step = 0; step < 3; ++step) {
    SchedulerOutput out = scheduler.Schedule();
    int64_t tokens = 0;
    for (const ScheduledWork& work : out.scheduled) tokens += work.num_tokens;
    EXPECT_LE(tokens, 8);
    const ScheduledWork* work = WorkFor(out, 1);
    ASSERT_NE(work, nullptr);
    EXPECT_EQ(work->is_new, step == 0);
    chunks.push_back(work->num_tokens);
    samples.push_back(work->sample);
    all_blocks.insert(all_blocks.end(), work->new_block_ids.begin(),
                      work->new_block_ids.end());
    EXPECT_EQ(work->seq->blocks.size(), static_cast<size_t>((work->seq->num_computed + 3) / 4));
    if (step < 2) {
      // Sequence 2 waits while 1's prefill fills the budget...
      EXPECT_EQ(WorkFor(out, 2), nullptr) << "step " << step;
    } else {
      // ...and takes what its last chunk leaves.
      const ScheduledWork* second = WorkFor(out, 2);
      ASSERT_NE(second, nullptr);
      EXPECT_EQ(second->num_tokens, 3);
      EXPECT_TRUE(second->sample);
      EXPECT_EQ(out.num_prefill_tokens, 7);
    }
  }
  EXPECT_THAT(chunks, ElementsAre(8, 8, 4));
  EXPECT_THAT(samples, ElementsAre(false, false, true));
  EXPECT_EQ(all_blocks.size(), 5u);
  EXPECT_EQ(scheduler.Find(1)->blocks, all_blocks);
  EXPECT_EQ(scheduler.Find(1)->samples_in_flight, 1);
}

TEST(SchedulerTest, BesideDecodesAPrefillTakesAtMostItsCapAndAloneTheWholeBudget) {
  SchedulerConfig config = Config(4, 64, 32);
  config.max_prefill_tokens_beside_decodes = 6;
  Scheduler scheduler(config);
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 40, 8)).ok());
  // Alone: the whole budget.
  SchedulerOutput alone = scheduler.Schedule();
  EXPECT_EQ(WorkFor(alone, 1)->num_tokens, 32);
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 3, 8)).ok());
  SchedulerOutput rest = scheduler.Schedule();  // 1's last 8 tokens and 2's prompt
  EXPECT_THAT(ScheduledIds(rest), ElementsAre(1u, 2u));
  ApplySamples(scheduler, rest);
  ASSERT_TRUE(scheduler.Add(MakeSequence(3, 20, 8)).ok());
  // Beside two decodes: 6 prefill tokens a step, admissions included.
  for (int32_t step = 0; step < 3; ++step) {
    SchedulerOutput beside = scheduler.Schedule();
    EXPECT_EQ(beside.num_decode_tokens, 2);
    EXPECT_EQ(beside.num_prefill_tokens, 6) << "step " << step;
    ApplySamples(scheduler, beside);
  }
  scheduler.set_max_prefill_tokens_beside_decodes(0);
  SchedulerOutput uncapped = scheduler.Schedule();
  EXPECT_EQ(uncapped.num_prefill_tokens, 2);  // the last 2 of 3's 20
  EXPECT_EQ(WorkFor(uncapped, 3)->num_tokens, 2);
}

// A decode replica's: `cap` prompt tokens a step, with or without decodes.
SchedulerConfig DecodeReplicaConfig(int64_t cap) {
  SchedulerConfig config = Config(4, 64, 32);
  config.max_prefill_tokens_beside_decodes = cap;
  config.cap_prefill_without_decodes = true;
  return config;
}

TEST(SchedulerTest, ADecodeReplicasCapHoldsInStepsWithoutDecodesToo) {
  Scheduler scheduler(DecodeReplicaConfig(6));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 40, 8)).ok());
  // Alone, still 6 a step: a hand-off arriving now waits out 6 tokens' steps, not 32's.
  for (int32_t step = 0; step < 3; ++step) {
    SchedulerOutput alone = scheduler.Schedule();
    EXPECT_EQ(alone.num_decode_tokens, 0);
    EXPECT_EQ(WorkFor(alone, 1)->num_tokens, 6) << "step " << step;
  }
  scheduler.set_max_prefill_tokens_beside_decodes(6, /*without_decodes=*/false);
  EXPECT_EQ(WorkFor(scheduler.Schedule(), 1)->num_tokens, 22);  // the rest, uncapped
}

TEST(SchedulerTest, BesideDecodesAWaitingPromptGetsHalfTheCapFromALongPrefill) {
  SchedulerConfig config = Config(4, 64, 32);
  config.max_prefill_tokens_beside_decodes = 6;
  Scheduler scheduler(config);
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 3, 8)).ok());
  ApplySamples(scheduler, scheduler.Schedule());  // 1 decodes from now on
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 40, 8)).ok());
  SchedulerOutput alone = scheduler.Schedule();  // nothing waits behind 2: the whole cap
  EXPECT_EQ(WorkFor(alone, 2)->num_tokens, 6);
  ApplySamples(scheduler, alone);
  ASSERT_TRUE(scheduler.Add(MakeSequence(3, 3, 8)).ok());  // a short prompt arrives
  SchedulerOutput shared = scheduler.Schedule();
  EXPECT_EQ(shared.num_decode_tokens, 1);
  EXPECT_EQ(WorkFor(shared, 2)->num_tokens, 3);  // half the cap
  ASSERT_NE(WorkFor(shared, 3), nullptr);        // admitted at once, 3 tokens
  EXPECT_EQ(WorkFor(shared, 3)->num_tokens, 3);
  EXPECT_TRUE(WorkFor(shared, 3)->sample);
}

TEST(SchedulerTest, AHandOffIsNotHeldBehindALongPrefillByATinyCap) {
  // A decode replica on a slow CPU: one prompt token a step beside its decodes.
  Scheduler scheduler(DecodeReplicaConfig(1));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 1, 64)).ok());
  ApplySamples(scheduler, scheduler.Schedule());            // 1 decodes from now on
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 40, 8)).ok());  // a long prompt kept here
  ApplySamples(scheduler, scheduler.Schedule());
  ASSERT_EQ(scheduler.Find(2)->num_computed, 1);
  // A hand-off: its first token came from the prefill replica, its room is held.
  auto handed = MakeSequence(3, 6, 8);
  handed->output_ids = {7};
  ASSERT_TRUE(scheduler.Add(std::move(handed)).ok());
  scheduler.HoldBlocksFor(3, 2);
  SchedulerOutput admitted = scheduler.Schedule();
  ASSERT_NE(WorkFor(admitted, 3), nullptr) << "the long prompt took the one token";
  EXPECT_EQ(WorkFor(admitted, 3)->num_tokens, 1);
  EXPECT_EQ(WorkFor(admitted, 2), nullptr);
  ApplySamples(scheduler, admitted);
  // Its stream has started: it recomputes ahead of the long prompt, a token a step, until
  // its last known token, which is a decode's (the long prompt's chunk goes on beside it).
  for (int32_t step = 2; step <= 7; ++step) {
    SchedulerOutput out = scheduler.Schedule();
    ASSERT_NE(WorkFor(out, 3), nullptr) << "step " << step;
    EXPECT_EQ(WorkFor(out, 2) != nullptr, step == 7) << "step " << step;
    EXPECT_EQ(WorkFor(out, 3)->sample, step == 7);
    ApplySamples(scheduler, out);
  }
  EXPECT_EQ(scheduler.Find(3)->output_ids.size(), 2u);
  EXPECT_EQ(scheduler.Find(2)->num_computed, 2);
}

TEST(SchedulerTest, TwoPlansInFlightScheduleTheDecodeOfATokenStillInFlight) {
  Scheduler scheduler(Config(4, 16, 64));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 4, 3)).ok());
  SchedulerOutput plan1 = scheduler.Schedule();
  Sequence* seq = scheduler.Find(1);
  ASSERT_NE(seq, nullptr);
  EXPECT_EQ(seq->samples_in_flight, 1);

  // Plan 2 is built before plan 1's result: the worker knows the token it sampled.
  SchedulerOutput plan2 = scheduler.Schedule();
  ASSERT_EQ(plan2.scheduled.size(), 1u);
  EXPECT_FALSE(plan2.scheduled[0].is_new);
  EXPECT_EQ(plan2.scheduled[0].num_tokens, 1);
  EXPECT_TRUE(plan2.scheduled[0].sample);
  EXPECT_THAT(plan2.scheduled[0].new_block_ids, ElementsAre(1));  // token 4 opens block 1
  EXPECT_EQ(seq->samples_in_flight, 2);
  EXPECT_EQ(seq->num_computed, 5);

  ASSERT_EQ(scheduler.ApplyOutput(1, 10), seq);
  SchedulerOutput plan3 = scheduler.Schedule();
  ASSERT_EQ(plan3.scheduled.size(), 1u);
  EXPECT_TRUE(plan3.scheduled[0].sample);
  EXPECT_EQ(seq->num_outputs_expected(), 3);

  // Three outputs are produced or on their way: max_tokens allows no more.
  SchedulerOutput plan4 = scheduler.Schedule();
  EXPECT_THAT(plan4.scheduled, IsEmpty());
  ASSERT_EQ(scheduler.ApplyOutput(1, 11), seq);
  ASSERT_EQ(scheduler.ApplyOutput(1, 12), seq);
  EXPECT_THAT(seq->output_ids, ElementsAre(10, 11, 12));
  EXPECT_EQ(seq->samples_in_flight, 0);
  EXPECT_EQ(seq->num_computed, 6);  // the last output is never computed
  EXPECT_THAT(scheduler.Schedule().scheduled, IsEmpty());
  // No sample is in flight any more: a further output is dropped.
  EXPECT_EQ(scheduler.ApplyOutput(1, 13), nullptr);
  EXPECT_EQ(seq->output_ids.size(), 3u);
}

TEST(SchedulerTest, WithoutOverlappedSamplesADecodeWaitsForItsTokenAndPlansNameIt) {
  // Pipeline parallelism: stages before the last never know a sampled token, so a plan
  // carries it, and a sequence sits out plans while its sample is in flight.
  SchedulerConfig config = Config(4, 16, 64);
  config.overlap_samples = false;
  config.speculation.num_speculative_tokens = 3;  // never applied without overlap
  Scheduler scheduler(config);
  auto first = MakeSequence(1, 4, 3);
  first->max_speculative_tokens = 3;
  ASSERT_TRUE(scheduler.Add(std::move(first)).ok());
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 4, 3)).ok());
  SchedulerOutput plan1 = scheduler.Schedule();
  EXPECT_THAT(ScheduledIds(plan1), ElementsAre(1, 2));
  // Both samples are in flight: the next plan is empty, not their decodes.
  EXPECT_THAT(scheduler.Schedule().scheduled, IsEmpty());
  ASSERT_NE(scheduler.ApplyOutput(1, 10), nullptr);
  SchedulerOutput plan2 = scheduler.Schedule();
  ASSERT_THAT(ScheduledIds(plan2), ElementsAre(1));
  EXPECT_EQ(plan2.scheduled[0].num_speculative_tokens, 0);
  loom::v1::StepPlan wire;
  BuildStepPlan(plan2, 2, wire, /*with_input_tokens=*/true);
  ASSERT_EQ(wire.scheduled_size(), 1);
  EXPECT_THAT(wire.scheduled(0).input_token_ids(), ElementsAre(10));
  ASSERT_NE(scheduler.ApplyOutput(2, 20), nullptr);
  SchedulerOutput plan3 = scheduler.Schedule();
  ASSERT_THAT(ScheduledIds(plan3), ElementsAre(2));
  BuildStepPlan(plan3, 3, wire, /*with_input_tokens=*/false);
  EXPECT_THAT(wire.scheduled(0).input_token_ids(), IsEmpty());
}

TEST(SchedulerTest, MicroBatchesSplitReadyDecodesIntoBalancedPlans) {
  // Two pipeline stages: four sequences whose samples all came back together go out as two
  // plans of two, and the split persists as their results return one plan at a time.
  SchedulerConfig config = Config(4, 64, 256);
  config.overlap_samples = false;
  config.micro_batches = 2;
  Scheduler scheduler(config);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(scheduler.Add(MakeSequence(id, 4, 10)).ok());
  SchedulerOutput prefill = scheduler.Schedule();
  ASSERT_EQ(prefill.scheduled.size(), 4u);  // the cap is on decodes only
  ApplySamples(scheduler, prefill);
  SchedulerOutput first = scheduler.Schedule();
  SchedulerOutput second = scheduler.Schedule();
  EXPECT_THAT(ScheduledIds(first), ElementsAre(1, 2));
  EXPECT_THAT(ScheduledIds(second), ElementsAre(3, 4));
  EXPECT_THAT(scheduler.Schedule().scheduled, IsEmpty());
  ApplySamples(scheduler, first);
  EXPECT_THAT(ScheduledIds(scheduler.Schedule()), ElementsAre(1, 2));
  // Without the cap one plan takes every ready decode.
  SchedulerConfig one = Config(4, 64, 256);
  one.overlap_samples = false;
  Scheduler whole(one);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(whole.Add(MakeSequence(id, 4, 10)).ok());
  SchedulerOutput all = whole.Schedule();
  ApplySamples(whole, all);
  EXPECT_EQ(whole.Schedule().scheduled.size(), 4u);
}

TEST(SchedulerTest, BlocksBehindEveryLayersWindowAreFreedAndReused) {
  // An 8-token window on every layer, 4-token blocks: a sequence decoding far past the
  // window holds only the blocks its next queries can read (the window and the kernels'
  // read-behind margin), in a pool far smaller than prompt + max_tokens needs.
  SchedulerConfig config = Config(4, 16, 8);
  config.sliding_window = 8;
  Scheduler scheduler(config);
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 6, 120)).ok());  // 126 tokens: 32 blocks
  Sequence* seq = nullptr;
  size_t most_held = 0;
  for (int step = 0; step < 200; ++step) {
    SchedulerOutput out = scheduler.Schedule();
    if (out.scheduled.empty()) break;
    seq = out.scheduled[0].seq;
    for (const ScheduledWork& work : out.scheduled) {
      for (int32_t block : work.new_block_ids) EXPECT_GE(block, 0);
    }
    size_t held = 0;
    for (int32_t block : seq->blocks) held += block != kFreedBlock;
    most_held = std::max(most_held, held);
    // Every block a query from num_computed on can read is still held.
    const int64_t first_read = seq->num_computed - 1 - 8 + 1 - kWindowReadBehind;
    for (int64_t b = std::max<int64_t>(first_read, 0) / 4;
         b < static_cast<int64_t>(seq->blocks.size()); ++b) {
      EXPECT_NE(seq->blocks[static_cast<size_t>(b)], kFreedBlock) << step << " " << b;
    }
    ApplySamples(scheduler, out);
    if (seq->output_ids.size() == 120u) break;
  }
  ASSERT_NE(seq, nullptr);
  EXPECT_EQ(seq->output_ids.size(), 120u);
  EXPECT_LE(most_held, 12u);  // (8 + 32 + 1) / 4 + a partial block at each end
  EXPECT_GT(scheduler.num_window_freed_blocks(), 15u);
  // Without the window the same sequence can never fit this pool.
  Scheduler full(Config(4, 16, 8));
  EXPECT_EQ(full.Add(MakeSequence(1, 6, 120)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, RunsAtMostMaxNumSeqsAndAdmitsMoreWhenOneFinishes) {
  Scheduler scheduler(Config(4, 64, 256, /*max_num_seqs=*/2));
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(scheduler.Add(MakeSequence(id, 4, 8)).ok());
  SchedulerOutput first = scheduler.Schedule();
  EXPECT_THAT(ScheduledIds(first), ElementsAre(1u, 2u));
  EXPECT_EQ(scheduler.num_running(), 2);
  EXPECT_EQ(scheduler.num_waiting(), 1);
  ApplySamples(scheduler, first);
  SchedulerOutput second = scheduler.Schedule();
  EXPECT_THAT(ScheduledIds(second), ElementsAre(1u, 2u));
  scheduler.Finish(1);
  SchedulerOutput third = scheduler.Schedule();
  EXPECT_THAT(third.finished, ElementsAre(1u));
  EXPECT_THAT(ScheduledIds(third), ElementsAre(2u, 3u));
  EXPECT_TRUE(WorkFor(third, 3)->is_new);
  EXPECT_EQ(scheduler.num_running(), 2);
}

TEST(SchedulerTest, AdmitsByPriorityThenFirstComeFirstServed) {
  Scheduler scheduler(Config(4, 64, 256, /*max_num_seqs=*/1));
  // Ids deliberately out of arrival order: arrival, not the id, breaks priority ties.
  ASSERT_TRUE(scheduler.Add(MakeSequence(10, 4, 1, /*priority=*/2)).ok());
  ASSERT_TRUE(scheduler.Add(MakeSequence(8, 4, 1, /*priority=*/0)).ok());
  ASSERT_TRUE(scheduler.Add(MakeSequence(6, 4, 1, /*priority=*/1)).ok());
  ASSERT_TRUE(scheduler.Add(MakeSequence(4, 4, 1, /*priority=*/0)).ok());
  std::vector<uint64_t> order;
  for (int step = 0; step < 4; ++step) {
    SchedulerOutput out = scheduler.Schedule();
    ASSERT_EQ(out.scheduled.size(), 1u);
    const uint64_t id = out.scheduled[0].seq->seq_id;
    order.push_back(id);
    ASSERT_NE(scheduler.ApplyOutput(id, 1), nullptr);
    scheduler.Finish(id);
  }
  EXPECT_THAT(order, ElementsAre(8u, 4u, 6u, 10u));
}

TEST(SchedulerTest, AWaitingSequenceThatDoesNotFitHoldsBackLaterArrivals) {
  Scheduler scheduler(Config(4, 6, 64));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 12, 4)).ok());  // 3 blocks
  scheduler.Schedule();
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 16, 4)).ok());  // 4 blocks: does not fit yet
  ASSERT_TRUE(scheduler.Add(MakeSequence(3, 2, 4)).ok());   // 1 block would fit
  SchedulerOutput blocked = scheduler.Schedule();
  EXPECT_THAT(ScheduledIds(blocked), ElementsAre(1u));
  EXPECT_EQ(scheduler.num_waiting(), 2);
  scheduler.Finish(1);
  SchedulerOutput admitted = scheduler.Schedule();
  EXPECT_THAT(ScheduledIds(admitted), ElementsAre(2u, 3u));
}

// Disaggregated serving: a decode replica holds blocks for a hand-off from placement on.
TEST(SchedulerTest, BlocksHeldForAnArrivalAreLeftFreeByOtherAdmissions) {
  Scheduler scheduler(NoCacheConfig(4, 8, 64));
  scheduler.set_blocks_held_for_arrivals(5);
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 11, 4)).ok());  // 3 blocks: fit beside the 5
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 4, 4)).ok());   // 1 more: does not
  EXPECT_THAT(ScheduledIds(scheduler.Schedule()), ElementsAre(1u));
  EXPECT_EQ(scheduler.num_waiting(), 1);
  EXPECT_EQ(scheduler.num_held_blocks(), 5);
  // The hand-off arrives behind sequence 2 and takes its held blocks ahead of it.
  ASSERT_TRUE(scheduler.Add(MakeSequence(3, 19, 4)).ok());  // 5 blocks with its first token
  scheduler.HoldBlocksFor(3, 5);
  scheduler.set_blocks_held_for_arrivals(0);
  EXPECT_EQ(scheduler.num_blocks_held_for_waiting(), 5);
  SchedulerOutput arrived = scheduler.Schedule();
  EXPECT_THAT(ScheduledIds(arrived), ElementsAre(1u, 3u));
  EXPECT_EQ(scheduler.num_held_blocks(), 0);
  EXPECT_EQ(scheduler.Find(3)->held_blocks, 0);
  EXPECT_EQ(scheduler.num_waiting(), 1);  // 2: the pool is full now
  scheduler.Finish(3);
  EXPECT_THAT(ScheduledIds(scheduler.Schedule()), ElementsAre(1u, 2u));
}

TEST(SchedulerTest, AHeldSequenceFinishedWhileWaitingReleasesItsHold) {
  Scheduler scheduler(NoCacheConfig(4, 6, 64));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 12, 4)).ok());  // 3 blocks, running
  scheduler.Schedule();
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 20, 4)).ok());  // 6 blocks: waits
  scheduler.HoldBlocksFor(2, 6);
  scheduler.HoldBlocksFor(1, 2);                           // running: ignored
  ASSERT_TRUE(scheduler.Add(MakeSequence(3, 4, 4)).ok());  // 1 block, free but held
  EXPECT_THAT(ScheduledIds(scheduler.Schedule()), ElementsAre(1u));
  EXPECT_EQ(scheduler.num_held_blocks(), 6);
  scheduler.Finish(2);  // cancelled while it waited
  EXPECT_EQ(scheduler.num_held_blocks(), 0);
  EXPECT_THAT(ScheduledIds(scheduler.Schedule()), ElementsAre(1u, 3u));
  scheduler.HoldBlocksFor(4, 1);  // unknown: ignored
  EXPECT_EQ(scheduler.num_held_blocks(), 0);
}

// Three 8-token prompts fill a 6-block pool (block size 4); their first decodes need a
// block each.
class PreemptionTest : public ::testing::Test {
 protected:
  // Prefix caching off: these pin down recompute from scratch (SchedulerPrefixTest has
  // the recompute from cached blocks).
  PreemptionTest() : scheduler_(NoCacheConfig(4, 6, 64)) {}
  Scheduler scheduler_;
};

TEST_F(PreemptionTest, PreemptsTheLowestPriorityWhenBlocksRunOut) {
  ASSERT_TRUE(scheduler_.Add(MakeSequence(1, 8, 8, /*priority=*/0)).ok());
  ASSERT_TRUE(scheduler_.Add(MakeSequence(2, 8, 8, /*priority=*/1)).ok());
  ASSERT_TRUE(scheduler_.Add(MakeSequence(3, 8, 8, /*priority=*/0)).ok());
  SchedulerOutput first = scheduler_.Schedule();
  ASSERT_THAT(ScheduledIds(first), ElementsAre(1u, 3u, 2u));
  EXPECT_EQ(scheduler_.block_manager().num_free(), 0);
  ApplySamples(scheduler_, first, 50);

  SchedulerOutput second = scheduler_.Schedule();
  EXPECT_THAT(second.preempted, ElementsAre(2u));
  EXPECT_THAT(ScheduledIds(second), ElementsAre(1u, 3u));
  Sequence* victim = scheduler_.Find(2);
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->status, SequenceStatus::kWaiting);
  EXPECT_EQ(victim->num_computed, 0);
  EXPECT_THAT(victim->blocks, IsEmpty());
  EXPECT_FALSE(victim->on_worker);
  EXPECT_EQ(victim->num_preemptions, 1);
  EXPECT_EQ(scheduler_.num_preemptions(), 1u);
  EXPECT_EQ(scheduler_.num_running(), 2);
  EXPECT_EQ(scheduler_.num_waiting(), 1);
  // Blocks 0..5 were all in use; 2's two blocks went to the decodes of 1 and 3.
  EXPECT_EQ(scheduler_.block_manager().num_free(), 0);
  ApplySamples(scheduler_, second, 51);

  // When the others finish, 2 is recomputed: its prompt and its one output, as new.
  scheduler_.Finish(1);
  scheduler_.Finish(3);
  SchedulerOutput third = scheduler_.Schedule();
  EXPECT_THAT(third.finished, ElementsAre(1u, 3u));
  ASSERT_THAT(ScheduledIds(third), ElementsAre(2u));
  const ScheduledWork& recompute = third.scheduled[0];
  EXPECT_TRUE(recompute.is_new);
  EXPECT_EQ(recompute.num_tokens, 9);
  EXPECT_TRUE(recompute.sample);
  EXPECT_THAT(recompute.seq->output_ids, ElementsAre(50));
  EXPECT_EQ(recompute.new_block_ids.size(), 3u);
}

TEST_F(PreemptionTest, WithinAPriorityPreemptsTheLatestArrived) {
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(scheduler_.Add(MakeSequence(id, 8, 8)).ok());
  }
  SchedulerOutput first = scheduler_.Schedule();
  ASSERT_THAT(ScheduledIds(first), ElementsAre(1u, 2u, 3u));
  ApplySamples(scheduler_, first);
  SchedulerOutput second = scheduler_.Schedule();
  EXPECT_THAT(second.preempted, ElementsAre(3u));
  EXPECT_THAT(ScheduledIds(second), ElementsAre(1u, 2u));
}

TEST_F(PreemptionTest, TheLowestPriorityPreemptsItselfRatherThanABetterOne) {
  // 1's next token fits its third block; 2's opens a fourth, and none is free.
  ASSERT_TRUE(scheduler_.Add(MakeSequence(1, 10, 8, /*priority=*/0)).ok());
  ASSERT_TRUE(scheduler_.Add(MakeSequence(2, 12, 8, /*priority=*/1)).ok());
  SchedulerOutput first = scheduler_.Schedule();
  ASSERT_THAT(ScheduledIds(first), ElementsAre(1u, 2u));
  ASSERT_EQ(scheduler_.block_manager().num_free(), 0);
  ApplySamples(scheduler_, first);
  ASSERT_TRUE(scheduler_.Add(MakeSequence(3, 2, 2, /*priority=*/0)).ok());
  SchedulerOutput second = scheduler_.Schedule();
  EXPECT_THAT(ScheduledIds(second), ElementsAre(1u));
  EXPECT_THAT(second.preempted, ElementsAre(2u));
  EXPECT_EQ(scheduler_.Find(1)->status, SequenceStatus::kRunning);
  // Nothing is admitted in a plan that preempted, although 3 would fit in 2's blocks.
  EXPECT_EQ(scheduler_.block_manager().num_free(), 3);
  EXPECT_EQ(scheduler_.num_waiting(), 2);
  SchedulerOutput third = scheduler_.Schedule();
  EXPECT_THAT(ScheduledIds(third), ElementsAre(1u, 3u));
}

TEST_F(PreemptionTest, AHigherPriorityDecodePreemptsALowerOneNotYetScheduled) {
  // Same shapes, priorities swapped: 2 decodes first and takes 1's blocks.
  ASSERT_TRUE(scheduler_.Add(MakeSequence(1, 10, 8, /*priority=*/1)).ok());
  ASSERT_TRUE(scheduler_.Add(MakeSequence(2, 12, 8, /*priority=*/0)).ok());
  SchedulerOutput first = scheduler_.Schedule();
  ASSERT_THAT(ScheduledIds(first), ElementsAre(2u, 1u));
  ApplySamples(scheduler_, first);
  SchedulerOutput second = scheduler_.Schedule();
  EXPECT_THAT(ScheduledIds(second), ElementsAre(2u));
  EXPECT_THAT(second.preempted, ElementsAre(1u));
  EXPECT_THAT(WorkFor(second, 2)->new_block_ids.size(), 1u);
}

TEST(SchedulerTest, NeverPreemptsASequenceAlreadyScheduledInTheSamePlan) {
  Scheduler scheduler(Config(4, 6, 9));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 10, 8, /*priority=*/1)).ok());  // 3 blocks
  SchedulerOutput first = scheduler.Schedule();
  ApplySamples(scheduler, first);
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 20, 4, /*priority=*/0)).ok());
  SchedulerOutput second = scheduler.Schedule();
  ASSERT_THAT(ScheduledIds(second), ElementsAre(1u, 2u));
  ASSERT_EQ(WorkFor(second, 2)->num_tokens, 8);
  ASSERT_EQ(scheduler.block_manager().num_free(), 1);
  // 1's decode fits its blocks and goes first; 2's next chunk needs two blocks. The only
  // sequence not yet in the plan is 2 itself, so 2 yields, although 1 ranks lower.
  SchedulerOutput third = scheduler.Schedule();
  EXPECT_THAT(ScheduledIds(third), ElementsAre(1u));
  EXPECT_THAT(third.preempted, ElementsAre(2u));
  EXPECT_EQ(scheduler.Find(1)->status, SequenceStatus::kRunning);
  EXPECT_EQ(scheduler.Find(1)->blocks.size(), 3u);
}

TEST_F(PreemptionTest, ASequencePreemptedWithASampleInFlightWaitsForItsToken) {
  ASSERT_TRUE(scheduler_.Add(MakeSequence(1, 8, 8, /*priority=*/0)).ok());
  ASSERT_TRUE(scheduler_.Add(MakeSequence(2, 8, 8, /*priority=*/0)).ok());
  ASSERT_TRUE(scheduler_.Add(MakeSequence(3, 8, 8, /*priority=*/1)).ok());
  SchedulerOutput first = scheduler_.Schedule();
  // Plan 2 before plan 1's results: 3 is preempted with its first token in flight.
  SchedulerOutput second = scheduler_.Schedule();
  EXPECT_THAT(second.preempted, ElementsAre(3u));
  Sequence* victim = scheduler_.Find(3);
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->samples_in_flight, 1);

  scheduler_.Finish(1);
  scheduler_.Finish(2);
  SchedulerOutput third = scheduler_.Schedule();
  EXPECT_THAT(third.finished, ElementsAre(1u, 2u));
  EXPECT_THAT(third.scheduled, IsEmpty()) << "admitted before its token came back";

  // Plan 1's result still belongs to it (the others are gone: their outputs drop).
  EXPECT_EQ(scheduler_.ApplyOutput(1, 60), nullptr);
  EXPECT_EQ(scheduler_.ApplyOutput(3, 61), victim);
  SchedulerOutput fourth = scheduler_.Schedule();
  ASSERT_THAT(ScheduledIds(fourth), ElementsAre(3u));
  EXPECT_TRUE(fourth.scheduled[0].is_new);
  EXPECT_EQ(fourth.scheduled[0].num_tokens, 9);
  EXPECT_TRUE(fourth.scheduled[0].sample);
  EXPECT_THAT(victim->output_ids, ElementsAre(61));
}

// A fake replica worker: keeps what the plans told it and checks that every plan is
// executable (known tokens, block ownership), sampling output number k as token k. It
// also models the KV pool's contents: each block remembers the tokens its K/V were
// computed from (every token of the writer's context up to the block's end, since K/V at
// a position depend on everything before it), so a sequence starting from cached blocks
// is checked to read exactly the K/V its own tokens would have produced, and a block
// is never written while another sequence uses it.
class FakeWorker {
 public:
  explicit FakeWorker(int32_t block_size) : block_size_(block_size) {}

  struct Sample {
    uint64_t seq_id;
    int32_t token;
  };

  std::vector<Sample> Run(const SchedulerOutput& plan) {
    for (const uint64_t id : plan.finished) Drop(id);
    for (const uint64_t id : plan.preempted) Drop(id);
    // Host tier copies, in order, before the forward pass.
    for (const KvCopy& copy : plan.kv_copies) {
      if (copy.to_host) {
        auto content = contents_.find(copy.device_block);
        if (content == contents_.end()) {
          ADD_FAILURE() << "offloads block " << copy.device_block << " never computed";
          continue;
        }
        EXPECT_FALSE(block_users_.contains(copy.device_block))
            << "offloads block " << copy.device_block << " a live sequence still uses";
        host_[copy.host_slot] = content->second;
        ++num_offloads_;
      } else {
        auto held = host_.find(copy.host_slot);
        if (held == host_.end()) {
          ADD_FAILURE() << "reloads host slot " << copy.host_slot << " never written";
          continue;
        }
        EXPECT_FALSE(block_users_.contains(copy.device_block))
            << "reloads into block " << copy.device_block << " a live sequence uses";
        contents_[copy.device_block] = held->second;
        ++num_reloads_;
      }
    }
    // Cached prefixes are read against the pool as earlier plans left it: this plan's
    // writes run in the same forward pass and cannot be relied on.
    for (const ScheduledWork& work : plan.scheduled) {
      if (!work.is_new) continue;
      const Sequence& seq = *work.seq;
      std::vector<int32_t> tokens = seq.prompt_ids;
      tokens.insert(tokens.end(), seq.output_ids.begin(), seq.output_ids.end());
      EXPECT_LT(work.num_cached_tokens, static_cast<int32_t>(tokens.size()));
      EXPECT_EQ(work.num_cached_tokens % block_size_, 0);
      for (int32_t b = 0; b * block_size_ < work.num_cached_tokens; ++b) {
        if (static_cast<size_t>(b) >= work.new_block_ids.size()) {
          ADD_FAILURE() << "sequence " << seq.seq_id << " has cached tokens but no block";
          break;
        }
        const int32_t block = work.new_block_ids[static_cast<size_t>(b)];
        const std::vector<int32_t> expected(tokens.begin(), tokens.begin() + (b + 1) * block_size_);
        auto content = contents_.find(block);
        if (content == contents_.end()) {
          ADD_FAILURE() << "sequence " << seq.seq_id << " reuses block " << block
                        << " never computed";
          continue;
        }
        EXPECT_EQ(content->second, expected) << "sequence " << seq.seq_id << " reuses block "
                                             << block << " whose K/V come from other tokens";
      }
    }
    std::vector<Sample> samples;
    for (const ScheduledWork& work : plan.scheduled) {
      const Sequence& seq = *work.seq;
      if (work.is_new) {
        EXPECT_FALSE(state_.contains(seq.seq_id)) << "NewSequence for a live sequence";
        // The NewSequence message carries the prompt and the applied outputs.
        State fresh;
        fresh.tokens = seq.prompt_ids;
        fresh.tokens.insert(fresh.tokens.end(), seq.output_ids.begin(), seq.output_ids.end());
        fresh.prompt_len = static_cast<int64_t>(seq.prompt_ids.size());
        fresh.num_outputs = static_cast<int64_t>(seq.output_ids.size());
        fresh.computed = work.num_cached_tokens;
        state_[seq.seq_id] = fresh;
      } else {
        EXPECT_EQ(work.num_cached_tokens, 0);
      }
      auto it = state_.find(seq.seq_id);
      if (it == state_.end()) {
        ADD_FAILURE() << "sequence " << seq.seq_id << " scheduled without state";
        continue;
      }
      State& state = it->second;
      for (const int32_t block : work.new_block_ids) {
        ++block_users_[block];
        state.blocks.push_back(block);
      }
      EXPECT_GE(work.num_tokens, 1);
      const int64_t begin = state.computed;
      state.computed += work.num_tokens;
      const int64_t known = state.prompt_len + state.num_outputs;
      EXPECT_LE(state.computed, known) << "computes a token the worker does not know";
      EXPECT_GE(static_cast<int64_t>(state.blocks.size()) * block_size_, state.computed);
      EXPECT_EQ(work.sample, state.computed == known);
      // Write K/V for positions [begin, computed).
      for (int64_t pos = begin; pos < state.computed && pos < known; ++pos) {
        const size_t b = static_cast<size_t>(pos / block_size_);
        if (b >= state.blocks.size()) break;
        const int32_t block = state.blocks[b];
        EXPECT_EQ(block_users_[block], 1)
            << "sequence " << seq.seq_id << " writes block " << block << " that others use";
        contents_[block].assign(state.tokens.begin(), state.tokens.begin() + pos + 1);
      }
      if (work.sample) {
        const int32_t token = static_cast<int32_t>(state.num_outputs);
        samples.push_back({seq.seq_id, token});
        state.tokens.push_back(token);
        ++state.num_outputs;
      }
    }
    return samples;
  }

 private:
  struct State {
    std::vector<int32_t> tokens;  // prompt, then outputs (sampled ones included)
    int64_t prompt_len = 0;
    int64_t num_outputs = 0;
    int64_t computed = 0;
    std::vector<int32_t> blocks;
  };

  void Drop(uint64_t id) {
    auto it = state_.find(id);
    if (it == state_.end()) return;
    for (const int32_t block : it->second.blocks) {
      if (--block_users_[block] == 0) block_users_.erase(block);
    }
    state_.erase(it);
  }

 public:
  int64_t num_offloads() const { return num_offloads_; }
  int64_t num_reloads() const { return num_reloads_; }

 private:
  int32_t block_size_;
  absl::flat_hash_map<uint64_t, State> state_;
  absl::flat_hash_map<int32_t, std::vector<int32_t>> host_;  // host slot -> its block's tokens
  int64_t num_offloads_ = 0;
  int64_t num_reloads_ = 0;
  absl::flat_hash_map<int32_t, int32_t> block_users_;  // live sequences holding the block
  // block -> the tokens [0, last written position] its K/V were computed from.
  absl::flat_hash_map<int32_t, std::vector<int32_t>> contents_;
};

// Drives `num_seqs` sequences of assorted lengths and priorities to completion through a
// FakeWorker with two plans in flight, as the replica's step loop does, checking every
// plan against the configuration. Returns the preemptions it took.
uint64_t DriveToCompletion(const SchedulerConfig& config, uint64_t num_seqs) {
  Scheduler scheduler(config);
  const int64_t max_length = config.num_blocks * config.block_size;
  std::map<uint64_t, int32_t> max_tokens;
  for (uint64_t id = 1; id <= num_seqs; ++id) {
    const int32_t outputs = 1 + static_cast<int32_t>((id * 5) % 13);
    const int32_t prompt_len = static_cast<int32_t>(
        std::min<int64_t>(1 + static_cast<int64_t>((id * 7) % 19), max_length - outputs));
    const int32_t priority = static_cast<int32_t>(id % 3);
    const absl::Status added = scheduler.Add(MakeSequence(id, prompt_len, outputs, priority));
    if (!added.ok()) {
      ADD_FAILURE() << added;
      return 0;
    }
    max_tokens[id] = outputs;
  }

  FakeWorker worker(config.block_size);
  std::deque<std::vector<FakeWorker::Sample>> in_flight;
  std::map<uint64_t, std::vector<int32_t>> completed;
  int steps = 0;
  while (scheduler.has_work() || !in_flight.empty()) {
    if (++steps > 20000) {
      ADD_FAILURE() << "no progress: " << completed.size() << " of " << num_seqs
                    << " sequences completed";
      return 0;
    }
    SchedulerOutput plan = scheduler.Schedule();
    int64_t tokens = 0;
    for (const ScheduledWork& work : plan.scheduled) tokens += work.num_tokens;
    EXPECT_LE(tokens, config.max_num_batched_tokens);
    EXPECT_EQ(tokens, plan.num_decode_tokens + plan.num_prefill_tokens);
    EXPECT_LE(scheduler.num_running(), config.max_num_seqs);
    // An empty plan is not sent.
    if (!plan.empty()) in_flight.push_back(worker.Run(plan));
    // Two plans in flight: apply the older result once the newer plan is out, or when
    // there is nothing to send until it comes back.
    if (in_flight.size() == 2 || (plan.empty() && !in_flight.empty())) {
      for (const FakeWorker::Sample& sample : in_flight.front()) {
        Sequence* seq = scheduler.ApplyOutput(sample.seq_id, sample.token);
        if (seq == nullptr) {
          ADD_FAILURE() << "output of sequence " << sample.seq_id << " dropped";
          continue;
        }
        if (static_cast<int32_t>(seq->output_ids.size()) == seq->max_tokens) {
          completed[seq->seq_id] = seq->output_ids;
          scheduler.Finish(seq->seq_id);
        }
      }
      in_flight.pop_front();
    }
  }
  EXPECT_EQ(completed.size(), max_tokens.size());
  for (const auto& [id, outputs] : completed) {
    // The fake worker samples output k as token k: order survives preemptions.
    std::vector<int32_t> expected(static_cast<size_t>(max_tokens[id]));
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(outputs, expected) << "sequence " << id;
  }
  EXPECT_EQ(scheduler.block_manager().num_free(), config.num_blocks);
  EXPECT_EQ(scheduler.num_running(), 0);
  EXPECT_EQ(scheduler.num_waiting(), 0);
  return scheduler.num_preemptions();
}

TEST(SchedulerTest, DrivesManySequencesToCompletionThroughATinyPool) {
  const uint64_t preemptions = DriveToCompletion(Config(4, 10, 16, /*max_num_seqs=*/6), 24);
  EXPECT_GT(preemptions, 0u) << "the pool was meant to be too small";
}

TEST(SchedulerTest, DrivesSequencesToCompletionOneTokenPerStep) {
  // A one-token budget chunks every prefill down to single tokens (and runs one sequence
  // at a time: the running decode always takes the budget).
  EXPECT_EQ(DriveToCompletion(Config(1, 20, 1, /*max_num_seqs=*/4), 12), 0u);
}

TEST(SchedulerTest, DrivesSequencesToCompletionThroughOneTokenBlocks) {
  const uint64_t preemptions = DriveToCompletion(Config(1, 20, 3, /*max_num_seqs=*/4), 12);
  EXPECT_GT(preemptions, 0u) << "the pool was meant to be too small";
}

TEST(SchedulerTest, DrivesSequencesToCompletionWithoutPreemptionInARoomyPool) {
  EXPECT_EQ(DriveToCompletion(Config(16, 1024, 64), 40), 0u);
}

TEST(SchedulerTest, FinishOfAWaitingSequenceRemovesItWithoutARelease) {
  Scheduler scheduler(Config(4, 16, 64));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 4, 2)).ok());
  scheduler.Finish(1);
  EXPECT_EQ(scheduler.num_waiting(), 0);
  EXPECT_EQ(scheduler.Find(1), nullptr);
  EXPECT_FALSE(scheduler.has_work());
  SchedulerOutput out = scheduler.Schedule();
  EXPECT_TRUE(out.empty());
  scheduler.Finish(42);  // unknown: ignored
  EXPECT_FALSE(scheduler.has_work());
}

TEST(SchedulerTest, FinishReleasesBlocksAtOnceAndTheIdInTheNextPlanOnly) {
  Scheduler scheduler(Config(4, 16, 64));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 10, 4)).ok());
  SchedulerOutput first = scheduler.Schedule();
  Sequence* seq = first.scheduled[0].seq;
  scheduler.Finish(1);
  EXPECT_EQ(scheduler.block_manager().num_free(), 16);
  EXPECT_EQ(scheduler.Find(1), nullptr);
  EXPECT_TRUE(scheduler.has_work());
  // Plan 1 is still in flight: its result for the finished sequence is dropped.
  EXPECT_EQ(scheduler.ApplyOutput(1, 5), nullptr);
  SchedulerOutput second = scheduler.Schedule();
  EXPECT_THAT(second.finished, ElementsAre(1u));
  EXPECT_THAT(second.scheduled, IsEmpty());
  // The object outlives the plan that released it (plan 1's pointers stay valid).
  EXPECT_EQ(seq->status, SequenceStatus::kFinished);
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_TRUE(scheduler.Schedule().empty());
}

TEST(SchedulerTest, APreemptedThenFinishedSequenceIsNotReleasedTwice) {
  Scheduler scheduler(Config(4, 6, 64));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 12, 8, /*priority=*/0)).ok());
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 12, 8, /*priority=*/1)).ok());
  SchedulerOutput first = scheduler.Schedule();
  ApplySamples(scheduler, first);
  SchedulerOutput second = scheduler.Schedule();
  ASSERT_THAT(second.preempted, ElementsAre(2u));
  scheduler.Finish(2);
  EXPECT_EQ(scheduler.num_waiting(), 0);
  SchedulerOutput third = scheduler.Schedule();
  EXPECT_THAT(third.finished, IsEmpty());
}

TEST(SchedulerTest, AddRejectsWhatCanNeverRunAndAFullQueue) {
  SchedulerConfig config = Config(4, 8, 64);
  config.max_waiting = 2;
  Scheduler scheduler(config);

  const absl::Status too_long = scheduler.Add(MakeSequence(1, 30, 3));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.message(), HasSubstr("30"));
  EXPECT_THAT(too_long.message(), HasSubstr("9 KV blocks"));
  EXPECT_THAT(too_long.message(), HasSubstr("has 8"));
  EXPECT_TRUE(scheduler.Add(MakeSequence(2, 29, 3)).ok());  // exactly 8 blocks

  EXPECT_EQ(scheduler.Add(MakeSequence(3, 0, 3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.Add(MakeSequence(4, 4, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.Add(nullptr).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status duplicate = scheduler.Add(MakeSequence(2, 4, 2));
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(duplicate.message(), HasSubstr("in use"));

  ASSERT_TRUE(scheduler.Add(MakeSequence(5, 4, 2)).ok());
  const absl::Status full = scheduler.Add(MakeSequence(6, 4, 2));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(scheduler.num_waiting(), 2);
}

TEST(SchedulerTest, AFinishedIdStaysReservedUntilThePlanThatReleasesIt) {
  Scheduler scheduler(Config(4, 16, 64));
  ASSERT_TRUE(scheduler.Add(MakeSequence(1, 4, 2)).ok());
  scheduler.Schedule();
  scheduler.Finish(1);
  EXPECT_EQ(scheduler.Add(MakeSequence(1, 4, 2)).code(), absl::StatusCode::kInvalidArgument);
  SchedulerOutput release = scheduler.Schedule();
  ASSERT_THAT(release.finished, ElementsAre(1u));
  EXPECT_TRUE(scheduler.Add(MakeSequence(1, 4, 2)).ok());
  SchedulerOutput again = scheduler.Schedule();
  ASSERT_THAT(ScheduledIds(again), ElementsAre(1u));
  EXPECT_TRUE(again.scheduled[0].is_new);
}

TEST(SchedulerTest, ApplyOutputOfAnUnknownIdReturnsNull) {
  Scheduler scheduler(Config(4, 16, 64));
  EXPECT_EQ(scheduler.ApplyOutput(9, 1), nullptr);
}

TEST(SchedulerTest, TakeAllReturnsEverySequenceWithItsBlocksFreed) {
  Scheduler scheduler(Config(4, 16, 64, /*max_num_seqs=*/2));
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(scheduler.Add(MakeSequence(id, 6, 4)).ok());
  SchedulerOutput first = scheduler.Schedule();
  ASSERT_EQ(first.scheduled.size(), 2u);
  ASSERT_LT(scheduler.block_manager().num_free(), 16);

  std::vector<std::unique_ptr<Sequence>> taken = scheduler.TakeAll();
  std::vector<uint64_t> ids;
  for (const auto& seq : taken) {
    ids.push_back(seq->seq_id);
    EXPECT_FALSE(seq->on_worker);
    EXPECT_THAT(seq->blocks, IsEmpty());
    EXPECT_EQ(seq->num_computed, 0);
    EXPECT_EQ(seq->samples_in_flight, 0);
    EXPECT_EQ(seq->status, SequenceStatus::kWaiting);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_THAT(ids, ElementsAre(1u, 2u, 3u));
  EXPECT_EQ(scheduler.block_manager().num_free(), 16);
  EXPECT_EQ(scheduler.num_running(), 0);
  EXPECT_EQ(scheduler.num_waiting(), 0);
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_TRUE(scheduler.Schedule().empty());

  // They can be queued again (elsewhere, or here once a worker is back).
  ASSERT_TRUE(scheduler.Add(std::move(taken[0])).ok());
  SchedulerOutput again = scheduler.Schedule();
  ASSERT_EQ(again.scheduled.size(), 1u);
  EXPECT_TRUE(again.scheduled[0].is_new);
}

// ---------------------------------------------------------------------------------------
// Prefix caching.

std::unique_ptr<Sequence> SequenceWithPrompt(uint64_t id, std::vector<int32_t> prompt,
                                             int32_t max_tokens, int32_t priority = 0) {
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = id;
  seq->priority = priority;
  seq->prompt_ids = std::move(prompt);
  seq->max_tokens = max_tokens;
  return seq;
}

std::vector<int32_t> Tokens(int32_t first, int32_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(SchedulerPrefixTest, ASequenceSharingAPrefixWithARunningOneReusesItsBlocks) {
  Scheduler scheduler(Config(4, 32, 64));
  FakeWorker worker(4);
  const std::vector<int32_t> shared = Tokens(100, 8);  // two full blocks
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(1, Concat(shared, {1, 2}), 8)).ok());
  SchedulerOutput first = scheduler.Schedule();
  worker.Run(first);
  ASSERT_EQ(WorkFor(first, 1)->num_cached_tokens, 0);
  const std::vector<int32_t> a_blocks = scheduler.Find(1)->blocks;
  ASSERT_EQ(a_blocks.size(), 3u);
  ApplySamples(scheduler, first);

  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(2, Concat(shared, {3, 4, 5}), 8)).ok());
  SchedulerOutput second = scheduler.Schedule();
  worker.Run(second);
  const ScheduledWork* b = WorkFor(second, 2);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->is_new);
  EXPECT_EQ(b->num_cached_tokens, 8);
  EXPECT_EQ(b->num_tokens, 3);  // only its own tail is computed
  ASSERT_EQ(b->new_block_ids.size(), 3u);
  EXPECT_EQ(b->new_block_ids[0], a_blocks[0]);
  EXPECT_EQ(b->new_block_ids[1], a_blocks[1]);
  EXPECT_NE(b->new_block_ids[2], a_blocks[2]);  // partial blocks are never shared
  EXPECT_EQ(scheduler.block_manager().ref_count(a_blocks[0]), 2);
  EXPECT_EQ(scheduler.block_manager().ref_count(a_blocks[1]), 2);
  EXPECT_EQ(scheduler.block_manager().ref_count(a_blocks[2]), 1);
  EXPECT_EQ(scheduler.Find(2)->num_cached_tokens, 8);
  EXPECT_EQ(second.num_prefill_tokens, 3);

  // Both finish: the shared blocks are released only when their last user goes.
  scheduler.Finish(1);
  EXPECT_EQ(scheduler.block_manager().ref_count(a_blocks[0]), 1);
  scheduler.Finish(2);
  EXPECT_EQ(scheduler.block_manager().ref_count(a_blocks[0]), 0);
  EXPECT_EQ(scheduler.block_manager().num_free(), 32);
}

TEST(SchedulerPrefixTest, BlocksComputedByAPlanAreNotSharedInThatSamePlan) {
  Scheduler scheduler(Config(4, 32, 64));
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(1, Tokens(100, 9), 4)).ok());
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(2, Tokens(100, 9), 4)).ok());
  const SchedulerOutput plan = scheduler.Schedule();
  ASSERT_EQ(plan.scheduled.size(), 2u);
  EXPECT_EQ(WorkFor(plan, 2)->num_cached_tokens, 0);
  EXPECT_EQ(WorkFor(plan, 2)->num_tokens, 9);
}

TEST(SchedulerPrefixTest, NeverReusesTheBlockHoldingTheLastPromptToken) {
  Scheduler scheduler(Config(4, 32, 64));
  FakeWorker worker(4);
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(1, Tokens(100, 8), 1)).ok());
  SchedulerOutput first = scheduler.Schedule();
  worker.Run(first);
  ApplySamples(scheduler, first);
  scheduler.Finish(1);
  EXPECT_EQ(scheduler.block_manager().num_cached(), 2);

  // The same 8-token prompt again: block 1 holds its last token, so it is computed.
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(2, Tokens(100, 8), 1)).ok());
  const SchedulerOutput second = scheduler.Schedule();
  worker.Run(second);
  EXPECT_EQ(WorkFor(second, 2)->num_cached_tokens, 4);
  EXPECT_EQ(WorkFor(second, 2)->num_tokens, 4);
  EXPECT_TRUE(WorkFor(second, 2)->sample);
}

TEST(SchedulerPrefixTest, APromptScoringSequenceComputesEveryPositionItScores) {
  // Tokens 0-11 are cached (three blocks of 4). A sequence scoring from token 6 needs
  // position 5 computed: it takes only the first block.
  Scheduler scheduler(Config(4, 8, 64));
  FakeWorker worker(4);
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(1, Tokens(100, 13), 1)).ok());
  SchedulerOutput first = scheduler.Schedule();
  worker.Run(first);
  ApplySamples(scheduler, first);
  scheduler.Finish(1);
  ASSERT_EQ(scheduler.block_manager().num_cached(), 3);

  std::unique_ptr<Sequence> scoring = SequenceWithPrompt(2, Tokens(100, 14), 1);
  scoring->score_prompt_from = 6;
  ASSERT_TRUE(scheduler.Add(std::move(scoring)).ok());
  SchedulerOutput second = scheduler.Schedule();
  const ScheduledWork* work = WorkFor(second, 2);
  ASSERT_NE(work, nullptr);
  EXPECT_EQ(work->num_cached_tokens, 4);
  EXPECT_EQ(work->num_tokens, 10);
}

TEST(SchedulerPrefixTest, AFinishedSequencesBlocksStayCachedAndAreRevived) {
  Scheduler scheduler(Config(4, 8, 64));
  FakeWorker worker(4);
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(1, Tokens(100, 13), 1)).ok());
  SchedulerOutput first = scheduler.Schedule();
  worker.Run(first);
  ApplySamples(scheduler, first);
  const std::vector<int32_t> blocks = scheduler.Find(1)->blocks;
  scheduler.Finish(1);
  EXPECT_EQ(scheduler.block_manager().num_free(), 8);
  EXPECT_EQ(scheduler.block_manager().num_cached(), 3);

  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(2, Tokens(100, 14), 1)).ok());
  SchedulerOutput second = scheduler.Schedule();
  worker.Run(second);
  const ScheduledWork* work = WorkFor(second, 2);
  EXPECT_EQ(work->num_cached_tokens, 12);
  EXPECT_EQ(work->num_tokens, 2);
  ASSERT_EQ(work->new_block_ids.size(), 4u);
  for (size_t b = 0; b < 3; ++b) EXPECT_EQ(work->new_block_ids[b], blocks[b]);
  // Three revived plus one new block: four fewer free.
  EXPECT_EQ(scheduler.block_manager().num_free(), 4);
  EXPECT_EQ(scheduler.num_cached_tokens_admitted(), 12);
  EXPECT_EQ(scheduler.num_prompt_tokens_admitted(), 27);
}

TEST(SchedulerPrefixTest, DifferentHashSeedsNeverShare) {
  Scheduler scheduler(Config(4, 32, 64));
  FakeWorker worker(4);
  auto with_seed = [](uint64_t id, const char* salt) {
    auto seq = SequenceWithPrompt(id, Tokens(100, 10), 2);
    seq->hash_seed = PrefixHashSeed("model", salt);
    seq->cache_salt = salt;
    return seq;
  };
  ASSERT_TRUE(scheduler.Add(with_seed(1, "tenant-a")).ok());
  SchedulerOutput first = scheduler.Schedule();
  worker.Run(first);
  ApplySamples(scheduler, first);
  ASSERT_TRUE(scheduler.Add(with_seed(2, "tenant-b")).ok());
  ASSERT_TRUE(scheduler.Add(with_seed(3, "tenant-a")).ok());
  const SchedulerOutput second = scheduler.Schedule();
  worker.Run(second);
  EXPECT_EQ(WorkFor(second, 2)->num_cached_tokens, 0);
  EXPECT_EQ(WorkFor(second, 3)->num_cached_tokens, 8);
}

TEST(SchedulerPrefixTest, CollidingHashesNeverServeAnotherPromptsBlocks) {
  // Every block hash ignores its tokens (test hook), and two tenants' seeds are equal (as
  // if their salts collided): only the sequences whose tokens and salt match share.
  SetBlockHashCollisionsForTesting(true);
  Scheduler scheduler(Config(4, 32, 64));
  FakeWorker worker(4);
  auto make = [](uint64_t id, int32_t first_token, const char* salt) {
    auto seq = SequenceWithPrompt(id, Tokens(first_token, 10), 2);
    seq->hash_seed = PrefixHashSeed("model", "");
    seq->cache_salt = salt;
    return seq;
  };
  ASSERT_TRUE(scheduler.Add(make(1, 100, "a")).ok());
  SchedulerOutput first = scheduler.Schedule();
  worker.Run(first);
  ApplySamples(scheduler, first);
  ASSERT_TRUE(scheduler.Add(make(2, 500, "a")).ok());  // other tokens
  ASSERT_TRUE(scheduler.Add(make(3, 100, "b")).ok());  // other salt
  ASSERT_TRUE(scheduler.Add(make(4, 100, "a")).ok());  // the same prompt
  const SchedulerOutput second = scheduler.Schedule();
  worker.Run(second);
  SetBlockHashCollisionsForTesting(false);
  EXPECT_EQ(WorkFor(second, 2)->num_cached_tokens, 0);
  EXPECT_EQ(WorkFor(second, 3)->num_cached_tokens, 0);
  EXPECT_EQ(WorkFor(second, 4)->num_cached_tokens, 8);
  EXPECT_GE(scheduler.block_manager().num_verification_failures(), 2);
}

TEST(SchedulerPrefixTest, TurnedOffEverySequenceComputesEverything) {
  SchedulerConfig config = Config(4, 32, 64);
  config.enable_prefix_caching = false;
  Scheduler scheduler(config);
  FakeWorker worker(4);
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(1, Tokens(100, 10), 2)).ok());
  SchedulerOutput first = scheduler.Schedule();
  worker.Run(first);
  ApplySamples(scheduler, first);
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(2, Tokens(100, 10), 2)).ok());
  const SchedulerOutput second = scheduler.Schedule();
  EXPECT_EQ(WorkFor(second, 2)->num_cached_tokens, 0);
  EXPECT_EQ(WorkFor(second, 2)->num_tokens, 10);
  EXPECT_EQ(scheduler.block_manager().num_cached(), 0);
}

TEST(SchedulerPrefixTest, GeneratedTokensAreCachedOnceTheirIdsAreKnown) {
  // A multi-turn chat resends the previous answer: blocks filled by outputs are cached.
  Scheduler scheduler(Config(4, 32, 64));
  FakeWorker worker(4);
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(1, Tokens(100, 6), 6)).ok());
  std::deque<std::vector<FakeWorker::Sample>> in_flight;
  std::vector<int32_t> outputs;
  while (scheduler.has_work() || !in_flight.empty()) {
    SchedulerOutput plan = scheduler.Schedule();
    if (!plan.empty()) in_flight.push_back(worker.Run(plan));
    if (in_flight.size() == 2 || (plan.empty() && !in_flight.empty())) {
      for (const FakeWorker::Sample& sample : in_flight.front()) {
        Sequence* seq = scheduler.ApplyOutput(sample.seq_id, sample.token);
        ASSERT_NE(seq, nullptr);
        if (static_cast<int32_t>(seq->output_ids.size()) == seq->max_tokens) {
          outputs = seq->output_ids;
          scheduler.Finish(seq->seq_id);
        }
      }
      in_flight.pop_front();
    }
  }
  // 6 prompt + 6 outputs, the last never computed: 11 tokens of K/V, two full blocks.
  EXPECT_EQ(scheduler.block_manager().num_cached(), 2);
  std::vector<int32_t> next_turn = Concat(Tokens(100, 6), outputs);
  next_turn = Concat(next_turn, {7, 7, 7});
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(2, next_turn, 1)).ok());
  const SchedulerOutput plan = scheduler.Schedule();
  worker.Run(plan);
  EXPECT_EQ(WorkFor(plan, 2)->num_cached_tokens, 8);
}

// Drives sequences through `scheduler` with two plans in flight (as the replica loop
// does), finishing them at max_tokens, with the fake worker checking every plan. Calls
// `after_step` after each step. Returns the outputs of every completed sequence.
std::map<uint64_t, std::vector<int32_t>> Drive(
    Scheduler& scheduler, FakeWorker& worker,
    const std::function<void(const SchedulerOutput&)>& after_step = nullptr) {
  std::deque<std::vector<FakeWorker::Sample>> in_flight;
  std::map<uint64_t, std::vector<int32_t>> completed;
  int steps = 0;
  while (scheduler.has_work() || !in_flight.empty()) {
    if (++steps > 50000) {
      ADD_FAILURE() << "no progress";
      break;
    }
    SchedulerOutput plan = scheduler.Schedule();
    if (!plan.empty()) in_flight.push_back(worker.Run(plan));
    if (in_flight.size() == 2 || (plan.empty() && !in_flight.empty())) {
      for (const FakeWorker::Sample& sample : in_flight.front()) {
        Sequence* seq = scheduler.ApplyOutput(sample.seq_id, sample.token);
        if (seq == nullptr) continue;
        if (static_cast<int32_t>(seq->output_ids.size()) == seq->max_tokens) {
          completed[seq->seq_id] = seq->output_ids;
          scheduler.Finish(seq->seq_id);
        }
      }
      in_flight.pop_front();
    }
    if (after_step) after_step(plan);
  }
  return completed;
}

TEST(SchedulerPrefixTest, APreemptedSequenceReusesItsStillCachedBlocks) {
  // 7 blocks of 4: two sequences of 8-token prompts growing to 8 + 12 tokens cannot both
  // fit; the later one is preempted and, once the first finishes, recomputed from cache.
  Scheduler scheduler(Config(4, 7, 64));
  FakeWorker worker(4);
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(1, Tokens(100, 8), 10, /*priority=*/0)).ok());
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(2, Tokens(500, 8), 12, /*priority=*/1)).ok());
  int32_t readmitted_cached = -1;
  const auto completed = Drive(scheduler, worker, [&](const SchedulerOutput& plan) {
    const ScheduledWork* work = WorkFor(plan, 2);
    if (work != nullptr && work->is_new && work->seq->num_preemptions > 0 &&
        readmitted_cached < 0) {
      readmitted_cached = work->num_cached_tokens;
    }
  });
  EXPECT_EQ(completed.size(), 2u);
  EXPECT_GT(scheduler.num_preemptions(), 0u);
  EXPECT_GE(readmitted_cached, 8) << "the recompute should start from its cached blocks";
  EXPECT_EQ(completed.at(2), Tokens(0, 12));
  EXPECT_EQ(scheduler.block_manager().num_free(), 7);
}

// Fuzz: many sequences drawn from a few shared prefixes, random lengths and priorities,
// random cancellations, through a pool small enough to preempt. After every step: each
// block's reference count equals the number of live sequences holding it, free blocks
// are exactly those with no reference, and the fake worker's content checks pass. At the
// end every block is free.
void FuzzOnce(uint32_t seed, int32_t block_size, int64_t num_blocks, int64_t num_host_blocks = 0,
              FakeWorker* observed = nullptr) {
  std::mt19937 rng(seed);
  SchedulerConfig config = Config(block_size, num_blocks, 24, /*max_num_seqs=*/8);
  config.num_host_blocks = num_host_blocks;
  Scheduler scheduler(config);
  FakeWorker worker(block_size);
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 4; ++p) {
    prefixes.push_back(Tokens(1000 * (p + 1), 1 + static_cast<int32_t>(rng() % 13)));
  }
  std::vector<uint64_t> ids;
  uint64_t next_id = 1;
  auto add_some = [&](int count) {
    for (int i = 0; i < count; ++i) {
      std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
      const int32_t tail = static_cast<int32_t>(rng() % 6);
      for (int32_t t = 0; t < tail; ++t) prompt.push_back(static_cast<int32_t>(rng() % 50));
      const int32_t max_tokens = 1 + static_cast<int32_t>(rng() % 9);
      if (static_cast<int64_t>(prompt.size()) + max_tokens > num_blocks * block_size) continue;
      const uint64_t id = next_id++;
      ASSERT_TRUE(scheduler
                      .Add(SequenceWithPrompt(id, std::move(prompt), max_tokens,
                                              static_cast<int32_t>(rng() % 3)))
                      .ok());
      ids.push_back(id);
    }
  };
  add_some(12);
  int steps = 0;
  Drive(scheduler, worker, [&](const SchedulerOutput&) {
    ++steps;
    if (steps % 5 == 0 && steps < 200) add_some(2);
    if (rng() % 11 == 0 && !ids.empty()) scheduler.Finish(ids[rng() % ids.size()]);  // cancel
    std::map<int32_t, int32_t> users;
    for (uint64_t id : ids) {
      const Sequence* seq = scheduler.Find(id);
      if (seq == nullptr) continue;
      std::set<int32_t> distinct(seq->blocks.begin(), seq->blocks.end());
      ASSERT_EQ(distinct.size(), seq->blocks.size()) << "a block twice in one table";
      ASSERT_EQ(static_cast<int64_t>(seq->blocks.size()),
                (seq->num_computed + block_size - 1) / block_size);
      for (int32_t block : seq->blocks) ++users[block];
    }
    int64_t free_blocks = 0;
    for (int32_t block = 0; block < num_blocks; ++block) {
      const int32_t expected = users.contains(block) ? users[block] : 0;
      ASSERT_EQ(scheduler.block_manager().ref_count(block), expected) << "block " << block;
      if (expected == 0) ++free_blocks;
    }
    ASSERT_EQ(scheduler.block_manager().num_free(), free_blocks);
  });
  EXPECT_EQ(scheduler.num_running(), 0);
  EXPECT_EQ(scheduler.num_waiting(), 0);
  EXPECT_EQ(scheduler.block_manager().num_free(), num_blocks);
  EXPECT_GT(scheduler.num_cached_tokens_admitted(), 0) << "seed " << seed;
  if (observed != nullptr) *observed = worker;
}

TEST(SchedulerPrefixTest, RandomWorkloadsKeepEveryBlockInvariant) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    FuzzOnce(seed, /*block_size=*/1 + static_cast<int32_t>(seed % 4), /*num_blocks=*/24);
    if (HasFatalFailure()) return;
  }
}

// The same workloads with a host tier smaller than what the pool evicts: every reload
// must bring back exactly the tokens' K/V the sequence would have computed (the fake
// worker checks each cached prefix against the pool after the plan's copies).
TEST(SchedulerHostTierTest, RandomWorkloadsReloadOnlyTheRightContent) {
  int64_t reloads = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    FakeWorker worker(1);
    FuzzOnce(seed, /*block_size=*/1 + static_cast<int32_t>(seed % 4), /*num_blocks=*/24,
             /*num_host_blocks=*/1 + seed % 16, &worker);
    if (HasFatalFailure()) return;
    reloads += worker.num_reloads();
  }
  EXPECT_GT(reloads, 0) << "the workloads never hit the host tier";
}

TEST(SchedulerHostTierTest, AnEvictedPrefixIsOffloadedAndReloadedInsteadOfRecomputed) {
  SchedulerConfig config = Config(4, 6, 64);
  config.num_host_blocks = 8;
  Scheduler scheduler(config);
  FakeWorker worker(4);
  const auto run_alone = [&](uint64_t id, std::vector<int32_t> prompt) {
    EXPECT_TRUE(scheduler.Add(SequenceWithPrompt(id, std::move(prompt), 1)).ok());
    SchedulerOutput plan = scheduler.Schedule();
    worker.Run(plan);
    ApplySamples(scheduler, plan);
    scheduler.Finish(id);
    return plan;
  };
  // A's 13 tokens: three full blocks cached, then B's fill the pool and evict them.
  run_alone(1, Tokens(100, 13));
  const SchedulerOutput evicting = run_alone(2, Tokens(500, 21));
  EXPECT_EQ(evicting.kv_copies.size(), 3u);
  for (const KvCopy& copy : evicting.kv_copies) EXPECT_TRUE(copy.to_host);
  EXPECT_EQ(scheduler.host_tier()->num_used(), 3);

  // A again: its three blocks come back from the host tier, only its last token computes.
  const SchedulerOutput again = run_alone(3, Tokens(100, 13));
  const ScheduledWork* work = WorkFor(again, 3);
  ASSERT_NE(work, nullptr);
  EXPECT_EQ(work->num_cached_tokens, 12);
  EXPECT_EQ(work->num_tokens, 1);
  int reloads = 0;
  for (const KvCopy& copy : again.kv_copies) reloads += copy.to_host ? 0 : 1;
  EXPECT_EQ(reloads, 3);
  EXPECT_EQ(worker.num_reloads(), 3);
  EXPECT_EQ(scheduler.num_host_tokens_admitted(), 12);
  // The reloaded blocks are cached again: a fourth run finds them in the pool and reloads
  // nothing (its one new block evicts one of B's, which is offloaded).
  const SchedulerOutput fourth = run_alone(4, Tokens(100, 13));
  EXPECT_EQ(WorkFor(fourth, 4)->num_cached_tokens, 12);
  for (const KvCopy& copy : fourth.kv_copies) EXPECT_TRUE(copy.to_host);
  EXPECT_EQ(worker.num_reloads(), 3);
}

TEST(SchedulerHostTierTest, ADifferentSaltOrContinuationIsNotAHostHit) {
  SchedulerConfig config = Config(4, 6, 64);
  config.num_host_blocks = 8;
  Scheduler scheduler(config);
  FakeWorker worker(4);
  const auto run_alone = [&](uint64_t id, std::vector<int32_t> prompt, std::string salt) {
    std::unique_ptr<Sequence> seq = SequenceWithPrompt(id, std::move(prompt), 1);
    seq->cache_salt = salt;
    EXPECT_TRUE(scheduler.Add(std::move(seq)).ok());
    SchedulerOutput plan = scheduler.Schedule();
    worker.Run(plan);
    ApplySamples(scheduler, plan);
    scheduler.Finish(id);
    return plan;
  };
  run_alone(1, Tokens(100, 13), "tenant-a");
  run_alone(2, Tokens(500, 21), "");  // evicts A's blocks into the host tier
  ASSERT_EQ(scheduler.host_tier()->num_used(), 3);
  // Another tenant's salt (the same hashes here: the test roots no chain in its salt):
  // the host tier verifies a chain's first block against the salt, nothing is reloaded.
  const SchedulerOutput other = run_alone(3, Tokens(100, 13), "tenant-b");
  EXPECT_EQ(WorkFor(other, 3)->num_cached_tokens, 0);
  for (const KvCopy& copy : other.kv_copies) EXPECT_TRUE(copy.to_host);
}

TEST(SchedulerHostTierTest, TheKvIndexSeesBlocksHeldInThePoolOrTheHostTier) {
  SchedulerConfig config = Config(4, 6, 64);
  config.num_host_blocks = 8;
  config.record_kv_events = true;
  Scheduler scheduler(config);
  FakeWorker worker(4);
  // hash -> held, as a KvIndex applying the events in order would see it.
  absl::flat_hash_map<BlockHash, bool> index;
  const auto apply_events = [&] {
    for (const KvCacheEvent& event : scheduler.TakeKvEvents()) {
      index[event.hash] = event.kind == KvCacheEvent::Kind::kStored;
    }
  };
  const auto held = [&] {
    int count = 0;
    for (const auto& [hash, is_held] : index) count += is_held ? 1 : 0;
    return count;
  };
  for (uint64_t id : {1, 2}) {
    ASSERT_TRUE(
        scheduler.Add(SequenceWithPrompt(id, id == 1 ? Tokens(100, 13) : Tokens(500, 21), 1)).ok());
    SchedulerOutput plan = scheduler.Schedule();
    worker.Run(plan);
    ApplySamples(scheduler, plan);
    scheduler.Finish(id);
    apply_events();
  }
  // A's three blocks left the pool for the host tier: still held. B's five are in the pool.
  EXPECT_EQ(scheduler.host_tier()->num_used(), 3);
  EXPECT_EQ(held(), 8);
  scheduler.ForgetPrefixCache();
  apply_events();
  EXPECT_EQ(held(), 0);
}

TEST(SchedulerHostTierTest, AFailedStepForgetsTheHostTierToo) {
  SchedulerConfig config = Config(4, 6, 64);
  config.num_host_blocks = 8;
  Scheduler scheduler(config);
  FakeWorker worker(4);
  for (uint64_t id : {1, 2}) {
    ASSERT_TRUE(
        scheduler.Add(SequenceWithPrompt(id, id == 1 ? Tokens(100, 13) : Tokens(500, 21), 1)).ok());
    SchedulerOutput plan = scheduler.Schedule();
    worker.Run(plan);
    ApplySamples(scheduler, plan);
    scheduler.Finish(id);
  }
  ASSERT_EQ(scheduler.host_tier()->num_used(), 3);
  scheduler.ForgetPrefixCache();
  EXPECT_EQ(scheduler.host_tier()->num_used(), 0);
  ASSERT_TRUE(scheduler.Add(SequenceWithPrompt(3, Tokens(100, 13), 1)).ok());
  const SchedulerOutput plan = scheduler.Schedule();
  EXPECT_EQ(WorkFor(plan, 3)->num_cached_tokens, 0);
  EXPECT_TRUE(plan.kv_copies.empty());
}

}  // namespace
}  // namespace loom::engine

namespace loom::engine {
namespace {

// Speculative decoding: fixed k (the adaptive policy has its own tests).
SchedulerConfig SpeculativeConfig(int64_t num_blocks) {
  SchedulerConfig config = NoCacheConfig(4, num_blocks, 64);
  config.speculation.adaptive = false;
  return config;
}

std::unique_ptr<Sequence> SpeculatingSequence(uint64_t id, int32_t prompt_len, int32_t max_tokens,
                                              int32_t drafts) {
  std::unique_ptr<Sequence> seq = MakeSequence(id, prompt_len, max_tokens);
  seq->max_speculative_tokens = drafts;
  return seq;
}

TEST(SchedulerSpeculationTest, DecodeReservesDraftSlotsAndWaitsForItsResult) {
  Scheduler scheduler(SpeculativeConfig(32));
  ASSERT_TRUE(scheduler.Add(SpeculatingSequence(1, 6, 20, 3)).ok());
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 5, 20)).ok());
  SchedulerOutput prefill = scheduler.Schedule();
  ASSERT_EQ(prefill.scheduled.size(), 2u);
  EXPECT_EQ(WorkFor(prefill, 1)->num_speculative_tokens, 0);  // prefill never speculates
  ApplySamples(scheduler, prefill);

  SchedulerOutput decode = scheduler.Schedule();
  const ScheduledWork* work = WorkFor(decode, 1);
  ASSERT_NE(work, nullptr);
  EXPECT_EQ(work->num_tokens, 1);
  EXPECT_EQ(work->num_speculative_tokens, 3);
  EXPECT_EQ(decode.num_speculative_tokens, 3);
  Sequence* seq = scheduler.Find(1);
  // 7 tokens computed, 3 draft slots: 10 slots, 3 blocks of 4.
  EXPECT_EQ(seq->num_computed, 7);
  EXPECT_EQ(seq->blocks.size(), 3u);
  EXPECT_EQ(WorkFor(decode, 2)->num_speculative_tokens, 0);

  // While its result is out, the next plan leaves it alone (the other one decodes on).
  SchedulerOutput next = scheduler.Schedule();
  EXPECT_EQ(WorkFor(next, 1), nullptr);
  EXPECT_NE(WorkFor(next, 2), nullptr);
}

TEST(SchedulerSpeculationTest, AcceptedDraftsCountAsComputedAndRejectedSlotsAreFreed) {
  Scheduler scheduler(SpeculativeConfig(32));
  ASSERT_TRUE(scheduler.Add(SpeculatingSequence(1, 8, 20, 4)).ok());
  ApplySamples(scheduler, scheduler.Schedule());  // 8 computed in 2 blocks, 1 output
  const int64_t free_before = scheduler.block_manager().num_free();
  SchedulerOutput decode = scheduler.Schedule();
  ASSERT_EQ(WorkFor(decode, 1)->num_speculative_tokens, 4);
  Sequence* seq = scheduler.Find(1);
  EXPECT_EQ(seq->blocks.size(), 4u);  // 9 computed + 4 draft slots
  // One draft accepted, then the model's own token: two outputs.
  const std::vector<int32_t> tokens = {41, 42};
  ASSERT_EQ(scheduler.ApplyOutputs(1, tokens, true, 4, 1), seq);
  EXPECT_THAT(seq->output_ids, ElementsAre(7, 41, 42));
  EXPECT_EQ(seq->num_computed, 10);  // the prompt, the first output, the accepted draft
  EXPECT_EQ(seq->blocks.size(), 3u);  // the block only rejected drafts used is free again
  EXPECT_EQ(scheduler.block_manager().num_free(), free_before - 1);
  EXPECT_EQ(seq->speculation.num_draft_tokens, 4);
  EXPECT_EQ(seq->speculation.num_accepted_tokens, 1);
  // More outputs than drafts + 1 would be a worker bug: dropped.
  SchedulerOutput again = scheduler.Schedule();
  ASSERT_NE(WorkFor(again, 1), nullptr);
  EXPECT_EQ(seq->num_computed, 11);
  EXPECT_EQ(scheduler.ApplyOutputs(1, std::vector<int32_t>(6, 1), true, 4, 5), nullptr);
}

TEST(SchedulerSpeculationTest, NeverDraftsPastMaxTokens) {
  Scheduler scheduler(SpeculativeConfig(32));
  ASSERT_TRUE(scheduler.Add(SpeculatingSequence(1, 4, 3, 8)).ok());
  ApplySamples(scheduler, scheduler.Schedule());
  SchedulerOutput decode = scheduler.Schedule();
  // One output known, at most two more: one decode and one draft.
  EXPECT_EQ(WorkFor(decode, 1)->num_speculative_tokens, 1);
}

TEST(SchedulerSpeculationTest, DraftsYieldToOtherSequencesWhenBlocksAreShort) {
  // 4 blocks of 4: two sequences of 6 prompt tokens hold 2 blocks each after prefill.
  Scheduler scheduler(SpeculativeConfig(4));
  ASSERT_TRUE(scheduler.Add(SpeculatingSequence(1, 6, 10, 4)).ok());
  ASSERT_TRUE(scheduler.Add(SpeculatingSequence(2, 6, 10, 4)).ok());
  ApplySamples(scheduler, scheduler.Schedule());
  SchedulerOutput decode = scheduler.Schedule();
  // No free block: the drafts shrink to the slots left in the last block, nobody is preempted.
  EXPECT_TRUE(decode.preempted.empty());
  ASSERT_EQ(decode.scheduled.size(), 2u);
  EXPECT_EQ(WorkFor(decode, 1)->num_speculative_tokens, 1);
  EXPECT_EQ(WorkFor(decode, 2)->num_speculative_tokens, 1);
}

TEST(SchedulerSpeculationTest, PreemptedWhileSpeculatingKeepsItsTokensForTheRecompute) {
  Scheduler scheduler(SpeculativeConfig(6));
  ASSERT_TRUE(scheduler.Add(MakeSequence(2, 7, 16)).ok());
  std::unique_ptr<Sequence> low = SpeculatingSequence(1, 6, 18, 3);
  low->priority = 1;  // the first victim
  ASSERT_TRUE(scheduler.Add(std::move(low)).ok());
  ApplySamples(scheduler, scheduler.Schedule());
  SchedulerOutput decode = scheduler.Schedule();
  ASSERT_EQ(WorkFor(decode, 1)->num_speculative_tokens, 3);
  // Sequence 2 keeps decoding (its results not applied) until it needs sequence 1's blocks.
  bool preempted = false;
  for (int step = 0; step < 12 && !preempted; ++step) {
    SchedulerOutput out = scheduler.Schedule();
    preempted = absl::c_linear_search(out.preempted, uint64_t{1});
  }
  ASSERT_TRUE(preempted);
  Sequence* seq = scheduler.Find(1);
  EXPECT_EQ(seq->status, SequenceStatus::kWaiting);
  ASSERT_EQ(scheduler.ApplyOutputs(1, std::vector<int32_t>{5, 6}, true, 3, 1), seq);
  EXPECT_THAT(seq->output_ids, ElementsAre(7, 5, 6));
  EXPECT_EQ(seq->num_computed, 0);
  EXPECT_TRUE(seq->blocks.empty());
  EXPECT_EQ(seq->speculative_in_flight, 0);
}

TEST(SchedulerSpeculationTest, FinishedWhileSpeculatingDropsTheResultAndFreesEverything) {
  Scheduler scheduler(SpeculativeConfig(32));
  ASSERT_TRUE(scheduler.Add(SpeculatingSequence(1, 6, 20, 3)).ok());
  ApplySamples(scheduler, scheduler.Schedule());
  scheduler.Schedule();  // speculative decode in flight
  scheduler.Finish(1);
  EXPECT_EQ(scheduler.ApplyOutputs(1, std::vector<int32_t>{1, 2}, true, 3, 1), nullptr);
  EXPECT_EQ(scheduler.block_manager().num_free(), 32);
}

}  // namespace
}  // namespace loom::engine

namespace loom::engine {
namespace {

TEST(SchedulerSpeculationTest, APlainResultStillAppliesWhileTheNextPlanSpeculates) {
  SchedulerConfig config = NoCacheConfig(4, 32, 64);
  config.speculation.adaptive = false;
  Scheduler scheduler(config);
  std::unique_ptr<Sequence> seq = MakeSequence(1, 6, 20);
  seq->max_speculative_tokens = 3;
  ASSERT_TRUE(scheduler.Add(std::move(seq)).ok());
  // The prefill's sample is still out when the next plan speculates the decode after it.
  SchedulerOutput prefill = scheduler.Schedule();
  ASSERT_TRUE(WorkFor(prefill, 1)->sample);
  SchedulerOutput decode = scheduler.Schedule();
  ASSERT_EQ(WorkFor(decode, 1)->num_speculative_tokens, 3);
  Sequence* applied = scheduler.ApplyOutputs(1, std::vector<int32_t>{9}, false, 0, 0);
  ASSERT_NE(applied, nullptr);
  EXPECT_THAT(applied->output_ids, ElementsAre(9));
  ASSERT_EQ(scheduler.ApplyOutputs(1, std::vector<int32_t>{10, 11, 12}, true, 3, 2), applied);
  EXPECT_THAT(applied->output_ids, ElementsAre(9, 10, 11, 12));
  EXPECT_EQ(applied->num_computed, 9);
  EXPECT_EQ(applied->samples_in_flight, 0);
  EXPECT_NE(WorkFor(scheduler.Schedule(), 1), nullptr);
}

}  // namespace
}  // namespace loom::engine
