#include "model/kv_cache_budget.h"

#include <climits>
#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "model/kv_layout.h"

namespace loom::model {
namespace {

// 4 layers, 8 query heads over 4 KV heads of 16: 2 x 4 x 16 x 4 x 16 = 8192 F16 bytes per
// 16-token block of the whole model.
common::ModelConfig Config() {
  common::ModelConfig config;
  config.num_layers = 4;
  config.num_heads = 8;
  config.num_kv_heads = 4;
  config.head_dim = 16;
  config.hidden_size = 128;
  config.intermediate_size = 256;
  config.vocab_size = 1000;
  return config;
}

KvBlockSpec Block(int64_t bytes, int64_t block_size = 16) {
  KvBlockSpec block;
  block.block_size = block_size;
  block.bytes = bytes;
  block.dtype_name = "f16";
  return block;
}

TEST(KvCacheBudgetTest, BlockBytesAreTheLayoutFactOfTheRanksKvHeads) {
  const KvBlockSpec whole = KvBlockOf(Config(), 16, 2, "f16");
  EXPECT_EQ(whole.bytes, KvBytesPerBlock(Config(), 16, 2));
  EXPECT_EQ(whole.bytes, 2 * 4 * 16 * 4 * 16 * 2);
  EXPECT_EQ(whole.block_size, 16);
  EXPECT_EQ(whole.dtype_name, "f16");

  absl::StatusOr<KvBlockSpec> one = ShardKvBlock(Config(), {0, 1, 0, 1, {}}, 16, 2, "f16");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->bytes, whole.bytes);
  // Two ranks of 4 query heads each keep 2 KV heads: half the block.
  absl::StatusOr<KvBlockSpec> half = ShardKvBlock(Config(), {1, 2, 0, 1, {}}, 16, 2, "f16");
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ(half->bytes, whole.bytes / 2);
  // Eight ranks of one query head each: a KV head is held by two ranks, one per rank.
  absl::StatusOr<KvBlockSpec> eighth = ShardKvBlock(Config(), {7, 8, 0, 1, {}}, 16, 4, "f32");
  ASSERT_TRUE(eighth.ok()) << eighth.status();
  EXPECT_EQ(eighth->bytes, 2 * 4 * 16 * 1 * 16 * 4);
  // 8-bit KV: one byte per element and a 2-byte scale per token and KV head.
  const KvBlockSpec int8 = KvBlockOf(Config(), 16, 1, "int8", 2);
  EXPECT_EQ(int8.bytes, 2 * 4 * 16 * 4 * (16 * 1 + 2));
  EXPECT_EQ(int8.bytes, KvBytesPerBlock(Config(), 16, 1, 2));
  absl::StatusOr<KvBlockSpec> int8_half =
      ShardKvBlock(Config(), {1, 2, 0, 1, {}}, 16, 1, "int8", 2);
  ASSERT_TRUE(int8_half.ok()) << int8_half.status();
  EXPECT_EQ(int8_half->bytes, int8.bytes / 2);
}

TEST(KvCacheBudgetTest, AGroupTheModelDoesNotSplitIntoIsInvalid) {
  absl::StatusOr<KvBlockSpec> block = ShardKvBlock(Config(), {0, 16, 0, 1, {}}, 16, 2, "f16");
  EXPECT_EQ(block.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(block.status().message().find("8 attention heads"), std::string::npos)
      << block.status();
}

TEST(KvCacheBudgetTest, SlotIdsAreInt32) {
  EXPECT_EQ(MaxKvBlocks(1), INT32_MAX);
  EXPECT_EQ(MaxKvBlocks(16), INT32_MAX / 16);
  EXPECT_LE(MaxKvBlocks(1024) * 1024, int64_t{INT32_MAX});
}

TEST(KvCacheBudgetTest, HostBudgetIsTheBytesGivenElseAFractionOfAvailableElse512MiB) {
  EXPECT_EQ(*HostKvBudgetBytes(int64_t{12345}, std::nullopt), 12345);
  EXPECT_EQ(*HostKvBudgetBytes(std::nullopt, std::nullopt), int64_t{512} << 20);
  EXPECT_EQ(kDefaultHostKvBudgetBytes, int64_t{512} << 20);
  absl::StatusOr<int64_t> available = MemAvailableBytes();
  if (!available.ok()) GTEST_SKIP() << available.status();
  EXPECT_GT(*available, 0);
  absl::StatusOr<int64_t> budget = HostKvBudgetBytes(std::nullopt, 0.25);
  ASSERT_TRUE(budget.ok()) << budget.status();
  // MemAvailable moves between the two reads.
  EXPECT_NEAR(static_cast<double>(*budget), *available * 0.25, *available * 0.02);
}

TEST(KvCacheBudgetTest, BudgetHoldsItsWholeBlocks) {
  EXPECT_EQ(*KvBlocksFromBudget(8192, Block(8192)), 1);
  EXPECT_EQ(*KvBlocksFromBudget(10 * 8192 + 8191, Block(8192)), 10);
  // Capped where slot ids would pass int32.
  EXPECT_EQ(*KvBlocksFromBudget(int64_t{1} << 50, Block(2, 1024)), INT32_MAX / 1024);
}

TEST(KvCacheBudgetTest, BudgetOfLessThanOneBlockIsInvalidNamingBoth) {
  absl::StatusOr<int64_t> blocks = KvBlocksFromBudget(1024, Block(8192));
  EXPECT_EQ(blocks.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(blocks.status().message(),
            "a KV budget of 1024 bytes holds no block: one block of 16 tokens takes 8192 bytes "
            "(f16 KV)");
}

TEST(KvCacheBudgetTest, DeviceBlocksGivenAreKeptBelowTheScratchBlocksLimit) {
  DeviceKvBudget budget;
  budget.num_blocks = 100;
  // The memory does not matter when the count is given.
  EXPECT_EQ(*DeviceKvBlocks(budget, {0, 0, 0}, Block(8192)), 100);
  budget.num_blocks = int64_t{1} << 40;
  EXPECT_EQ(*DeviceKvBlocks(budget, {0, 0, 0}, Block(8192, 16)), INT32_MAX / 16 - 1);
}

TEST(KvCacheBudgetTest, DeviceBlocksTakeAFractionOfFreeMemoryLessTheScratchBlock) {
  DeviceKvBudget budget;  // 0.9 of free memory
  const DeviceMemory memory{1000 * 8192, 4000 * 8192, 2000 * 8192};
  EXPECT_EQ(*DeviceKvBlocks(budget, memory, Block(8192)), 900 - 1);
  budget.free_fraction = 0.5;
  EXPECT_EQ(*DeviceKvBlocks(budget, memory, Block(8192)), 500 - 1);
}

TEST(KvCacheBudgetTest, MemoryUtilizationIsTheWorkersShareOfTheTotalLessItsOwnUse) {
  DeviceKvBudget budget;
  budget.memory_utilization = 0.5;
  // Total 4000 blocks' worth: the share is 2000; the forward pass took 1000 (3000 free at start,
  // 2000 now), so 1000 are left to it, under 0.9 x 2000 free.
  EXPECT_EQ(*DeviceKvBlocks(budget, {2000 * 8192, 4000 * 8192, 3000 * 8192}, Block(8192)),
            1000 - 1);
  // Little is free (other processes hold most of the device): the pool never takes more
  // than the default share of what is free.
  EXPECT_EQ(*DeviceKvBlocks(budget, {500 * 8192, 4000 * 8192, 600 * 8192}, Block(8192)), 450 - 1);
  // Free memory grew since the start: no use is counted against the share.
  EXPECT_EQ(*DeviceKvBlocks(budget, {3000 * 8192, 4000 * 8192, 1000 * 8192}, Block(8192)),
            2000 - 1);
}

TEST(KvCacheBudgetTest, ADraftsMirroredPoolSharesTheRoomBlockForBlock) {
  DeviceKvBudget budget;  // 0.9 of free memory
  // A draft block of a quarter of the target's: 900 blocks' worth of room holds 720 pairs.
  budget.companion_block_bytes = 2048;
  const DeviceMemory memory{1000 * 8192, 4000 * 8192, 2000 * 8192};
  EXPECT_EQ(*DeviceKvBlocks(budget, memory, Block(8192)), 720 - 1);
  // Under a share of the total, the draft's weights (loaded first) count as this worker's
  // use: 2000 blocks' share, 1000 taken by the target and 200 by the draft leave 800, which
  // hold 640 pairs.
  budget.memory_utilization = 0.5;
  budget.companion_bytes = 200 * 8192;
  EXPECT_EQ(*DeviceKvBlocks(budget, {2000 * 8192, 4000 * 8192, 3000 * 8192}, Block(8192)), 640 - 1);
  // A count given is the count: the draft's pool is that many blocks beside it.
  budget.num_blocks = 100;
  EXPECT_EQ(*DeviceKvBlocks(budget, memory, Block(8192)), 100);
}

TEST(KvCacheBudgetTest, DeviceWithoutRoomForABlockIsResourceExhausted) {
  DeviceKvBudget budget;
  absl::StatusOr<int64_t> blocks =
      DeviceKvBlocks(budget, {2 * 8192, 8 * 8192, 2 * 8192}, Block(8192));
  EXPECT_EQ(blocks.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(blocks.status().message(),
            "no room for a KV block of 8192 bytes (16384 bytes free on the device)");
  // A forward pass whose own use already passed its share gets nothing, not a negative pool.
  budget.memory_utilization = 0.1;
  blocks = DeviceKvBlocks(budget, {10 * 8192, 100 * 8192, 50 * 8192}, Block(8192));
  EXPECT_EQ(blocks.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace loom::model
