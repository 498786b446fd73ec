// Scheduler's side of a prefix fetched between replicas (engine/scheduler_transfer.cc): the
// source holds a verified chain in host slots (copying pool-only blocks out), the destination
// reserves slots, commits what arrived as host-tier content and reloads it on admission; or,
// pool to pool, the source holds the chain's pool blocks and the destination's arrived blocks
// become its cached prefix.
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "engine/block_hash.h"
#include "engine/scheduler.h"
#include "engine/step_plan.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

constexpr int32_t kBlockSize = 4;

SchedulerConfig TierConfig(int64_t num_blocks, int64_t host_blocks) {
  SchedulerConfig config;
  config.block_size = kBlockSize;
  config.num_blocks = num_blocks;
  config.max_num_batched_tokens = 64;
  config.num_host_blocks = host_blocks;
  return config;
}

std::vector<int32_t> Tokens(int32_t first, int32_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

std::vector<BlockHash> Hashes(const std::vector<int32_t>& tokens, int64_t blocks) {
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(BlockHash{}, tokens, kBlockSize, blocks, &hashes);
  return hashes;
}

// Runs `prompt` to its first token and releases it: its full blocks stay cached.
void RunOnce(Scheduler& scheduler, uint64_t id, const std::vector<int32_t>& prompt) {
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = id;
  seq->prompt_ids = prompt;
  seq->max_tokens = 1;
  ASSERT_TRUE(scheduler.Add(std::move(seq)).ok());
  const SchedulerOutput out = scheduler.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  ASSERT_NE(scheduler.ApplyOutput(id, 7), nullptr);
  scheduler.Finish(id);
}

// Adds `prompt` as sequence `id` (one token to generate) and schedules it.
SchedulerOutput Admit(Scheduler& scheduler, uint64_t id, const std::vector<int32_t>& prompt) {
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = id;
  seq->prompt_ids = prompt;
  seq->max_tokens = 1;
  EXPECT_TRUE(scheduler.Add(std::move(seq)).ok());
  return scheduler.Schedule();
}

// Steps of 1 to 4,096 tokens, each costing `fixed` plus `per_token` a token.
void RecordLinearSteps(StepCostModel& cost, double fixed, double per_token) {
  for (int64_t tokens = 1; tokens <= 4096; ++tokens) {
    cost.Record(tokens, fixed + per_token * static_cast<double>(tokens));
  }
}

TEST(SchedulerTransferTest, ExportHoldsTheChainAndCopiesPoolOnlyBlocksOut) {
  Scheduler source(TierConfig(16, 8));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  RunOnce(source, 1, prompt);
  const Scheduler::HeldSlots held = source.ExportPrefix(Hashes(prompt, 3), prompt, "");
  ASSERT_EQ(held.slots.size(), 3u);
  // Three device-to-host copies go out with the next plan, even with nothing to schedule.
  EXPECT_TRUE(source.has_work());
  const SchedulerOutput out = source.Schedule();
  ASSERT_EQ(out.kv_copies.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(out.kv_copies[i].to_host);
    EXPECT_EQ(out.kv_copies[i].host_slot, held.slots[i]);
  }
  // Exporting again finds the same content in the tier: no second copy.
  const Scheduler::HeldSlots again = source.ExportPrefix(Hashes(prompt, 3), prompt, "");
  EXPECT_EQ(again.slots, held.slots);
  EXPECT_TRUE(source.Schedule().kv_copies.empty());
  source.ReleaseSlots(held, /*import=*/false);
  source.ReleaseSlots(again, /*import=*/false);
  // Another salt or other tokens: nothing to export.
  EXPECT_TRUE(source.ExportPrefix(Hashes(prompt, 3), prompt, "tenant").slots.empty());
  EXPECT_TRUE(source.ExportPrefix(Hashes(prompt, 3), Tokens(900, 13), "").slots.empty());
}

TEST(SchedulerTransferTest, HeldSlotsAreNotReusedByOffloads) {
  Scheduler source(TierConfig(4, 2));
  const std::vector<int32_t> prompt = Tokens(100, 9);
  RunOnce(source, 1, prompt);
  const Scheduler::HeldSlots held = source.ExportPrefix(Hashes(prompt, 2), prompt, "");
  ASSERT_EQ(held.slots.size(), 2u);
  source.Schedule();
  // A new prompt evicts the pool's cached blocks; the tier's two slots are held: dropped.
  RunOnce(source, 2, Tokens(500, 13));
  EXPECT_EQ(source.host_tier()->num_dropped(), 0u);  // the tier holds the same content already
  const uint64_t dropped_before = source.host_tier()->num_dropped();
  RunOnce(source, 3, Tokens(900, 13));
  EXPECT_GT(source.host_tier()->num_dropped(), dropped_before);
  for (int32_t slot : held.slots) EXPECT_FALSE(source.host_tier()->reserved(slot));
  // Still the exported content.
  EXPECT_EQ(source.ExportPrefix(Hashes(prompt, 2), prompt, "").slots, held.slots);
}

TEST(SchedulerTransferTest, ACommittedImportIsReloadedOnAdmission) {
  Scheduler destination(TierConfig(16, 8));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  // The first block is already in the destination's pool (a shorter prompt ran there).
  RunOnce(destination, 1, Tokens(100, 5));
  const Scheduler::HeldSlots import = destination.ReserveImport(3);
  ASSERT_EQ(import.slots.size(), 3u);
  for (int32_t slot : import.slots) EXPECT_TRUE(destination.host_tier()->reserved(slot));
  EXPECT_EQ(destination.CommitImport(import, Hashes(prompt, 3), prompt, ""), 2);
  for (int32_t slot : import.slots) EXPECT_FALSE(destination.host_tier()->reserved(slot));

  const SchedulerOutput out = Admit(destination, 2, prompt);
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_cached_tokens, 12);  // 1 block from the pool, 2 reloaded
  int reloads = 0;
  for (const KvCopy& copy : out.kv_copies) reloads += copy.to_host ? 0 : 1;
  EXPECT_EQ(reloads, 2);
}

