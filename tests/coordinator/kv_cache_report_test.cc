#include "coordinator/kv_cache_report.h"

#include <cstdint>
#include <string>
#include <vector>

#include "engine/block_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::ElementsAre;

constexpr int32_t kBlockSize = 4;

// Tokens of a prompt: 4 blocks of 4.
std::vector<int32_t> Prompt() {
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 16; ++i) tokens.push_back(100 + i);
  return tokens;
}

// A rank's registration reporting the prompt's blocks in pool blocks `blocks`.
loom::v1::RegisterRequest Reporting(const std::vector<int32_t>& blocks, const std::string& salt) {
  loom::v1::RegisterRequest request;
  const std::vector<int32_t> tokens = Prompt();
  for (size_t i = 0; i < blocks.size(); ++i) {
    loom::v1::CachedKvBlock* block = request.add_cached_kv_blocks();
    block->set_block(blocks[i]);
    block->set_parent(i == 0 ? -1 : blocks[i - 1]);
    block->mutable_token_ids()->Add(tokens.begin() + static_cast<int>(i) * kBlockSize,
                                    tokens.begin() + static_cast<int>(i + 1) * kBlockSize);
    if (i == 0) block->set_cache_salt(salt);
  }
  return request;
}

std::vector<int32_t> BlockIds(const std::vector<engine::AdoptedBlock>& adopted) {
  std::vector<int32_t> ids;
  for (const engine::AdoptedBlock& block : adopted) ids.push_back(block.block);
  return ids;
}

TEST(KvCacheReportTest, HashesChainsAsThisProcessHashesTheSamePrompt) {
  const loom::v1::RegisterRequest rank0 = Reporting({7, 3, 9, 1}, "tenant");
  const std::vector<engine::AdoptedBlock> adopted = AdoptableBlocks({&rank0}, "model", kBlockSize);
  ASSERT_THAT(BlockIds(adopted), ElementsAre(7, 3, 9, 1));
  // What a request with this prompt and salt looks up (Request::PromptBlockHashes).
  const std::vector<engine::BlockHash> expected =
      engine::HashFullBlocks(engine::PrefixHashSeed("model", "tenant"), Prompt(), kBlockSize);
  for (size_t i = 0; i < adopted.size(); ++i) EXPECT_EQ(adopted[i].hash, expected[i]) << i;
  EXPECT_EQ(adopted[0].salt, "tenant");
  EXPECT_EQ(adopted[0].parent_block, -1);
  EXPECT_EQ(adopted[2].parent_block, 3);
  EXPECT_THAT(adopted[1].tokens, ElementsAre(104, 105, 106, 107));
  // Another model (or salt) gives other hashes.
  const std::vector<engine::AdoptedBlock> other = AdoptableBlocks({&rank0}, "other", kBlockSize);
  EXPECT_NE(other[0].hash, adopted[0].hash);
}

TEST(KvCacheReportTest, OnlyBlocksEveryRankHoldsAlikeCountWithTheirDescendants) {
  const loom::v1::RegisterRequest rank0 = Reporting({7, 3, 9, 1}, "");
  // Rank 1 (a stage behind) holds the first two blocks only; rank 2 holds block 3 with
  // other tokens.
  const loom::v1::RegisterRequest rank1 = Reporting({7, 3}, "");
  loom::v1::RegisterRequest rank2 = Reporting({7, 3, 9, 1}, "");
  EXPECT_THAT(BlockIds(AdoptableBlocks({&rank0, &rank1}, "m", kBlockSize)), ElementsAre(7, 3));
  rank2.mutable_cached_kv_blocks(1)->set_token_ids(0, 5);
  EXPECT_THAT(BlockIds(AdoptableBlocks({&rank0, &rank2}, "m", kBlockSize)), ElementsAre(7));
}

TEST(KvCacheReportTest, MalformedReportsLeaveTheirBlocksAndDescendantsOut) {
  // A child before its parent, a wrong length, a block reported twice.
  loom::v1::RegisterRequest rank0 = Reporting({7, 3, 9, 1}, "");
  rank0.mutable_cached_kv_blocks()->SwapElements(0, 1);
  EXPECT_THAT(BlockIds(AdoptableBlocks({&rank0}, "m", kBlockSize)), ElementsAre(7));
  loom::v1::RegisterRequest short_block = Reporting({7, 3, 9}, "");
  short_block.mutable_cached_kv_blocks(1)->mutable_token_ids()->RemoveLast();
  EXPECT_THAT(BlockIds(AdoptableBlocks({&short_block}, "m", kBlockSize)), ElementsAre(7));
  loom::v1::RegisterRequest twice = Reporting({7, 3}, "");
  *twice.add_cached_kv_blocks() = twice.cached_kv_blocks(0);
  EXPECT_THAT(BlockIds(AdoptableBlocks({&twice}, "m", kBlockSize)), ElementsAre(7, 3));
  EXPECT_TRUE(AdoptableBlocks({}, "m", kBlockSize).empty());
}

}  // namespace
}  // namespace loom::coordinator
