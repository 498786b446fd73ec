#include "engine/host_kv_tier.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

constexpr int32_t kBlockSize = 4;

// A block content as the pool evicts it: tokens [first, first + 4), named `content_id`,
// computed after `parent_id`.
struct Content {
  BlockHash hash;
  std::vector<int32_t> tokens;
  uint64_t content_id;
  uint64_t parent_id;
  std::string salt;
  EvictedBlock Evicted(int32_t block) const {
    return EvictedBlock{block, hash, tokens, content_id, parent_id, salt};
  }
};

Content MakeContent(uint64_t n, uint64_t parent_id = 0) {
  Content content{BlockHash{n, n * 7}, std::vector<int32_t>(kBlockSize), n, parent_id, ""};
  std::iota(content.tokens.begin(), content.tokens.end(), static_cast<int32_t>(100 * n));
  return content;
}

TEST(HostKvTierTest, DemotesIntoFreeSlotsThenTheLeastRecentlyUsed) {
  HostKvTier tier(2, kBlockSize);
  const Content a = MakeContent(1), b = MakeContent(2), c = MakeContent(3);
  tier.Demote(a.Evicted(10));
  tier.Demote(b.Evicted(11));
  std::vector<KvCopy> copies = tier.TakeCopies();
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_TRUE(copies[0].to_host);
  EXPECT_EQ(copies[0].device_block, 10);
  EXPECT_EQ(copies[1].device_block, 11);
  EXPECT_NE(copies[0].host_slot, copies[1].host_slot);

  // a is used (found and reloaded), so b is the least recently used when c arrives.
  std::optional<HostKvTier::Hit> hit = tier.Find(a.hash, a.tokens, 0, "");
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->content_id, 1u);
  const HostKvTier::Content reloaded = tier.Promote(hit->slot, 20);
  EXPECT_EQ(reloaded.tokens, absl::MakeConstSpan(a.tokens));
  tier.Demote(c.Evicted(12));
  copies = tier.TakeCopies();
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_FALSE(copies[0].to_host);
  EXPECT_EQ(copies[0].device_block, 20);
  EXPECT_TRUE(copies[1].to_host);
  EXPECT_EQ(copies[1].host_slot, 1 - hit->slot);  // b's slot
  EXPECT_FALSE(tier.Find(b.hash, b.tokens, 0, "").has_value());
  EXPECT_TRUE(tier.Find(c.hash, c.tokens, 0, "").has_value());
  EXPECT_EQ(tier.num_used(), 2);
}

TEST(HostKvTierTest, AReservationNamesTheLatestPlanWhoseCopiesTouchItsSlots) {
  HostKvTier tier(3, kBlockSize);
  tier.Demote(MakeContent(1).Evicted(10));  // slot 0, its copy queued for plan 1
  uint64_t last_copy_plan = 99;
  std::vector<int32_t> slots = tier.Reserve(2, &last_copy_plan);  // the two never used
  EXPECT_EQ(slots.size(), 2u);
  EXPECT_EQ(last_copy_plan, 0u);
  tier.FreeReserved(slots[0]);
  slots = tier.Reserve(1, &last_copy_plan);  // the one a failed import freed
  EXPECT_EQ(last_copy_plan, 0u);
  slots = tier.Reserve(1, &last_copy_plan);  // slot 0: its content dropped, its copy queued
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0], 0);
  EXPECT_EQ(last_copy_plan, 1u);
  EXPECT_EQ(tier.copy_plans_taken(), 0u);
  EXPECT_EQ(tier.TakeCopies().size(), 1u);  // plan 1 carries it
  EXPECT_EQ(tier.copy_plans_taken(), 1u);

  // A content copied in plan 2 and reloaded in plan 3, evicted after plan 5 was built:
  // only plans up to 3 may still touch its slot.
  HostKvTier lru(1, kBlockSize);
  const Content a = MakeContent(2);
  lru.TakeCopies();
  lru.Demote(a.Evicted(4));
  lru.TakeCopies();
  lru.Promote(lru.Find(a.hash, a.tokens, 0, "")->slot, 6);
  for (int plan = 3; plan <= 5; ++plan) lru.TakeCopies();
  slots = lru.Reserve(1, &last_copy_plan);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(last_copy_plan, 3u);
  EXPECT_EQ(lru.copy_plans_taken(), 5u);

  // A failed step forgets every content, but plans still in flight may copy: a slot copied
  // in plan 6 still names it after Forget.
  HostKvTier forgetful(1, kBlockSize);
  for (int plan = 1; plan <= 5; ++plan) forgetful.TakeCopies();
  forgetful.Demote(MakeContent(3).Evicted(2));
  forgetful.TakeCopies();
  forgetful.Forget();
  slots = forgetful.Reserve(1, &last_copy_plan);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(last_copy_plan, 6u);
}