// A hand-off of `prompt` with its first output: 4 more tokens at most.
std::unique_ptr<Sequence> HandOff(uint64_t id, const std::vector<int32_t>& prompt) {
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = id;
  seq->prompt_ids = prompt;
  seq->output_ids = {7};
  seq->max_tokens = 5;
  return seq;
}

TEST(SchedulerTransferTest, AHandOffsPushedTailStartsItAtItsFirstOutput) {
  // 13 prompt tokens: 3 full blocks committed to the tier, the last (partial) block pushed
  // into a slot of its own.
  Scheduler destination(TierConfig(16, 8));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  Scheduler::HeldSlots pushed = destination.ReserveImport(4);
  ASSERT_EQ(pushed.slots.size(), 4u);
  const int32_t tail = pushed.slots[3];
  pushed.slots.pop_back();
  ASSERT_EQ(destination.CommitImport(pushed, Hashes(prompt, 3), prompt, ""), 3);
  ASSERT_TRUE(destination.Add(HandOff(1, prompt)).ok());
  destination.SetHostTail(1, tail, pushed.generation);
  EXPECT_TRUE(destination.host_tier()->reserved(tail));

  const SchedulerOutput out = destination.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  const ScheduledWork& work = out.scheduled[0];
  // No prompt token is computed: the step decodes the first output.
  EXPECT_EQ(work.num_cached_tokens, 13);
  EXPECT_EQ(work.num_tokens, 1);
  EXPECT_TRUE(work.sample);
  EXPECT_EQ(out.num_prefill_tokens, 0);
  EXPECT_EQ(out.num_decode_tokens, 1);
  ASSERT_EQ(work.new_block_ids.size(), 4u);
  ASSERT_EQ(out.kv_copies.size(), 4u);
  for (const KvCopy& copy : out.kv_copies) EXPECT_FALSE(copy.to_host);
  EXPECT_EQ(out.kv_copies[3].host_slot, tail);
  EXPECT_EQ(out.kv_copies[3].device_block, work.new_block_ids[3]);
  EXPECT_EQ(destination.num_host_tokens_admitted(), 13);
  // The slot is free again; the tier names no content by the partial block.
  EXPECT_FALSE(destination.host_tier()->reserved(tail));
  EXPECT_EQ(destination.host_tier()->num_used(), 3);
}

