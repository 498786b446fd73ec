#include "coordinator/leader_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "absl/time/clock.h"

namespace loom::coordinator {
namespace {

std::string LockPath() {
  return (std::filesystem::temp_directory_path() /
          ("leader_lock_test." + std::to_string(::getpid()) + ".lock"))
      .string();
}

bool WaitFor(const std::atomic<bool>& flag, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!flag.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return flag.load();
}

TEST(LeaderLockTest, OneLeadsTheOtherFollowsAndTakesOverWhenItGoes) {
  const std::string path = LockPath();
  auto first = LeaderLock::Open(path, "10.0.0.1:50051", absl::Milliseconds(10));
  auto second = LeaderLock::Open(path, "10.0.0.2:50051", absl::Milliseconds(10));
  ASSERT_TRUE(first.ok() && second.ok());
  std::atomic<bool> first_elected{false}, second_elected{false};
  (*first)->Start([&] { first_elected = true; });
  ASSERT_TRUE(WaitFor(first_elected, absl::Seconds(30)));
  EXPECT_TRUE((*first)->leading());
  (*second)->Start([&] { second_elected = true; });
  absl::SleepFor(absl::Milliseconds(100));  // ten tries
  EXPECT_FALSE(second_elected.load());
  EXPECT_FALSE((*second)->leading());
  EXPECT_EQ((*second)->LeaderAddress(), "10.0.0.1:50051");

  first->reset();  // the leader goes: its descriptor, and with it the lock
  ASSERT_TRUE(WaitFor(second_elected, absl::Seconds(30)));
  EXPECT_TRUE((*second)->leading());
  EXPECT_EQ((*second)->LeaderAddress(), "10.0.0.2:50051");
  second->reset();
  std::filesystem::remove(path);
}

TEST(LeaderLockTest, AResigningLeaderNamesNoOneUntilTheNextTakesOver) {
  const std::string path = LockPath() + ".resign";
  auto first = LeaderLock::Open(path, "10.0.0.1:50051", absl::Milliseconds(10));
  ASSERT_TRUE(first.ok());
  std::atomic<bool> first_elected{false}, second_elected{false};
  (*first)->Start([&] { first_elected = true; });
  ASSERT_TRUE(WaitFor(first_elected, absl::Seconds(30)));
  (*first)->Resign();  // still open: the process goes on (draining) without leading
  EXPECT_FALSE((*first)->leading());
  EXPECT_EQ((*first)->LeaderAddress(), "");  // no one is sent to it any more
  auto second = LeaderLock::Open(path, "10.0.0.2:50051", absl::Milliseconds(10));
  ASSERT_TRUE(second.ok());
  (*second)->Start([&] { second_elected = true; });
  ASSERT_TRUE(WaitFor(second_elected, absl::Seconds(30)));
  EXPECT_EQ((*first)->LeaderAddress(), "10.0.0.2:50051");
  (*first)->Resign();  // idempotent; and a follower's resignation changes nothing
  EXPECT_TRUE((*second)->leading());
  first->reset();
  second->reset();
  std::filesystem::remove(path);
}

TEST(LeaderLockTest, AnUnopenableLockIsAnErrorNamingTheFlag) {
  auto lock = LeaderLock::Open("/nonexistent-dir/leader.lock", "a:1");
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(lock.status().message().find("--leader-lock"), std::string::npos);
}

}  // namespace
}  // namespace loom::coordinator
