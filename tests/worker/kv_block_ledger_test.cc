#include "worker/kv_block_ledger.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "tests/test_paths.h"
#include "worker/noop_backend.h"
#include "worker/step_executor.h"

namespace loom::worker {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kNoParent = KvBlockLedger::kNoParent;

std::vector<int32_t> Tokens(int32_t first) { return {first, first + 1, first + 2, first + 3}; }

// The report, as (block, parent) pairs in order, and its messages.
struct Reported {
  std::vector<std::pair<int32_t, int32_t>> links;
  google::protobuf::RepeatedPtrField<loom::v1::CachedKvBlock> blocks;
};

Reported Report(const KvBlockLedger& ledger, int64_t max_bytes = 1 << 20) {
  Reported reported;
  ledger.Report(max_bytes, &reported.blocks);
  for (const loom::v1::CachedKvBlock& block : reported.blocks) {
    reported.links.emplace_back(block.block(), block.parent());
  }
  return reported;
}

using Links = std::vector<std::pair<int32_t, int32_t>>;

TEST(KvBlockLedgerTest, ReportsChainsParentsFirstWithTokensAndTheFirstBlocksSalt) {
  KvBlockLedger ledger(8, kBlockSize);
  ledger.Record(5, Tokens(10), kNoParent, "tenant-a");
  ledger.Record(2, Tokens(20), 5, "ignored for a child");
  ledger.Record(7, Tokens(30), 2, "");
  EXPECT_EQ(ledger.num_recorded(), 3);
  const Reported reported = Report(ledger);
  // The most recently used block (7) leads, with its ancestors before it.
  EXPECT_EQ(reported.links, (Links{{5, kNoParent}, {2, 5}, {7, 2}}));
  EXPECT_EQ(reported.blocks[0].cache_salt(), "tenant-a");
  EXPECT_EQ(reported.blocks[1].cache_salt(), "");
  EXPECT_EQ(std::vector<int32_t>(reported.blocks[1].token_ids().begin(),
                                 reported.blocks[1].token_ids().end()),
            Tokens(20));
}

TEST(KvBlockLedgerTest, AWrittenBlockDropsOutWithEverythingComputedAfterIt) {
  KvBlockLedger ledger(8, kBlockSize);
  ledger.Record(0, Tokens(0), kNoParent, "");
  ledger.Record(1, Tokens(4), 0, "");
  ledger.Record(2, Tokens(8), 1, "");
  ledger.Record(3, Tokens(100), kNoParent, "");
  ledger.Invalidate(1);
  EXPECT_EQ(ledger.num_recorded(), 3);
  EXPECT_EQ(Report(ledger).links, (Links{{3, kNoParent}, {0, kNoParent}}));
  // Recomputing block 1 with the same tokens does not revive block 2: its K/V were
  // computed after the old contents, which nothing can name any more.
  ledger.Record(1, Tokens(4), 0, "");
  EXPECT_EQ(Report(ledger).links, (Links{{0, kNoParent}, {1, 0}, {3, kNoParent}}));
}

TEST(KvBlockLedgerTest, RecordingOtherContentOrphansTheOldChildren) {
  KvBlockLedger ledger(8, kBlockSize);
  ledger.Record(0, Tokens(0), kNoParent, "");
  ledger.Record(1, Tokens(4), 0, "");
  // Block 0 recorded again with other tokens, without an Invalidate between.
  ledger.Record(0, Tokens(50), kNoParent, "");
  EXPECT_EQ(Report(ledger).links, (Links{{0, kNoParent}}));
  // Recording the same content again only marks it used: block 2's parent stays valid.
  ledger.Record(2, Tokens(54), 0, "");
  ledger.Record(0, Tokens(50), kNoParent, "");
  EXPECT_EQ(Report(ledger).links, (Links{{0, kNoParent}, {2, 0}}));
}

TEST(KvBlockLedgerTest, AFirstBlockWithAnotherSaltIsOtherContent) {
  KvBlockLedger ledger(4, kBlockSize);
  ledger.Record(0, Tokens(0), kNoParent, "a");
  ledger.Record(1, Tokens(4), 0, "");
  ledger.Record(0, Tokens(0), kNoParent, "b");
  const Reported reported = Report(ledger);
  EXPECT_EQ(reported.links, (Links{{0, kNoParent}}));
  EXPECT_EQ(reported.blocks[0].cache_salt(), "b");
}

TEST(KvBlockLedgerTest, TheReportStopsAtItsByteBoundWithWholeChainPrefixes) {
  KvBlockLedger ledger(64, kBlockSize);
  // Two chains of 10 blocks; the second used last.
  for (int32_t b = 0; b < 10; ++b) ledger.Record(b, Tokens(b), b == 0 ? kNoParent : b - 1, "");
  for (int32_t b = 20; b < 30; ++b) ledger.Record(b, Tokens(b), b == 20 ? kNoParent : b - 1, "");
  // Each block counts 4 * 4 + 16 = 32 bytes: 12 blocks fit in 400.
  const Reported reported = Report(ledger, 400);
  ASSERT_EQ(reported.links.size(), 12u);
  for (int32_t i = 0; i < 10; ++i) {
    EXPECT_EQ(reported.links[static_cast<size_t>(i)].first, 20 + i);
  }
  EXPECT_EQ(reported.links[10], std::make_pair(0, kNoParent));
  EXPECT_EQ(reported.links[11], std::make_pair(1, 0));
  EXPECT_TRUE(Report(ledger, 31).links.empty());
}

TEST(KvBlockLedgerTest, ManySaltsAreCompactedToThoseStillRecorded) {
  KvBlockLedger ledger(2, kBlockSize);
  for (int i = 0; i < 5000; ++i) {
    ledger.Record(i % 2, Tokens(i), kNoParent, "salt-" + std::to_string(i));
  }
  const Reported reported = Report(ledger);
  ASSERT_EQ(reported.blocks.size(), 2);
  EXPECT_EQ(reported.blocks[0].cache_salt(), "salt-4999");
  EXPECT_EQ(reported.blocks[1].cache_salt(), "salt-4998");
}

// ---------------------------------------------------------------------------------------
// The step executor keeps the ledger (noop backend: the bookkeeping without weights).

constexpr int64_t kNumBlocks = 32;
constexpr int64_t kPoolBlockSize = 16;

class StepExecutorLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gguf = common::GgufFile::Open(loom::test_env::ModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto config = common::ModelConfigFromGguf(**gguf);
    ASSERT_TRUE(config.ok()) << config.status();
    backend_ = std::make_unique<NoopBackend>(*config, kNumBlocks, kPoolBlockSize,
                                             std::vector<int32_t>{0, 2});
    executor_ = std::make_unique<StepExecutor>(*backend_);
  }