TEST(SchedulerTransferTest, AHostTailWhosePromptIsNotCachedIsFreedAndThePromptRecomputed) {
  Scheduler destination(TierConfig(16, 8));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  // The full blocks' pushes failed: only the tail arrived.
  const Scheduler::HeldSlots pushed = destination.ReserveImport(4);
  destination.ReleaseSlots(
      Scheduler::HeldSlots{{pushed.slots[0], pushed.slots[1], pushed.slots[2]}, pushed.generation},
      /*import=*/true);
  ASSERT_TRUE(destination.Add(HandOff(1, prompt)).ok());
  destination.SetHostTail(1, pushed.slots[3], pushed.generation);
  const SchedulerOutput out = destination.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_cached_tokens, 0);
  EXPECT_EQ(out.scheduled[0].num_tokens, 14);  // the prompt and the first output
  EXPECT_TRUE(out.kv_copies.empty());
  EXPECT_FALSE(destination.host_tier()->reserved(pushed.slots[3]));
  EXPECT_EQ(destination.ReserveImport(8).slots.size(), 8u);
}

TEST(SchedulerTransferTest, AHostTailIsFreedWhenItsSequenceEndsOrIsNotWaiting) {
  Scheduler destination(TierConfig(16, 8));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  const Scheduler::HeldSlots pushed = destination.ReserveImport(3);
  ASSERT_TRUE(destination.Add(HandOff(1, prompt)).ok());
  destination.SetHostTail(1, pushed.slots[0], pushed.generation);
  destination.Finish(1);  // cancelled while it waited
  EXPECT_FALSE(destination.host_tier()->reserved(pushed.slots[0]));
  destination.SetHostTail(2, pushed.slots[1], pushed.generation);  // unknown: freed at once
  EXPECT_FALSE(destination.host_tier()->reserved(pushed.slots[1]));
  // The worker died: the waiting hand-off goes elsewhere, without the slot.
  ASSERT_TRUE(destination.Add(HandOff(3, prompt)).ok());
  destination.SetHostTail(3, pushed.slots[2], pushed.generation);
  const std::vector<std::unique_ptr<Sequence>> taken = destination.TakeAll();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0]->host_tail_slot, -1);
  EXPECT_FALSE(destination.host_tier()->reserved(pushed.slots[2]));
  EXPECT_EQ(destination.ReserveImport(8).slots.size(), 8u);
}

TEST(SchedulerTransferTest, AKeptImportIsNotEvictedByTheImportsAfterIt) {
  // A tier of 4 slots: the first import (2 blocks) is kept for its request; the next one
  // (3 blocks) gets only the 2 slots left, and after the keep is released all 4 are free
  // to take again.
  Scheduler destination(TierConfig(16, 4));
  const std::vector<int32_t> first = Tokens(100, 9), second = Tokens(200, 13);
  Scheduler::HeldSlots kept;
  ASSERT_EQ(
      destination.CommitImport(destination.ReserveImport(2), Hashes(first, 2), first, "", &kept),
      2);
  ASSERT_EQ(kept.slots.size(), 2u);
  EXPECT_EQ(destination.ReserveImport(3).slots.size(), 2u);
  destination.ReleaseSlots(kept, /*import=*/false);
  // The kept content stays cached (reloadable) but may be replaced now.
  EXPECT_EQ(destination.host_tier()->num_used(), 2);
}

TEST(SchedulerTransferTest, AnImportOfAForgottenTierOrAFailedFetchHoldsNothing) {
  Scheduler destination(TierConfig(16, 4));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  const Scheduler::HeldSlots failed = destination.ReserveImport(3);
  destination.ReleaseSlots(failed, /*import=*/true);
  for (int32_t slot : failed.slots) EXPECT_FALSE(destination.host_tier()->reserved(slot));
  EXPECT_EQ(destination.ReserveImport(4).slots.size(), 4u);  // every slot free again

  Scheduler other(TierConfig(16, 4));
  const Scheduler::HeldSlots import = other.ReserveImport(3);
  other.ForgetPrefixCache();  // a failed step meanwhile
  EXPECT_TRUE(other.host_tier()->reserved(import.slots[0]));  // a fetch may still write it
  EXPECT_EQ(other.CommitImport(import, Hashes(prompt, 3), prompt, ""), 0);
  EXPECT_EQ(other.host_tier()->num_used(), 0);
  EXPECT_EQ(other.host_tier()->num_held(), 0);  // nothing committed, every slot freed
  other.ReleaseSlots(import, /*import=*/true);  // and a release after it frees nothing more
  EXPECT_EQ(other.ReserveImport(4).slots.size(), 4u);
}

