#include "worker/step_batch.h"

#include <gtest/gtest.h>

namespace loom::worker {
namespace {

constexpr int64_t kVocab = 100, kContext = 64, kBlocks = 8, kBlockSize = 4;

absl::Status Validate(const StepBatch& batch) {
  return ValidateStepBatch(batch, kVocab, kContext, kBlocks, kBlockSize);
}

TEST(StepBatchTest, AppendSequenceDerivesPositionsAndSlotsFromTheBlockTable) {
  StepBatch batch;
  // Prefill of 5 tokens in blocks {3, 1}, then a decode at position 6 in blocks {0, 2}.
  ASSERT_TRUE(AppendSequence(batch, {10, 11, 12, 13, 14}, 0, {3, 1}, kBlockSize, true).ok());
  ASSERT_TRUE(AppendSequence(batch, {20}, 6, {0, 2}, kBlockSize, true).ok());
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 6}));
  EXPECT_EQ(batch.slots, (std::vector<int32_t>{12, 13, 14, 15, 4, 10}));
  EXPECT_EQ(batch.query_start, (std::vector<int32_t>{0, 5, 6}));
  EXPECT_EQ(batch.context_len, (std::vector<int32_t>{5, 7}));
  EXPECT_EQ(batch.block_indptr, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(batch.sample_rows, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(Validate(batch).ok());
}

TEST(StepBatchTest, AppendSequenceRejectsTooFewBlocks) {
  StepBatch batch;
  EXPECT_FALSE(AppendSequence(batch, {1, 2, 3, 4, 5}, 0, {0}, kBlockSize, true).ok());
  EXPECT_FALSE(AppendSequence(batch, {}, 0, {0}, kBlockSize, true).ok());
}

TEST(StepBatchTest, RejectsTokenOutsideVocabulary) {
  StepBatch batch;
  ASSERT_TRUE(AppendSequence(batch, {1, kVocab}, 0, {0}, kBlockSize, true).ok());
  const absl::Status status = Validate(batch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("vocabulary"), std::string::npos) << status;
}

TEST(StepBatchTest, RejectsBlockOutsidePool) {
  StepBatch batch;
  ASSERT_TRUE(AppendSequence(batch, {1, 2}, 0, {kBlocks}, kBlockSize, true).ok());
  EXPECT_NE(Validate(batch).message().find("KV pool"), std::string::npos);
}

TEST(StepBatchTest, NamesTheFirstNegativeIdAndBlock) {
  StepBatch batch;
  ASSERT_TRUE(AppendSequence(batch, {1, -3, -4}, 0, {0}, kBlockSize, true).ok());
  EXPECT_NE(Validate(batch).message().find("token 1: id -3"), std::string::npos)
      << Validate(batch);
  StepBatch blocks;
  ASSERT_TRUE(AppendSequence(blocks, {1}, 0, {2}, kBlockSize, true).ok());
  ASSERT_TRUE(AppendSequence(blocks, {1}, 4, {5, -7, -1}, kBlockSize, true).ok());
  EXPECT_NE(Validate(blocks).message().find("block id -7"), std::string::npos)
      << Validate(blocks);
}

TEST(StepBatchTest, ClearReturnsTheEmptyBatch) {
  StepBatch batch;
  ASSERT_TRUE(AppendSequence(batch, {10, 11, 12, 13, 14}, 0, {3, 1}, kBlockSize, true).ok());
  batch.Clear();
  EXPECT_EQ(batch.num_tokens(), 0);
  EXPECT_EQ(batch.num_seqs(), 0);
  EXPECT_EQ(batch.query_start, (std::vector<int32_t>{0}));
  EXPECT_EQ(batch.block_indptr, (std::vector<int32_t>{0}));
  EXPECT_TRUE(batch.block_indices.empty());
  EXPECT_TRUE(batch.sample_rows.empty());
  // And is built on as a fresh one is.
  ASSERT_TRUE(AppendSequence(batch, {20}, 6, {0, 2}, kBlockSize, true).ok());
  StepBatch fresh;
  ASSERT_TRUE(AppendSequence(fresh, {20}, 6, {0, 2}, kBlockSize, true).ok());
  EXPECT_EQ(batch.slots, fresh.slots);
  EXPECT_EQ(batch.query_start, fresh.query_start);
  EXPECT_EQ(batch.block_indptr, fresh.block_indptr);
  EXPECT_TRUE(Validate(batch).ok());
}

TEST(StepBatchTest, RejectsContextPastTheModelLimit) {
  StepBatch batch;
  std::vector<int32_t> blocks(kContext / kBlockSize + 1);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i % kBlocks);
  ASSERT_TRUE(AppendSequence(batch, {1}, kContext, blocks, kBlockSize, true).ok());
  EXPECT_NE(Validate(batch).message().find("context length"), std::string::npos);
}

TEST(StepBatchTest, RejectsSlotsOrPositionsThatDisagreeWithTheBlockTable) {
  StepBatch batch;
  ASSERT_TRUE(AppendSequence(batch, {1, 2}, 0, {2}, kBlockSize, true).ok());
  StepBatch bad_slot = batch;
  bad_slot.slots[1] = 0;
  EXPECT_NE(Validate(bad_slot).message().find("slot"), std::string::npos);
  StepBatch bad_position = batch;
  bad_position.positions[0] = 1;
  EXPECT_NE(Validate(bad_position).message().find("position"), std::string::npos);
  StepBatch bad_row = batch;
  bad_row.sample_rows.push_back(7);
  EXPECT_NE(Validate(bad_row).message().find("sample row"), std::string::npos);
}

}  // namespace
}  // namespace loom::worker
