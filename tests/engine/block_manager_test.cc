#include "engine/block_manager.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int32_t kBlockSize = 2;

TEST(BlockManagerTest, HandsOutNeverUsedBlocksLowestIdFirst) {
  BlockManager manager(8, kBlockSize);
  EXPECT_EQ(manager.num_free(), 8);
  absl::StatusOr<std::vector<int32_t>> first = manager.Allocate(3);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(*first, ElementsAre(0, 1, 2));
  absl::StatusOr<std::vector<int32_t>> second = manager.Allocate(2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(*second, ElementsAre(3, 4));
  EXPECT_EQ(manager.num_free(), 3);
  for (int32_t block : {0, 1, 2, 3, 4}) EXPECT_EQ(manager.ref_count(block), 1);
  EXPECT_EQ(manager.ref_count(5), 0);
}

TEST(BlockManagerTest, ReusesFreedBlocksOnlyAfterNeverUsedOnesLeastRecentlyFreedFirst) {
  BlockManager manager(4, kBlockSize);
  ASSERT_TRUE(manager.Allocate(2).ok());  // 0, 1
  // Freed tail first, as a sequence releases its table: 1 is the least recently freed.
  ASSERT_TRUE(manager.Free({1, 0}).ok());
  EXPECT_EQ(manager.num_free(), 4);
  absl::StatusOr<std::vector<int32_t>> fresh = manager.Allocate(2);
  ASSERT_TRUE(fresh.ok());
  EXPECT_THAT(*fresh, ElementsAre(2, 3));
  absl::StatusOr<std::vector<int32_t>> reused = manager.Allocate(2);
  ASSERT_TRUE(reused.ok());
  EXPECT_THAT(*reused, ElementsAre(1, 0));
  EXPECT_EQ(manager.num_free(), 0);
}

TEST(BlockManagerTest, FreedRingWrapsAroundAcrossManyCycles) {
  BlockManager manager(3, kBlockSize);
  ASSERT_TRUE(manager.Allocate(3).ok());
  // Free and retake one block at a time many times: the ring's head and tail wrap.
  int32_t expected = 0;
  for (int round = 0; round < 10; ++round) {
    ASSERT_TRUE(manager.Free({expected}).ok());
    absl::StatusOr<std::vector<int32_t>> again = manager.Allocate(1);
    ASSERT_TRUE(again.ok());
    EXPECT_THAT(*again, ElementsAre(expected));
    expected = (expected + 1) % 3;
  }
  ASSERT_TRUE(manager.Free({2, 1, 0}).ok());
  absl::StatusOr<std::vector<int32_t>> all = manager.Allocate(3);
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(*all, ElementsAre(2, 1, 0));
}

TEST(BlockManagerTest, AllocateTakesNothingWhenTooFewAreFree) {
  BlockManager manager(4, kBlockSize);
  ASSERT_TRUE(manager.Allocate(3).ok());
  absl::StatusOr<std::vector<int32_t>> too_many = manager.Allocate(2);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_many.status().message(), HasSubstr("need 2"));
  EXPECT_EQ(manager.num_free(), 1);
  EXPECT_EQ(manager.ref_count(3), 0);
  absl::StatusOr<std::vector<int32_t>> last = manager.Allocate(1);
  ASSERT_TRUE(last.ok());
  EXPECT_THAT(*last, ElementsAre(3));
}