TEST(SchedulerTransferTest, AClosedImportIsFreedAndClosedByAPlanBeforeItsSlotsAreReservedAgain) {
  // A push hold whose writers may still send: an otherwise idle replica has work (the plan
  // that closes it), which carries the hold; a reservation of its slots waits for that plan.
  Scheduler destination(TierConfig(16, 4));
  const Scheduler::HeldSlots pushed = destination.ReserveImport(4);
  ASSERT_EQ(pushed.slots.size(), 4u);
  EXPECT_FALSE(destination.has_work());
  destination.ReleaseClosedImport(pushed, 77);
  EXPECT_EQ(destination.host_tier()->num_held(), 0);
  EXPECT_TRUE(destination.has_work());
  const uint64_t closing_plan = destination.host_tier()->copy_plans_taken() + 1;
  const SchedulerOutput out = destination.Schedule();
  EXPECT_FALSE(out.empty());
  EXPECT_EQ(out.kv_push_holds_closed, std::vector<uint64_t>{77});
  loom::v1::StepPlan plan;
  BuildStepPlan(out, 1, plan, /*with_input_tokens=*/false);
  ASSERT_EQ(plan.kv_push_holds_closed_size(), 1);
  EXPECT_EQ(plan.kv_push_holds_closed(0), 77u);
  EXPECT_EQ(destination.host_tier()->copy_plans_taken(), closing_plan);
  EXPECT_FALSE(destination.has_work());
  const Scheduler::HeldSlots again = destination.ReserveImport(4);
  EXPECT_EQ(again.slots.size(), 4u);
  EXPECT_EQ(again.last_copy_plan, closing_plan);
}

TEST(SchedulerTransferTest, MovingKvPaysWhenItIsFasterThanTheMeasuredRecompute) {
  StepCostModel cost;
  // Nothing measured yet on either side: move.
  EXPECT_TRUE(TransferPays(0.0, 8, kBlockSize, cost));
  EXPECT_TRUE(TransferPays(1.0, 8, kBlockSize, cost));
  cost.Record(32, 0.010);                                  // a 32-token step took 10 ms
  EXPECT_TRUE(TransferPays(0.0001, 8, kBlockSize, cost));  // 0.8 ms to move 8 blocks
  EXPECT_FALSE(TransferPays(0.01, 8, kBlockSize, cost));   // 80 ms: recompute instead
  EXPECT_TRUE(TransferPays(0.01, 0, kBlockSize, cost));
}

TEST(SchedulerTransferTest, ALocalPrefillIsTooLongWhenItsStallOutweighsTheStepAndTheHandOff) {
  StepCostModel cost;
  EXPECT_EQ(LocalPrefillLimit(cost, 8, std::nullopt), 512);  // nothing measured: a fixed guess
  // Steps cost 10 ms plus 0.1 ms per token: a decode step of 8 sequences 10.8 ms; a prefill
  // of n tokens beside it stalls it 0.1 n ms, more than the step from n = 108 on: with a
  // quick hand-off (1 ms) the limit is the next power of two, 128.
  RecordLinearSteps(cost, 0.010, 0.0001);
  EXPECT_EQ(LocalPrefillLimit(cost, 8, 0.001), 128);
  // A batch of 256 decodes takes 35.6 ms: the stall exceeds it from 356 tokens on.
  EXPECT_EQ(LocalPrefillLimit(cost, 256, 0.001), 512);
  // Hand-offs measured at 100 ms: only prompts stalling the decodes longer are sent away.
  EXPECT_EQ(LocalPrefillLimit(cost, 8, 0.1), 1024);
  // None measured yet: nothing under the fixed guess is sent away.
  EXPECT_EQ(LocalPrefillLimit(cost, 8, std::nullopt), 512);
  // Hand-offs whose KV was pushed cost the decode replica no wait: the step alone decides.
  EXPECT_EQ(LocalPrefillLimit(cost, 8, 0.0), 128);
}

