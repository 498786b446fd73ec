#include "engine/block_hash.h"

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

std::vector<int32_t> Tokens(int32_t first, int32_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

TEST(BlockHashTest, IsAFixedFunctionOfTheSecretAndItsInputs) {
  // Pinned values for a fixed secret: a change to the mixer shows here.
  const BlockHash seed = PrefixHashSeedWithSecret({1, 2}, "fingerprint", "");
  const BlockHash block = HashBlock(seed, Tokens(1, 16));
  EXPECT_EQ(seed.hi, 0xbd4db346c5ca3d0aULL) << std::hex << seed.hi;
  EXPECT_EQ(seed.lo, 0xbbf43fb92c945a61ULL) << std::hex << seed.lo;
  EXPECT_EQ(block.hi, 0x04183dd0eb533e45ULL) << std::hex << block.hi;
  EXPECT_EQ(block.lo, 0xe267c35475efbd02ULL) << std::hex << block.lo;
}

TEST(BlockHashTest, TheProcessSecretSeedsEveryChain) {
  // Nobody outside the process can compute a hash: the seed depends on the secret, which
  // is drawn at random (two draws of 128 bits do not repeat).
  EXPECT_EQ(PrefixHashSeed("m", "s"), PrefixHashSeedWithSecret(ProcessHashSecret(), "m", "s"));
  EXPECT_NE(PrefixHashSeed("m", "s"), PrefixHashSeedWithSecret({0, 0}, "m", "s"));
  EXPECT_NE(PrefixHashSeedWithSecret({0, 1}, "m", "s"), PrefixHashSeedWithSecret({1, 0}, "m", "s"));
  EXPECT_NE(ProcessHashSecret(), BlockHash{});
  EXPECT_EQ(&ProcessHashSecret(), &ProcessHashSecret());
}

TEST(BlockHashTest, TheCollisionHookMakesEqualLengthBlocksCollide) {
  const BlockHash seed = PrefixHashSeed("m", "");
  const BlockHash honest = HashBlock(seed, Tokens(0, 16));
  SetBlockHashCollisionsForTesting(true);
  const BlockHash a = HashBlock(seed, Tokens(0, 16));
  const BlockHash b = HashBlock(seed, Tokens(100, 16));
  const BlockHash shorter = HashBlock(seed, Tokens(0, 15));
  SetBlockHashCollisionsForTesting(false);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, shorter);
  EXPECT_EQ(HashBlock(seed, Tokens(0, 16)), honest);
  EXPECT_NE(honest, HashBlock(seed, Tokens(100, 16)));
}

TEST(BlockHashTest, EqualInputsGiveEqualHashes) {
  const BlockHash seed = PrefixHashSeed("model-a", "salt");
  EXPECT_EQ(seed, PrefixHashSeed("model-a", "salt"));
  EXPECT_EQ(HashFullBlocks(seed, Tokens(7, 40), 16), HashFullBlocks(seed, Tokens(7, 40), 16));
}

TEST(BlockHashTest, SaltAndModelIsolateEveryBlock) {
  const std::vector<int32_t> tokens = Tokens(3, 64);
  const std::vector<BlockHash> base = HashFullBlocks(PrefixHashSeed("m", ""), tokens, 16);
  const std::vector<BlockHash> salted = HashFullBlocks(PrefixHashSeed("m", "tenant"), tokens, 16);
  const std::vector<BlockHash> other_model = HashFullBlocks(PrefixHashSeed("m2", ""), tokens, 16);
  ASSERT_EQ(base.size(), 4u);
  for (size_t b = 0; b < base.size(); ++b) {
    EXPECT_NE(base[b], salted[b]) << b;
    EXPECT_NE(base[b], other_model[b]) << b;
  }
  // The keys are length-delimited: moving a byte from one key to the other changes it.
  EXPECT_NE(PrefixHashSeed("ab", "c"), PrefixHashSeed("a", "bc"));
  EXPECT_NE(PrefixHashSeed("", "x"), PrefixHashSeed("x", ""));
}

TEST(BlockHashTest, ABlockHashDependsOnEveryEarlierToken) {
  const BlockHash seed = PrefixHashSeed("m", "");
  std::vector<int32_t> tokens = Tokens(0, 48);
  const std::vector<BlockHash> original = HashFullBlocks(seed, tokens, 16);
  tokens[3] += 1;  // in block 0
  const std::vector<BlockHash> changed = HashFullBlocks(seed, tokens, 16);
  for (size_t b = 0; b < 3; ++b) EXPECT_NE(original[b], changed[b]) << b;
  // The same block tokens after a different parent hash to something else.
  EXPECT_NE(HashBlock(original[0], Tokens(0, 16)), HashBlock(changed[0], Tokens(0, 16)));
  // Order within a block matters, and so does each token's full 32 bits.
  std::vector<int32_t> swapped = Tokens(0, 16);
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(HashBlock(seed, Tokens(0, 16)), HashBlock(seed, swapped));
  std::vector<int32_t> high = Tokens(0, 16);
  high[5] |= 1 << 30;
  EXPECT_NE(HashBlock(seed, Tokens(0, 16)), HashBlock(seed, high));
}

TEST(BlockHashTest, OnlyFullBlocksAreHashedAndExtendingMatchesHashingAtOnce) {
  const BlockHash seed = PrefixHashSeed("m", "");
  const std::vector<int32_t> tokens = Tokens(10, 37);
  const std::vector<BlockHash> all = HashFullBlocks(seed, tokens, 8);
  EXPECT_EQ(all.size(), 4u);  // 37 / 8
  std::vector<BlockHash> grown;
  ExtendBlockHashes(seed, tokens, 8, 1, &grown);
  EXPECT_EQ(grown.size(), 1u);
  ExtendBlockHashes(seed, tokens, 8, 100, &grown);
  EXPECT_EQ(grown, all);
}

TEST(BlockHashTest, NoCollisionsInEitherLaneOverManyRandomBlocks) {
  // 200k random blocks: a 64-bit lane that mixes well has no collision here with
  // probability ~1 - 1e-9; a weak one (lost entropy) shows duplicates quickly.
  std::mt19937 rng(42);
  const BlockHash seed = PrefixHashSeed("m", "");
  absl::flat_hash_set<uint64_t> his, los;
  std::vector<int32_t> block(16);
  for (int i = 0; i < 200000; ++i) {
    for (int32_t& token : block) token = static_cast<int32_t>(rng() % 50000);
    const BlockHash hash = HashBlock(seed, block);
    EXPECT_TRUE(his.insert(hash.hi).second);
    EXPECT_TRUE(los.insert(hash.lo).second);
  }
  // Sequential, highly structured input (counts differing in one token) too.
  for (int32_t i = 0; i < 100000; ++i) {
    std::vector<int32_t> structured(16, 0);
    structured[15] = i;
    const BlockHash hash = HashBlock(seed, structured);
    EXPECT_TRUE(his.insert(hash.hi).second);
    EXPECT_TRUE(los.insert(hash.lo).second);
  }
}

}  // namespace
}  // namespace loom::engine