TEST(BlockManagerTest, AllocateOfZeroIsEmptyAndNegativeIsInvalid) {
  BlockManager manager(2, kBlockSize);
  absl::StatusOr<std::vector<int32_t>> none = manager.Allocate(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(manager.Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.num_free(), 2);
}

TEST(BlockManagerTest, SharedBlockIsFreedOnlyWhenItsLastReferenceDrops) {
  BlockManager manager(4, kBlockSize);
  ASSERT_TRUE(manager.Allocate(2).ok());  // 0, 1
  ASSERT_TRUE(manager.AddReference({0, 1}).ok());
  EXPECT_EQ(manager.ref_count(0), 2);
  ASSERT_TRUE(manager.Free({1, 0}).ok());
  EXPECT_EQ(manager.ref_count(0), 1);
  EXPECT_EQ(manager.num_free(), 2);
  ASSERT_TRUE(manager.Free({1, 0}).ok());
  EXPECT_EQ(manager.ref_count(0), 0);
  EXPECT_EQ(manager.num_free(), 4);
}

TEST(BlockManagerTest, AddReferenceToAFreeOrOutOfRangeBlockChangesNothing) {
  BlockManager manager(4, kBlockSize);
  ASSERT_TRUE(manager.Allocate(1).ok());  // 0
  EXPECT_EQ(manager.AddReference({0, 2}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager.ref_count(0), 1);
  EXPECT_EQ(manager.AddReference({0, 4}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager.AddReference({-1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager.ref_count(0), 1);
  EXPECT_EQ(manager.num_free(), 3);
}

TEST(BlockManagerTest, FreeOfAFreeBlockFailsAfterReleasingTheOnesBeforeIt) {
  BlockManager manager(4, kBlockSize);
  ASSERT_TRUE(manager.Allocate(2).ok());  // 0, 1
  const absl::Status twice = manager.Free({1, 1});
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.message(), HasSubstr("1"));
  EXPECT_EQ(manager.ref_count(1), 0);
  EXPECT_EQ(manager.ref_count(0), 1);
  EXPECT_EQ(manager.num_free(), 3);
  EXPECT_EQ(manager.Free({7}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager.Free({3}).code(), absl::StatusCode::kFailedPrecondition);  // never used
  EXPECT_EQ(manager.num_free(), 3);
}

TEST(BlockManagerTest, UsageIsTheFractionOfBlocksInUse) {
  BlockManager manager(4, kBlockSize);
  EXPECT_DOUBLE_EQ(manager.usage(), 0.0);
  ASSERT_TRUE(manager.Allocate(1).ok());
  EXPECT_DOUBLE_EQ(manager.usage(), 0.25);
  ASSERT_TRUE(manager.Allocate(3).ok());
  EXPECT_DOUBLE_EQ(manager.usage(), 1.0);
  BlockManager empty(0, kBlockSize);
  EXPECT_DOUBLE_EQ(empty.usage(), 0.0);
  EXPECT_EQ(empty.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
}

// ---------------------------------------------------------------------------------------
// The prefix cache.

// The tokens of a chain of `count` blocks of the family `first`: block i holds
// {first + i, first + i}. Chains of one family share their prefixes.
std::vector<int32_t> Tokens(int count, uint64_t first = 0) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < count; ++i) {
    tokens.insert(tokens.end(), kBlockSize, static_cast<int32_t>(first + static_cast<uint64_t>(i)));
  }
  return tokens;
}

std::vector<BlockHash> Chain(int count, uint64_t first = 0, std::string_view salt = "") {
  return HashFullBlocks(PrefixHashSeed("test", salt), Tokens(count, first), kBlockSize);
}

BlockManager::PrefixMatch Match(const BlockManager& manager, int count, uint64_t first = 0,
                                std::string_view salt = "") {
  return manager.MatchPrefix(Chain(count, first, salt), Tokens(count, first), salt);
}

// Registers `blocks` (in use) as the first blocks of the chain `first`, as a sequence that
// computed them does; returns how many registrations were accepted.
int RegisterChain(BlockManager& manager, const std::vector<int32_t>& blocks, uint64_t first = 0,
                  std::string_view salt = "") {
  const int count = static_cast<int>(blocks.size());
  const std::vector<BlockHash> hashes = Chain(count, first, salt);
  const std::vector<int32_t> tokens = Tokens(count, first);
  int accepted = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    accepted += manager.RegisterBlock(
        blocks[i], hashes[i], absl::MakeConstSpan(tokens).subspan(i * kBlockSize, kBlockSize),
        i == 0 ? BlockManager::kNoParent : blocks[i - 1], salt);
  }
  return accepted;
}

// Allocates `count` blocks and registers them as the chain `first`.
std::vector<int32_t> AllocateCached(BlockManager& manager, int count, uint64_t first = 0,
                                    std::string_view salt = "") {
  absl::StatusOr<std::vector<int32_t>> blocks = manager.Allocate(count);
  EXPECT_TRUE(blocks.ok()) << blocks.status();
  if (!blocks.ok()) return {};
  EXPECT_EQ(RegisterChain(manager, *blocks, first, salt), count);
  return *blocks;
}

TEST(BlockManagerTest, MatchesTheLongestCachedChainAndStopsAtTheFirstMiss) {
  BlockManager manager(8, kBlockSize);
  AllocateCached(manager, 2);
  const BlockManager::PrefixMatch match = Match(manager, 4);
  EXPECT_EQ(match.num_blocks, 2);
  EXPECT_EQ(match.num_free_blocks, 0);
  EXPECT_EQ(Match(manager, 2, 100).num_blocks, 0);
  EXPECT_EQ(Match(manager, 0).num_blocks, 0);
  EXPECT_EQ(manager.num_verification_failures(), 0);
}

TEST(BlockManagerTest, TakingACachedPrefixSharesItsBlocks) {
  BlockManager manager(8, kBlockSize);
  const std::vector<int32_t> blocks = AllocateCached(manager, 3);
  const std::vector<int32_t> shared = manager.TakeCachedPrefix(Chain(3), 2);
  EXPECT_THAT(shared, ElementsAre(blocks[0], blocks[1]));
  EXPECT_EQ(manager.ref_count(blocks[0]), 2);
  EXPECT_EQ(manager.ref_count(blocks[1]), 2);
  EXPECT_EQ(manager.ref_count(blocks[2]), 1);
  EXPECT_EQ(manager.num_free(), 5);
}

TEST(BlockManagerTest, FreedCachedBlocksStayFindableAndAreRevivedNotEvicted) {
  BlockManager manager(4, kBlockSize);
  const std::vector<int32_t> blocks = AllocateCached(manager, 2);
  ASSERT_TRUE(manager.Free({blocks[1], blocks[0]}).ok());
  EXPECT_EQ(manager.num_free(), 4);
  EXPECT_EQ(manager.num_cached(), 2);
  const BlockManager::PrefixMatch match = Match(manager, 2);
  EXPECT_EQ(match.num_blocks, 2);
  EXPECT_EQ(match.num_free_blocks, 2);
  const std::vector<int32_t> revived = manager.TakeCachedPrefix(Chain(2), 2);
  EXPECT_EQ(revived, blocks);
  EXPECT_EQ(manager.num_free(), 2);
  EXPECT_THAT(manager.FreeListForTesting(), IsEmpty());
  // The never-used blocks are what is left to allocate.
  absl::StatusOr<std::vector<int32_t>> rest = manager.Allocate(2);
  ASSERT_TRUE(rest.ok());
  EXPECT_THAT(*rest, ElementsAre(2, 3));
  EXPECT_EQ(manager.num_cached(), 2);
}

TEST(BlockManagerTest, EvictsLeastRecentlyFreedCachedBlockFirstAndTheTailBeforeThePrefix) {
  BlockManager manager(6, kBlockSize);
  const std::vector<int32_t> first = AllocateCached(manager, 3, 0);    // 0, 1, 2
  const std::vector<int32_t> second = AllocateCached(manager, 3, 10);  // 3, 4, 5
  manager.set_record_events(true);
  // A sequence releases its table tail first: its last block is evicted first, its
  // first block (the most shareable prefix) last.
  ASSERT_TRUE(manager.Free({first[2], first[1], first[0]}).ok());
  ASSERT_TRUE(manager.Free({second[2], second[1], second[0]}).ok());
  EXPECT_THAT(manager.FreeListForTesting(), ElementsAre(2, 1, 0, 5, 4, 3));
  absl::StatusOr<std::vector<int32_t>> taken = manager.Allocate(2);
  ASSERT_TRUE(taken.ok());
  EXPECT_THAT(*taken, ElementsAre(2, 1));
  EXPECT_FALSE(manager.is_cached(2));
  EXPECT_FALSE(manager.is_cached(1));
  EXPECT_TRUE(manager.is_cached(0));
  EXPECT_EQ(Match(manager, 3, 0).num_blocks, 1);
  EXPECT_EQ(Match(manager, 3, 10).num_blocks, 3);
  const std::vector<KvCacheEvent> events = manager.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].hash, Chain(3, 0)[2]);
  EXPECT_EQ(events[1].hash, Chain(3, 0)[1]);
  EXPECT_TRUE(manager.TakeEvents().empty());
}

TEST(BlockManagerTest, EvictionUnderPressureNeverTakesABlockInUse) {
  BlockManager manager(6, kBlockSize);
  const std::vector<int32_t> held = AllocateCached(manager, 3, 0);
  const std::vector<int32_t> freed = AllocateCached(manager, 3, 10);
  ASSERT_TRUE(manager.Free({freed[2], freed[1], freed[0]}).ok());
  // Only the three freed blocks can be had, cached or not.
  EXPECT_EQ(manager.Allocate(4).status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<std::vector<int32_t>> taken = manager.Allocate(3);
  ASSERT_TRUE(taken.ok());
  for (int32_t block : *taken)
    EXPECT_TRUE(std::find(held.begin(), held.end(), block) == held.end());
  for (int32_t block : held) {
    EXPECT_EQ(manager.ref_count(block), 1);
    EXPECT_TRUE(manager.is_cached(block));
  }
  EXPECT_EQ(Match(manager, 3, 0).num_blocks, 3);
  EXPECT_EQ(Match(manager, 3, 10).num_blocks, 0);
}

TEST(BlockManagerTest, RegisteringAHashTwiceKeepsTheFirstCopy) {
  BlockManager manager(4, kBlockSize);
  manager.set_record_events(true);
  absl::StatusOr<std::vector<int32_t>> blocks = manager.Allocate(2);
  ASSERT_TRUE(blocks.ok());
  EXPECT_EQ(RegisterChain(manager, {(*blocks)[0]}, 1), 1);
  EXPECT_EQ(RegisterChain(manager, {(*blocks)[1]}, 1), 0);  // same content elsewhere
  EXPECT_EQ(RegisterChain(manager, {(*blocks)[0]}, 2), 0);  // already holds one
  EXPECT_FALSE(manager.is_cached((*blocks)[1]));
  EXPECT_EQ(manager.num_cached(), 1);
  EXPECT_EQ(manager.TakeEvents().size(), 1u);
  // Freeing the uncached duplicate leaves the cached copy findable.
  ASSERT_TRUE(manager.Free({(*blocks)[1]}).ok());
  EXPECT_EQ(Match(manager, 1, 1).num_blocks, 1);
  EXPECT_EQ(manager.num_verification_failures(), 0);
}

// Test-only: every block hash ignores its tokens while this lives.
class CollidingHashes {
 public:
  CollidingHashes() { SetBlockHashCollisionsForTesting(true); }
  ~CollidingHashes() { SetBlockHashCollisionsForTesting(false); }
};

TEST(BlockManagerTest, ACollidingHashIsAMissNeverAnotherBlocksContent) {
  CollidingHashes colliding;
  BlockManager manager(8, kBlockSize);
  AllocateCached(manager, 3, 0);
  ASSERT_EQ(Chain(3, 0), Chain(3, 50));  // the hook works: different tokens, equal hashes
  EXPECT_EQ(Match(manager, 3, 50).num_blocks, 0);
  EXPECT_EQ(manager.num_verification_failures(), 1);
  // A chain that diverges after the first block is served only the block it shares.
  std::vector<int32_t> diverging = Tokens(3, 0);
  diverging[3] = 77;  // second block: {1, 77} instead of {1, 1}
  EXPECT_EQ(manager.MatchPrefix(Chain(3, 0), diverging, "").num_blocks, 1);
  EXPECT_EQ(manager.num_verification_failures(), 2);
  // The real owner still hits.
  EXPECT_EQ(Match(manager, 3, 0).num_blocks, 3);
  // Registering the colliding chain caches nothing and leaves the first copy in place.
  absl::StatusOr<std::vector<int32_t>> other = manager.Allocate(2);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(RegisterChain(manager, *other, 50), 0);
  EXPECT_EQ(manager.num_cached(), 3);
  EXPECT_EQ(Match(manager, 3, 0).num_blocks, 3);
}

TEST(BlockManagerTest, AHitNeedsTheSameParentNotOnlyTheSameTokens) {
  // A crafted hash for block 1 that names a cached block with equal tokens but another
  // prefix (block 0 differs): only block 0 may be served.
  BlockManager manager(8, kBlockSize);
  const std::vector<int32_t> a = AllocateCached(manager, 2, 0);  // {0,0} {1,1}
  absl::StatusOr<std::vector<int32_t>> b = manager.Allocate(1);
  ASSERT_TRUE(b.ok());
  const std::vector<int32_t> b_tokens = {9, 9, 1, 1};  // block 1 equals a's block 1
  const BlockHash b0 = HashBlock(PrefixHashSeed("test", ""), {9, 9});
  ASSERT_TRUE(manager.RegisterBlock((*b)[0], b0, {9, 9}, BlockManager::kNoParent, ""));
  const std::vector<BlockHash> crafted = {b0, Chain(2, 0)[1]};
  EXPECT_EQ(manager.MatchPrefix(crafted, b_tokens, "").num_blocks, 1);
  EXPECT_EQ(manager.num_verification_failures(), 1);
  EXPECT_EQ(Match(manager, 2, 0).num_blocks, 2);
}

TEST(BlockManagerTest, AFirstBlockHitNeedsTheSameCacheSalt) {
  BlockManager manager(8, kBlockSize);
  AllocateCached(manager, 2, 0, "tenant-a");
  EXPECT_EQ(Match(manager, 2, 0, "tenant-a").num_blocks, 2);
  // The same hashes presented with another salt (as a collision of the seeds would).
  EXPECT_EQ(manager.MatchPrefix(Chain(2, 0, "tenant-a"), Tokens(2, 0), "tenant-b").num_blocks, 0);
  EXPECT_EQ(manager.MatchPrefix(Chain(2, 0, "tenant-a"), Tokens(2, 0), "").num_blocks, 0);
  EXPECT_EQ(manager.num_verification_failures(), 2);
}

TEST(BlockManagerTest, AnUncachedDuplicateCanStillParentTheBlocksAfterIt) {
  // Two sequences computed the same first block; the second's own next block is cached
  // with the duplicate as its parent, and a later request finds both.
  BlockManager manager(8, kBlockSize);
  const std::vector<int32_t> first = AllocateCached(manager, 1, 0);
  absl::StatusOr<std::vector<int32_t>> second = manager.Allocate(2);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(RegisterChain(manager, *second, 0), 1);  // block 0: a duplicate; block 1: new
  EXPECT_FALSE(manager.is_cached((*second)[0]));
  EXPECT_TRUE(manager.is_cached((*second)[1]));
  EXPECT_EQ(Match(manager, 2, 0).num_blocks, 2);
  EXPECT_THAT(manager.TakeCachedPrefix(Chain(2, 0), 2), ElementsAre(first[0], (*second)[1]));
  EXPECT_EQ(manager.num_verification_failures(), 0);
}

TEST(BlockManagerTest, ABlockAfterAnUncachedParentIsNotCached) {
  CollidingHashes colliding;
  BlockManager manager(8, kBlockSize);
  AllocateCached(manager, 1, 0);
  absl::StatusOr<std::vector<int32_t>> other = manager.Allocate(2);
  ASSERT_TRUE(other.ok());
  // Block 0 collides with the cached one (not cached); block 1 has no nameable parent.
  EXPECT_EQ(RegisterChain(manager, *other, 50), 0);
  EXPECT_EQ(manager.num_cached(), 1);
}

TEST(BlockManagerTest, ForgettingTheCacheKeepsBlocksInUseAllocated) {
  BlockManager manager(4, kBlockSize);
  manager.set_record_events(true);
  const std::vector<int32_t> blocks = AllocateCached(manager, 2);
  ASSERT_TRUE(manager.Free({blocks[1]}).ok());
  manager.TakeEvents();
  manager.ForgetCachedBlocks();
  EXPECT_EQ(manager.num_cached(), 0);
  EXPECT_EQ(Match(manager, 2).num_blocks, 0);
  EXPECT_EQ(manager.ref_count(blocks[0]), 1);
  EXPECT_EQ(manager.TakeEvents().size(), 2u);
  EXPECT_EQ(manager.num_free(), 3);
}

TEST(BlockManagerTest, EventsAreNotRecordedUnlessAsked) {
  BlockManager manager(4, kBlockSize);
  AllocateCached(manager, 2);
  EXPECT_TRUE(manager.TakeEvents().empty());
}

// Fuzz: random allocate / share a cached prefix / append / free (tail first) / preempt
// (free everything, then re-admit through the cache) over a small pool, checking after
// every operation that reference counts equal the users, free blocks are exactly the
// unreferenced ones (each once in the free list), and cached hashes map to cached blocks.
TEST(BlockManagerTest, RandomOperationsKeepEveryInvariant) {
  constexpr int64_t kNumBlocks = 16;
  std::mt19937 rng(7);
  BlockManager manager(kNumBlocks, kBlockSize);
  // A user: its block table and the hash chain its full blocks would be registered under.
  struct User {
    std::vector<int32_t> blocks;
    std::vector<BlockHash> chain;
    std::vector<int32_t> tokens;  // the chain's
  };
  std::vector<User> users;
  auto check = [&]() {
    std::map<int32_t, int32_t> refs;
    for (const User& user : users) {
      std::set<int32_t> distinct(user.blocks.begin(), user.blocks.end());
      ASSERT_EQ(distinct.size(), user.blocks.size());
      for (int32_t block : user.blocks) ++refs[block];
    }
    const std::vector<int32_t> free_list = manager.FreeListForTesting();
    std::set<int32_t> in_free_list(free_list.begin(), free_list.end());
    ASSERT_EQ(in_free_list.size(), free_list.size()) << "a block twice in the free list";
    int64_t free_blocks = 0;
    for (int32_t block = 0; block < kNumBlocks; ++block) {
      const int32_t expected = refs.contains(block) ? refs[block] : 0;
      ASSERT_EQ(manager.ref_count(block), expected) << "block " << block;
      if (expected == 0) ++free_blocks;
      if (in_free_list.contains(block)) {
        ASSERT_EQ(expected, 0) << "block " << block << " is in use and in the free list";
      }
    }
    ASSERT_EQ(manager.num_free(), free_blocks);
  };
  auto admit = [&](User& user) {
    // The prefix this user can take from the cache, then fresh blocks up to its length.
    const int64_t want = 1 + static_cast<int64_t>(rng() % 5);
    const std::vector<BlockHash> chain(
        user.chain.begin(), user.chain.begin() + std::min<int64_t>(want, user.chain.size()));
    const BlockManager::PrefixMatch match = manager.MatchPrefix(chain, user.tokens, "");
    const int64_t needed = want - match.num_blocks + match.num_free_blocks;
    if (needed > manager.num_free()) return false;
    user.blocks = manager.TakeCachedPrefix(chain, match.num_blocks);
    absl::StatusOr<std::vector<int32_t>> fresh = manager.Allocate(want - match.num_blocks);
    EXPECT_TRUE(fresh.ok()) << fresh.status();
    if (!fresh.ok()) return false;
    for (size_t i = 0; i < fresh->size(); ++i) {
      const size_t index = static_cast<size_t>(match.num_blocks) + i;
      user.blocks.push_back((*fresh)[i]);
      // Full blocks get registered (the last one of a table stays partial, unshared).
      if (index + 1 < static_cast<size_t>(want) && index < user.chain.size()) {
        manager.RegisterBlock(
            (*fresh)[i], user.chain[index],
            absl::MakeConstSpan(user.tokens).subspan(index * kBlockSize, kBlockSize),
            index == 0 ? BlockManager::kNoParent : user.blocks[index - 1], "");
      }
    }
    return true;
  };
  auto release = [&](User& user) {
    std::vector<int32_t> tail_first(user.blocks.rbegin(), user.blocks.rend());
    ASSERT_TRUE(manager.Free(tail_first).ok());
    user.blocks.clear();
  };
  int64_t reused = 0;
  for (int op = 0; op < 5000; ++op) {
    const uint32_t kind = rng() % 4;
    if (kind == 0 || users.empty()) {
      User user;
      const uint64_t family = 100 * (rng() % 3);  // three families of prefixes
      user.chain = Chain(6, family);
      user.tokens = Tokens(6, family);
      const int64_t before = manager.MatchPrefix(user.chain, user.tokens, "").num_blocks;
      if (admit(user)) {
        reused += std::min<int64_t>(before, static_cast<int64_t>(user.blocks.size()));
        users.push_back(std::move(user));
      }
    } else if (kind == 1) {  // append a block
      User& user = users[rng() % users.size()];
      absl::StatusOr<std::vector<int32_t>> more = manager.Allocate(1);
      if (more.ok()) user.blocks.push_back((*more)[0]);
    } else if (kind == 2) {  // finish
      const size_t index = rng() % users.size();
      release(users[index]);
      users.erase(users.begin() + static_cast<ptrdiff_t>(index));
    } else {  // preempt and re-admit
      const size_t index = rng() % users.size();
      release(users[index]);
      if (!admit(users[index])) users.erase(users.begin() + static_cast<ptrdiff_t>(index));
    }
    check();
    if (HasFatalFailure()) return;
  }
  for (User& user : users) release(user);
  users.clear();
  check();
  EXPECT_EQ(manager.num_free(), kNumBlocks);
  EXPECT_GT(reused, 0);
}

// Blocks a worker still holds, as a new coordinator adopts them: chain `first` of
// `count` blocks in `blocks`, parents first.
std::vector<AdoptedBlock> Adopted(const std::vector<int32_t>& blocks, uint64_t first = 0,
                                  std::string_view salt = "") {
  const int count = static_cast<int>(blocks.size());
  const std::vector<BlockHash> hashes = Chain(count, first, salt);
  const std::vector<int32_t> tokens = Tokens(count, first);
  std::vector<AdoptedBlock> adopted;
  for (int i = 0; i < count; ++i) {
    AdoptedBlock& block = adopted.emplace_back();
    block.block = blocks[static_cast<size_t>(i)];
    block.parent_block = i == 0 ? BlockManager::kNoParent : blocks[static_cast<size_t>(i - 1)];
    block.hash = hashes[static_cast<size_t>(i)];
    block.tokens.assign(tokens.begin() + i * kBlockSize, tokens.begin() + (i + 1) * kBlockSize);
    if (i == 0) block.salt = std::string(salt);
  }
  return adopted;
}

TEST(BlockManagerTest, AdoptedBlocksAreCachedFreeAndHandedOutLast) {
  BlockManager manager(8, kBlockSize);
  manager.set_record_events(true);
  std::vector<AdoptedBlock> adopted = Adopted({6, 2, 5});
  const std::vector<AdoptedBlock> salted = Adopted({3}, 0, "tenant");
  adopted.insert(adopted.end(), salted.begin(), salted.end());
  EXPECT_EQ(manager.AdoptCachedBlocks(adopted), 4);
  EXPECT_EQ(manager.num_free(), 8);
  EXPECT_EQ(manager.num_cached(), 4);
  EXPECT_EQ(manager.TakeEvents().size(), 4u);
  const BlockManager::PrefixMatch match = Match(manager, 3);
  EXPECT_EQ(match.num_blocks, 3);
  EXPECT_EQ(match.num_free_blocks, 3);
  EXPECT_THAT(manager.TakeCachedPrefix(Chain(3), 3), ElementsAre(6, 2, 5));
  // The salt stays part of the key: the unsalted chain's first block is not tenant's.
  EXPECT_EQ(Match(manager, 1, 0, "tenant").num_blocks, 1);
  EXPECT_EQ(Match(manager, 1, 0, "other").num_blocks, 0);
  // The unadopted blocks go first, lowest id first; the adopted ones after, the first
  // listed (the worker's most recently used) last.
  EXPECT_THAT(manager.FreeListForTesting(), ElementsAre(0, 1, 4, 7, 3));
  absl::StatusOr<std::vector<int32_t>> taken = manager.Allocate(4);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(*taken, ElementsAre(0, 1, 4, 7));
  EXPECT_EQ(manager.num_cached(), 4);
}

TEST(BlockManagerTest, ASecondCopyOfAdoptedContentStaysUncachedButParentsItsChildren) {
  BlockManager manager(8, kBlockSize);
  std::vector<AdoptedBlock> adopted = Adopted({1, 2});
  // Block 5 holds block 1's content again; block 6 was computed after it with tokens 7, 7.
  AdoptedBlock copy = adopted[0];
  copy.block = 5;
  AdoptedBlock child;
  child.block = 6;
  child.parent_block = 5;
  child.tokens = {7, 7};
  child.hash = HashBlock(adopted[0].hash, child.tokens);
  adopted.push_back(copy);
  adopted.push_back(child);
  EXPECT_EQ(manager.AdoptCachedBlocks(adopted), 3);
  EXPECT_FALSE(manager.is_cached(5));
  EXPECT_TRUE(manager.is_cached(6));
  const std::vector<BlockHash> hashes = {adopted[0].hash, child.hash};
  EXPECT_EQ(manager.MatchPrefix(hashes, {0, 0, 7, 7}, "").num_blocks, 2);
  EXPECT_THAT(manager.TakeCachedPrefix(hashes, 2), ElementsAre(1, 6));
}

TEST(BlockManagerTest, AdoptionSkipsWhatItCannotTrustAndOnlyAFreshPoolAdopts) {
  BlockManager manager(8, kBlockSize);
  std::vector<AdoptedBlock> adopted = Adopted({1, 2, 3});
  // Out of range, twice, a child before its parent, a wrong length, a hash held already.
  AdoptedBlock out_of_range = adopted[0];
  out_of_range.block = 8;
  AdoptedBlock twice = adopted[0];
  AdoptedBlock orphan = Adopted({4, 5}, 9)[1];
  AdoptedBlock short_block = Adopted({6}, 20)[0];
  short_block.tokens.pop_back();
  AdoptedBlock same_hash = adopted[0];
  same_hash.block = 7;
  adopted.insert(adopted.begin() + 1, {out_of_range, twice, orphan, short_block, same_hash});
  EXPECT_EQ(manager.AdoptCachedBlocks(adopted), 3);
  EXPECT_EQ(Match(manager, 3).num_blocks, 3);
  EXPECT_FALSE(manager.is_cached(7));
  EXPECT_FALSE(manager.is_cached(5));
  EXPECT_FALSE(manager.is_cached(6));
  // A pool already in use adopts nothing.
  BlockManager used(8, kBlockSize);
  ASSERT_TRUE(used.Allocate(1).ok());
  EXPECT_EQ(used.AdoptCachedBlocks(Adopted({1, 2})), 0);
  EXPECT_EQ(used.num_cached(), 0);
}

}  // namespace
}  // namespace loom::engine