TEST(SchedulerTransferTest, ADecodeReplicasChunkStallsItsDecodesByAtMostOneStep) {
  StepCostModel cost;
  EXPECT_EQ(PrefillChunkBesideDecodes(cost, 8, 128), 16);  // nothing measured: a small chunk
  EXPECT_EQ(PrefillChunkBesideDecodes(cost, 0, 128), 16);
  EXPECT_EQ(PrefillChunkBesideDecodes(cost, 8, 4), 4);
  // Steps cost 10 ms plus 1 ms per token (a slow CPU): beside 8 decodes (18 ms) a chunk of
  // 18 tokens at most, where the local prefill limit would stall them 16 ms or more.
  RecordLinearSteps(cost, 0.010, 0.001);
  // (The fitted slope is 1 ms up to rounding: 17.99... tokens are 17.)
  EXPECT_NEAR(PrefillChunkBesideDecodes(cost, 8, 128), 18, 1);
  EXPECT_NEAR(PrefillChunkBesideDecodes(cost, 64, 128), 74, 1);
  EXPECT_EQ(PrefillChunkBesideDecodes(cost, 512, 128), 128);  // never past the limit
  EXPECT_EQ(PrefillChunkBesideDecodes(cost, 0, 128), 128);    // no decodes to stall
  EXPECT_EQ(PrefillChunkBesideDecodes(cost, 8, 0), 1);
  // A fast device: a token costs next to nothing beside the step, the limit decides.
  StepCostModel fast;
  RecordLinearSteps(fast, 0.010, 1e-7);
  EXPECT_EQ(PrefillChunkBesideDecodes(fast, 8, 512), 512);
  // Measured and free: a chunk beside decodes costs them nothing measurable.
  fast.RecordPrefillBesideDecodes(8, 64, fast.Estimate(8));
  EXPECT_TRUE(fast.PrefillSecondsPerToken().has_value());
  EXPECT_EQ(PrefillChunkBesideDecodes(fast, 8, 512), 512);
  // A step a chunk's token outweighs: still one token a step, the prompt moves on.
  StepCostModel slow_tokens;
  RecordLinearSteps(slow_tokens, 0.001, 0.01);
  EXPECT_EQ(PrefillChunkBesideDecodes(slow_tokens, 1, 128), 1);
  // Chunks of a long prompt measured at 2 ms a token beside 8 decodes (its tokens attend
  // to 2k others), where the slope says 1: the chunk halves.
  for (int i = 0; i < 100; ++i) cost.RecordPrefillBesideDecodes(8, 9, 0.018 + 9 * 0.002);
  EXPECT_NEAR(cost.PrefillSecondsPerToken().value_or(-1), 0.002, 1e-6);
  EXPECT_NEAR(PrefillChunkBesideDecodes(cost, 8, 128), 9, 1);
}

TEST(SchedulerTransferTest, TheLocalPrefillLimitHoldsStillWhenSomeStepSizesMeasureNoisily) {
  StepCostModel cost;
  RecordLinearSteps(cost, 0.010, 0.0001);
  const int64_t clean = LocalPrefillLimit(cost, 8, 0.001);
  // A neighbour's burst makes the 24-token steps 5x slower, and the 1,024-token ones cost no
  // more than the 512-token ones: bucket by bucket the stall of 16 tokens would exceed the
  // step, and no prompt would stall it enough between 512 and 1,024 tokens.
  for (int i = 0; i < 50; ++i) {
    cost.Record(24, 5 * (0.010 + 0.0024));
    cost.Record(1024, 0.010 + 0.0512);
  }
  EXPECT_EQ(LocalPrefillLimit(cost, 8, 0.001), clean);
  // Steps of a few decodes only: their times differ by noise, not by their tokens (here
  // the 3-token steps happened to be faster): no line yet, the fixed guess.
  StepCostModel decodes;
  decodes.Record(1, 0.0100);
  decodes.Record(2, 0.0101);
  decodes.Record(3, 0.0099);
  EXPECT_EQ(decodes.SecondsPerToken(), 0);
  EXPECT_EQ(LocalPrefillLimit(decodes, 2, 0.001), 512);
  decodes.Record(40, 0.0140);  // a short prompt's step: 0.1 ms per token
  EXPECT_NEAR(decodes.SecondsPerToken(), 0.0001, 0.00002);
}