TEST(HostKvTierTest, AReservedSlotLoadedIntoThePoolIsFreedAndItsCopyNamed) {
  // A hand-off's partial block pushed into a reserved slot: reloaded by plan 2, the slot
  // free at once and a reservation of it waits for plan 2.
  HostKvTier tier(1, kBlockSize);
  tier.TakeCopies();
  uint64_t last_copy_plan = 99;
  const std::vector<int32_t> slots = tier.Reserve(1, &last_copy_plan);
  ASSERT_EQ(slots.size(), 1u);
  tier.LoadReserved(slots[0], 5);
  EXPECT_FALSE(tier.reserved(slots[0]));
  EXPECT_EQ(tier.num_used(), 0);  // no hash names it
  const std::vector<KvCopy> copies = tier.TakeCopies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_FALSE(copies[0].to_host);
  EXPECT_EQ(copies[0].device_block, 5);
  EXPECT_EQ(copies[0].host_slot, slots[0]);
  EXPECT_EQ(tier.Reserve(1, &last_copy_plan), slots);
  EXPECT_EQ(last_copy_plan, 2u);
}

TEST(HostKvTierTest, SlotsReservedByNameInANewTableAreNotHandedOutUntilFreed) {
  // A new table over a lived-on worker's tier: slots 1 and 3 may still be written by a
  // transfer of the table before, so neither an offload nor a reservation gets them.
  HostKvTier tier(4, kBlockSize);
  const std::vector<int32_t> kept = {1, 3, 7};  // 7: past the tier (a smaller new worker)
  EXPECT_EQ(tier.ReserveSlots(kept), std::vector<int32_t>({1, 3}));
  EXPECT_EQ(tier.ReserveSlots(std::vector<int32_t>({3})), std::vector<int32_t>({3}));
  EXPECT_TRUE(tier.reserved(1));
  EXPECT_EQ(tier.num_held(), 2);
  EXPECT_EQ(tier.Demote(MakeContent(1).Evicted(10)), 0);
  EXPECT_EQ(tier.Reserve(1), std::vector<int32_t>({2}));   // 1 and 3 passed over
  EXPECT_EQ(tier.Reserve(1), std::vector<int32_t>({0}));   // the offload's content dropped
  EXPECT_EQ(tier.Demote(MakeContent(2).Evicted(11)), -1);  // every slot held
  // Only slots no scan passed are taken: these were passed.
  EXPECT_TRUE(tier.ReserveSlots(std::vector<int32_t>({0, 1, 2})).empty());
  tier.FreeReserved(1);  // behind the scan: free for the next taker
  tier.Release(3);
  EXPECT_TRUE(tier.reserved(3));  // two readers of one slot: held until both are done
  tier.Release(3);
  EXPECT_EQ(tier.num_held(), 2);
  std::vector<int32_t> next = tier.Reserve(2);
  std::sort(next.begin(), next.end());
  EXPECT_EQ(next, std::vector<int32_t>({1, 3}));
}

