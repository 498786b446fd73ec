#include "coordinator/block_manager.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BlockManagerTest, HandsOutNeverUsedBlocksLowestIdFirst) {
  BlockManager manager(8);
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
  BlockManager manager(4);
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
  BlockManager manager(3);
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
  BlockManager manager(4);
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
  BlockManager manager(2);
  absl::StatusOr<std::vector<int32_t>> none = manager.Allocate(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(manager.Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.num_free(), 2);
}

TEST(BlockManagerTest, SharedBlockIsFreedOnlyWhenItsLastReferenceDrops) {
  BlockManager manager(4);
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
  BlockManager manager(4);
  ASSERT_TRUE(manager.Allocate(1).ok());  // 0
  EXPECT_EQ(manager.AddReference({0, 2}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager.ref_count(0), 1);
  EXPECT_EQ(manager.AddReference({0, 4}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager.AddReference({-1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager.ref_count(0), 1);
  EXPECT_EQ(manager.num_free(), 3);
}

TEST(BlockManagerTest, FreeOfAFreeBlockFailsAfterReleasingTheOnesBeforeIt) {
  BlockManager manager(4);
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
  BlockManager manager(4);
  EXPECT_DOUBLE_EQ(manager.usage(), 0.0);
  ASSERT_TRUE(manager.Allocate(1).ok());
  EXPECT_DOUBLE_EQ(manager.usage(), 0.25);
  ASSERT_TRUE(manager.Allocate(3).ok());
  EXPECT_DOUBLE_EQ(manager.usage(), 1.0);
  BlockManager empty(0);
  EXPECT_DOUBLE_EQ(empty.usage(), 0.0);
  EXPECT_EQ(empty.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace loom::coordinator