TEST(SchedulerTransferTest, TheFirstTokenComesAfterTheQueuedPromptsAndEveryChunksStep) {
  StepCostModel cost;
  EXPECT_EQ(FirstTokenSeconds(MeasurePrefillRate(cost, 0, 512, 0), 2048), 0);  // unmeasured
  // Steps cost 10 ms plus 0.1 ms per token (as the model fits it from its size buckets:
  // within a few percent).
  RecordLinearSteps(cost, 0.010, 0.0001);
  // An idle prefill replica, 512-token chunks: 2,048 tokens at 0.1 ms and 4 steps' fixed part
  // (each a step of one token: 10.1 ms).
  const PrefillRate idle = MeasurePrefillRate(cost, 0, 512, 0);
  EXPECT_NEAR(FirstTokenSeconds(idle, 2048), 0.2048 + 4 * 0.0101, 0.03 * 0.245);
  // Two such prompts queued ahead: they come first.
  const PrefillRate busy = MeasurePrefillRate(cost, 0, 512, 4096);
  EXPECT_NEAR(FirstTokenSeconds(busy, 2048), 0.6144 + 12 * 0.0101, 0.03 * 0.736);
  // A decode replica with 32 decodes prefilling in chunks of 128 beside them: 16 steps, each
  // paying the decode step (13.2 ms). Slower than the idle prefill replica, faster than the
  // busy one: where the prompt goes depends on the queue, not on its length alone.
  const PrefillRate beside = MeasurePrefillRate(cost, 32, 128, 0);
  const double local = FirstTokenSeconds(beside, 2048);
  EXPECT_NEAR(local, 0.2048 + 16 * 0.0132, 0.03 * 0.416);
  EXPECT_GT(local, FirstTokenSeconds(idle, 2048));
  EXPECT_LT(local, FirstTokenSeconds(busy, 2048));
  // A prefill replica that only ever ran full 512-token chunks (60 ms each): no slope, a
  // chunk's time per token. Two queued prompts of 2,048 and one more: 12 chunks.
  StepCostModel chunks;
  chunks.Record(512, 0.060);
  EXPECT_EQ(chunks.SecondsPerToken(), 0);
  EXPECT_NEAR(FirstTokenSeconds(MeasurePrefillRate(chunks, 0, 512, 4096), 2048), 12 * 0.060, 1e-9);
  // Without a chunk limit the whole backlog is one step.
  EXPECT_NEAR(FirstTokenSeconds(MeasurePrefillRate(cost, 0, 0, 100), 28), 0.0128 + 0.0101,
              0.03 * 0.0229);
}

TEST(SchedulerTransferTest, PendingPromptTokensAreThoseNotComputedYet) {
  SchedulerConfig config = TierConfig(64, 0);
  config.max_num_batched_tokens = 16;
  Scheduler scheduler(config);
  EXPECT_EQ(scheduler.num_prompt_tokens_pending(), 0);
  for (uint64_t id : {1u, 2u}) {
    auto seq = std::make_unique<Sequence>();
    seq->seq_id = id;
    seq->prompt_ids = Tokens(static_cast<int32_t>(id) * 100, 40);
    seq->max_tokens = 4;
    ASSERT_TRUE(scheduler.Add(std::move(seq)).ok());
  }
  EXPECT_EQ(scheduler.num_prompt_tokens_pending(), 80);
  scheduler.Schedule();  // 16 tokens of the first prompt
  EXPECT_EQ(scheduler.num_prompt_tokens_pending(), 64);
  scheduler.Schedule();
  scheduler.Schedule();  // the first prompt's last 8 and 8 of the second
  EXPECT_EQ(scheduler.num_prompt_tokens_pending(), 32);
  scheduler.Finish(2);
  EXPECT_EQ(scheduler.num_prompt_tokens_pending(), 0);
}

// ---- pool-to-pool transfers: the blocks themselves are held, no host tier ----