TEST(HostKvTierTest, HoldsOfTheTableBeforeAreClosedByTheFirstPlanBeforeAnySlotIsWritten) {
  HostKvTier tier(2, kBlockSize);
  const std::vector<uint64_t> earlier = {41, 42};
  tier.CloseEarlierHolds(earlier);
  EXPECT_EQ(std::vector<uint64_t>(tier.closed_holds().begin(), tier.closed_holds().end()), earlier);
  uint64_t last_copy_plan = 0;
  ASSERT_EQ(tier.Reserve(1, &last_copy_plan).size(), 1u);
  EXPECT_EQ(last_copy_plan, 1u);  // never used, but written only once plan 1 ran
  tier.TakeCopies();
  EXPECT_EQ(tier.TakeClosedHolds(), earlier);  // plan 1 closes them
  EXPECT_FALSE(tier.has_closed_holds());
  ASSERT_EQ(tier.Reserve(1, &last_copy_plan).size(), 1u);
  EXPECT_EQ(last_copy_plan, 1u);
}

TEST(HostKvTierTest, ContentItHoldsAlreadyIsNotCopiedAgain) {
  HostKvTier tier(4, kBlockSize);
  const Content a = MakeContent(1);
  tier.Demote(a.Evicted(3));
  tier.Promote(tier.Find(a.hash, a.tokens, 0, "")->slot, 5);
  EXPECT_EQ(tier.TakeCopies().size(), 2u);
  tier.Demote(a.Evicted(5));  // the reloaded copy is evicted again
  EXPECT_TRUE(tier.TakeCopies().empty());
  EXPECT_EQ(tier.num_demoted(), 1u);
}

TEST(HostKvTierTest, AHitIsVerifiedAgainstTokensParentAndSalt) {
  HostKvTier tier(4, kBlockSize);
  Content first = MakeContent(1);
  first.salt = "tenant";
  const Content second = MakeContent(2, /*parent_id=*/1);
  tier.Demote(first.Evicted(0));
  tier.Demote(second.Evicted(1));
  EXPECT_TRUE(tier.Find(first.hash, first.tokens, 0, "tenant").has_value());
  EXPECT_FALSE(tier.Find(first.hash, first.tokens, 0, "other").has_value());
  EXPECT_TRUE(tier.Find(second.hash, second.tokens, 1, "").has_value());
  EXPECT_FALSE(tier.Find(second.hash, second.tokens, 9, "").has_value());
  std::vector<int32_t> other = second.tokens;
  other[3] += 1;
  EXPECT_FALSE(tier.Find(second.hash, other, 1, "").has_value());
  EXPECT_EQ(tier.num_verification_failures(), 3u);
}

TEST(HostKvTierTest, HeldSlotsAreNotReusedUntilReleased) {
  HostKvTier tier(1, kBlockSize);
  const Content a = MakeContent(1), b = MakeContent(2);
  tier.Demote(a.Evicted(0));
  const int32_t slot = tier.Find(a.hash, a.tokens, 0, "")->slot;
  tier.Hold(slot);
  tier.Hold(slot);  // two readers: one slot held
  EXPECT_EQ(tier.num_held(), 1);
  tier.Demote(b.Evicted(1));  // the only slot is being read: b is dropped
  EXPECT_EQ(tier.num_dropped(), 1u);
  EXPECT_TRUE(tier.Find(a.hash, a.tokens, 0, "").has_value());
  tier.Release(slot);
  EXPECT_EQ(tier.num_held(), 1);
  tier.Release(slot);
  EXPECT_EQ(tier.num_held(), 0);
  tier.Demote(b.Evicted(1));
  EXPECT_TRUE(tier.Find(b.hash, b.tokens, 0, "").has_value());
  EXPECT_FALSE(tier.Find(a.hash, a.tokens, 0, "").has_value());
}

