#include "coordinator/kv_index.h"

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::ElementsAre;

std::vector<engine::BlockHash> Chain(int count, int32_t first = 0) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < count * 4; ++i) tokens.push_back(first + i);
  return engine::HashFullBlocks(engine::PrefixHashSeed("m", ""), tokens, 4);
}

std::vector<engine::KvCacheEvent> Stored(const std::vector<engine::BlockHash>& hashes) {
  std::vector<engine::KvCacheEvent> events;
  for (const engine::BlockHash& hash : hashes)
    events.push_back({engine::KvCacheEvent::Kind::kStored, hash});
  return events;
}

TEST(KvIndexTest, MatchesEachReplicasLongestCachedPrefix) {
  KvIndex index;
  const std::vector<engine::BlockHash> chain = Chain(4);
  index.Apply("a", Stored({chain[0], chain[1], chain[2], chain[3]}));
  index.Apply("b", Stored({chain[0], chain[2]}));  // chain[1] missing: the prefix ends at 1
  EXPECT_THAT(index.MatchPrefix(chain, std::vector<std::string>{"a", "b", "c"}),
              ElementsAre(4, 1, 0));
  EXPECT_THAT(index.MatchPrefix(Chain(2, 1000), std::vector<std::string>{"a", "b"}),
              ElementsAre(0, 0));
  EXPECT_EQ(index.NumBlocks("a"), 4);
  EXPECT_EQ(index.NumBlocks("b"), 2);
}

TEST(KvIndexTest, RemovedBlocksAndLostReplicasStopMatching) {
  KvIndex index;
  const std::vector<engine::BlockHash> chain = Chain(3);
  index.Apply("a", Stored(chain));
  index.Apply("b", Stored(chain));
  index.Apply("a",
              std::vector<engine::KvCacheEvent>{{engine::KvCacheEvent::Kind::kRemoved, chain[1]}});
  EXPECT_THAT(index.MatchPrefix(chain, std::vector<std::string>{"a", "b"}), ElementsAre(1, 3));
  // Removing what a replica does not hold, or storing twice, changes nothing.
  index.Apply("a",
              std::vector<engine::KvCacheEvent>{{engine::KvCacheEvent::Kind::kRemoved, chain[1]},
                                                {engine::KvCacheEvent::Kind::kStored, chain[0]}});
  EXPECT_EQ(index.NumBlocks("a"), 2);
  index.RemoveReplica("b");
  EXPECT_THAT(index.MatchPrefix(chain, std::vector<std::string>{"a", "b"}), ElementsAre(1, 0));
  EXPECT_EQ(index.NumBlocks("b"), 0);
}

TEST(KvIndexTest, ConcurrentPublishersAndReadersAgreeAtTheEnd) {
  KvIndex index;
  const std::vector<engine::BlockHash> chain = Chain(64);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      const std::string id = "replica-" + std::to_string(r);
      for (int round = 0; round < 200; ++round) {
        index.Apply(id, Stored(chain));
        std::vector<engine::KvCacheEvent> removed;
        for (const engine::BlockHash& hash : chain)
          removed.push_back({engine::KvCacheEvent::Kind::kRemoved, hash});
        index.Apply(id, removed);
      }
      index.Apply(id, Stored(chain));
    });
  }
  threads.emplace_back([&] {
    for (int round = 0; round < 500; ++round) {
      index.MatchPrefix(chain, std::vector<std::string>{"replica-0", "replica-3"});
    }
  });
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(index.MatchPrefix(chain, std::vector<std::string>{"replica-0", "replica-1",
                                                                "replica-2", "replica-3"}),
              ElementsAre(64, 64, 64, 64));
}

}  // namespace
}  // namespace loom::coordinator