  loom::v1::StepPlan Plan() {
    loom::v1::StepPlan plan;
    plan.set_step_id(++step_id_);
    return plan;
  }
  static loom::v1::NewSequence Added(uint64_t seq_id, std::vector<int32_t> prompt,
                                     const std::string& salt = "") {
    loom::v1::NewSequence added;
    added.set_seq_id(seq_id);
    added.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    added.mutable_sampling()->set_temperature(0);
    added.set_cache_salt(salt);
    return added;
  }
  static void Schedule(loom::v1::StepPlan& plan, uint64_t seq_id, int32_t num_tokens, bool sample,
                       std::vector<int32_t> blocks) {
    loom::v1::ScheduledSequence* entry = plan.add_scheduled();
    entry->set_seq_id(seq_id);
    entry->set_num_tokens(num_tokens);
    entry->set_sample(sample);
    entry->mutable_new_block_ids()->Add(blocks.begin(), blocks.end());
  }
  void Run(const loom::v1::StepPlan& plan) {
    const loom::v1::StepResult result = executor_->Execute(plan);
    ASSERT_EQ(result.error_code(), 0) << result.error_message();
  }
  Links ReportedLinks() const { return Report(executor_->kv_ledger()).links; }

  std::unique_ptr<NoopBackend> backend_;
  std::unique_ptr<StepExecutor> executor_;
  uint64_t step_id_ = 0;
};