TEST(HostKvTierTest, ReservedSlotsCountAsHeldUntilStoredOrFreed) {
  HostKvTier tier(4, kBlockSize);
  const std::vector<int32_t> slots = tier.Reserve(3);
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(tier.num_held(), 3);
  EXPECT_TRUE(tier.StoreFetched(slots[0], MakeContent(1).Evicted(-1)));
  tier.FreeReserved(slots[1]);
  EXPECT_EQ(tier.num_held(), 1);
  tier.LoadReserved(slots[2], 0);
  EXPECT_EQ(tier.num_held(), 0);
  const std::vector<int32_t> more = tier.Reserve(2);
  tier.Forget();
  EXPECT_EQ(tier.num_held(), 2);  // reservations outlive a reset table
  for (const int32_t slot : more) tier.FreeReserved(slot);
  EXPECT_EQ(tier.num_held(), 0);
}

TEST(HostKvTierTest, AClosedHoldGoesToTheNextPlanAndFencesItsSlots) {
  HostKvTier tier(2, kBlockSize);
  tier.TakeCopies();  // plan 1
  const std::vector<int32_t> slots = tier.Reserve(2);
  for (const int32_t slot : slots) tier.FreeReserved(slot);
  EXPECT_FALSE(tier.has_closed_holds());
  tier.CloseHold(42, slots);
  EXPECT_TRUE(tier.has_closed_holds());
  tier.Forget();  // the workers' slots are the same memory: the hold still closes
  EXPECT_TRUE(tier.TakeCopies().empty());  // plan 2 carries it
  EXPECT_EQ(tier.TakeClosedHolds(), std::vector<uint64_t>{42});
  EXPECT_FALSE(tier.has_closed_holds());
  uint64_t last_copy_plan = 0;
  EXPECT_EQ(tier.Reserve(2, &last_copy_plan).size(), 2u);
  EXPECT_EQ(last_copy_plan, 2u);
}

TEST(HostKvTierTest, HeldSlotsStayHeldAcrossForgetUntilReleasedAndAreNeverHandedOutTwice) {
  // A failed step resets the table while another worker still reads an exported slot and
  // a fetch still writes a reserved one: neither slot is given to new content until its
  // holder lets it go, and then each slot is handed out once.
  HostKvTier tier(4, kBlockSize);
  const Content a = MakeContent(1);
  const int32_t exported = tier.Demote(a.Evicted(0));
  tier.Hold(exported);
  const std::vector<int32_t> reserved = tier.Reserve(1);
  ASSERT_EQ(reserved.size(), 1u);
  tier.Forget();
  EXPECT_EQ(tier.num_held(), 2);
  EXPECT_EQ(tier.num_used(), 0);
  EXPECT_TRUE(tier.reserved(reserved[0]));
  std::vector<int32_t> taken = tier.Reserve(4);
  ASSERT_EQ(taken.size(), 2u);  // only the two unheld slots
  for (const int32_t slot : taken) {
    EXPECT_NE(slot, exported);
    EXPECT_NE(slot, reserved[0]);
  }
  tier.Release(exported);
  tier.FreeReserved(reserved[0]);
  EXPECT_EQ(tier.num_held(), 2);  // the two just taken
  const std::vector<int32_t> rest = tier.Reserve(4);
  ASSERT_EQ(rest.size(), 2u);
  taken.insert(taken.end(), rest.begin(), rest.end());
  std::sort(taken.begin(), taken.end());
  EXPECT_EQ(taken, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(HostKvTierTest, ForgetDropsContentAndQueuedCopies) {
  HostKvTier tier(2, kBlockSize);
  const Content a = MakeContent(1);
  tier.Demote(a.Evicted(0));
  tier.Forget();
  EXPECT_TRUE(tier.TakeCopies().empty());
  EXPECT_EQ(tier.num_used(), 0);
  EXPECT_FALSE(tier.Find(a.hash, a.tokens, 0, "").has_value());
}

}  // namespace
}  // namespace loom::engine