TEST(SchedulerPoolTransferTest, TheSourceHoldsTheVerifiedChainInItsPoolUntilReleased) {
  Scheduler source(TierConfig(4, 0));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  RunOnce(source, 1, prompt);  // 3 full blocks cached, free
  const std::vector<int32_t> held = source.HoldPoolPrefix(Hashes(prompt, 3), prompt, "");
  ASSERT_EQ(held.size(), 3u);
  for (int32_t block : held) EXPECT_EQ(source.block_manager().ref_count(block), 1);
  // Another prompt needing the whole pool cannot evict them meanwhile.
  EXPECT_EQ(source.block_manager().num_free(), 1);
  // Another chain (other salt, other tokens) holds nothing.
  EXPECT_TRUE(source.HoldPoolPrefix(Hashes(prompt, 3), prompt, "tenant").empty());
  source.ReleasePoolBlocks(held);
  EXPECT_EQ(source.block_manager().num_free(), 4);
  EXPECT_TRUE(source.block_manager().is_cached(held[0]));  // still cached, free
}

TEST(SchedulerPoolTransferTest, ACommittedImportIsAPrefixHitOnAdmission) {
  Scheduler destination(TierConfig(16, 0));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  // The first block is already in the destination's pool (a shorter prompt ran there).
  RunOnce(destination, 1, Tokens(100, 5));
  const std::vector<int32_t> import = destination.ReservePoolImport(3);
  ASSERT_EQ(import.size(), 3u);
  EXPECT_TRUE(destination.ReservePoolImport(14).empty());  // all or nothing
  std::vector<int32_t> kept;
  EXPECT_EQ(destination.CommitPoolImport(import, Hashes(prompt, 3), prompt, "", &kept), 2);
  // The first block was held already: its copy goes back; the other two stay held.
  EXPECT_EQ(kept, std::vector<int32_t>(import.begin() + 1, import.end()));
  EXPECT_EQ(destination.block_manager().ref_count(import[0]), 0);
  for (int32_t block : kept) EXPECT_EQ(destination.block_manager().ref_count(block), 1);

  const SchedulerOutput out = Admit(destination, 2, prompt);
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_cached_tokens, 12);  // every block from the pool
  EXPECT_TRUE(out.kv_copies.empty());                 // nothing reloaded
  destination.ReleasePoolBlocks(kept);
  for (int32_t block : kept) EXPECT_EQ(destination.block_manager().ref_count(block), 1);
}

TEST(SchedulerPoolTransferTest, ImportedBlocksBeyondTheHashedChainAreFreed) {
  Scheduler destination(TierConfig(8, 0));
  const std::vector<int32_t> prompt = Tokens(100, 13);
  const std::vector<int32_t> import = destination.ReservePoolImport(3);
  // Three blocks arrived, but the request's chain names two (the source held more than
  // the prompt's full blocks): the third holds nothing this replica can verify.
  std::vector<BlockHash> hashes = Hashes(prompt, 3);
  std::vector<int32_t> kept;
  EXPECT_EQ(
      destination.CommitPoolImport(import, absl::MakeConstSpan(hashes).first(2), prompt, "", &kept),
      2);
  EXPECT_EQ(kept.size(), 2u);
  EXPECT_EQ(destination.block_manager().ref_count(import[2]), 0);  // beyond the chain: freed
  destination.ReleasePoolBlocks(kept);
  EXPECT_EQ(destination.block_manager().num_free(), 8);
}

TEST(SchedulerPoolTransferTest, AClosedPoolImportIsFreedAndClosedByTheNextPlan) {
  Scheduler destination(TierConfig(8, 0));
  const std::vector<int32_t> import = destination.ReservePoolImport(2);
  ASSERT_EQ(import.size(), 2u);
  destination.ReleaseClosedPoolImport(import, 77);
  EXPECT_EQ(destination.block_manager().num_free(), 8);
  EXPECT_TRUE(destination.has_work());  // a plan must carry the close
  const SchedulerOutput out = destination.Schedule();
  EXPECT_EQ(out.kv_push_holds_closed, std::vector<uint64_t>{77});
  EXPECT_FALSE(destination.has_work());
}

}  // namespace
}  // namespace loom::engine