TEST_F(StepExecutorLedgerTest, RecordsEachBlockOnceItsTokensAreComputed) {
  // 40 prompt tokens in blocks 4, 9, 2: a chunk of 20, then the other 20.
  loom::v1::StepPlan first = Plan();
  *first.add_added() = Added(1, std::vector<int32_t>(40, 7), "tenant");
  Schedule(first, 1, 20, false, {4, 9});
  Run(first);
  EXPECT_EQ(ReportedLinks(), (Links{{4, kNoParent}}));
  loom::v1::StepPlan second = Plan();
  Schedule(second, 1, 20, true, {2});
  Run(second);
  // Block 2 holds 8 computed tokens (32-39): not full.
  EXPECT_EQ(ReportedLinks(), (Links{{4, kNoParent}, {9, 4}}));
  EXPECT_EQ(Report(executor_->kv_ledger()).blocks[0].cache_salt(), "tenant");
  // Decode 8 tokens: the sampled token of each step is computed by the next, so block 2
  // is full once the 8th decode step ran (tokens 32-47 computed).
  for (int i = 0; i < 8; ++i) {
    loom::v1::StepPlan decode = Plan();
    Schedule(decode, 1, 1, true, {});
    Run(decode);
  }
  EXPECT_EQ(ReportedLinks(), (Links{{4, kNoParent}, {9, 4}, {2, 9}}));
  // Reset (a new stream) keeps the ledger: the K/V are still in the pool.
  ASSERT_TRUE(executor_->Reset().ok());
  EXPECT_EQ(executor_->kv_ledger().num_recorded(), 3);
}

TEST_F(StepExecutorLedgerTest, AStepThatWritesABlockForgetsItEvenWhenItFails) {
  loom::v1::StepPlan prefill = Plan();
  *prefill.add_added() = Added(1, std::vector<int32_t>(33, 7));
  Schedule(prefill, 1, 33, true, {0, 1, 2});
  Run(prefill);
  EXPECT_EQ(ReportedLinks(), (Links{{0, kNoParent}, {1, 0}}));
  // Another sequence reuses block 1 after the coordinator evicted it (a fresh block of a
  // new sequence): block 1 is forgotten at once, and block 0 stays.
  loom::v1::StepPlan other = Plan();
  other.add_finished(1);
  *other.add_added() = Added(2, std::vector<int32_t>(5, 3));
  Schedule(other, 2, 5, true, {1});
  Run(other);
  EXPECT_EQ(ReportedLinks(), (Links{{0, kNoParent}}));
  // A plan that fails after validation (its host-tier copy cannot run: no tier) forgets
  // the block it would have loaded.
  loom::v1::StepPlan failing = Plan();
  loom::v1::KvBlockCopy* copy = failing.add_kv_copies();
  copy->set_direction(loom::v1::KvBlockCopy::HOST_TO_DEVICE);
  copy->set_device_block(0);
  copy->set_host_slot(0);
  EXPECT_NE(executor_->Execute(failing).error_code(), 0);
  EXPECT_TRUE(ReportedLinks().empty());
}

TEST_F(StepExecutorLedgerTest, ACachedPrefixIsRecordedUnderItsNewParentAndEmbeddingsAreNot) {
  loom::v1::StepPlan prefill = Plan();
  *prefill.add_added() = Added(1, std::vector<int32_t>(20, 7));
  Schedule(prefill, 1, 20, true, {3, 8});
  Run(prefill);
  // A second sequence starts from block 3 as its cached prefix.
  loom::v1::StepPlan hit = Plan();
  loom::v1::NewSequence added = Added(2, std::vector<int32_t>(36, 7));
  added.set_num_cached_tokens(16);
  *hit.add_added() = added;
  Schedule(hit, 2, 20, true, {3, 11, 12});
  Run(hit);
  EXPECT_EQ(ReportedLinks(), (Links{{3, kNoParent}, {11, 3}}));
  loom::v1::StepPlan embed = Plan();
  loom::v1::NewSequence embedded = Added(3, std::vector<int32_t>(17, 9));
  embedded.set_embed(true);
  *embed.add_added() = embedded;
  Schedule(embed, 3, 17, true, {20, 21});
  Run(embed);
  EXPECT_EQ(ReportedLinks(), (Links{{3, kNoParent}, {11, 3}}));
}

}  // namespace
}  // namespace loom::worker
