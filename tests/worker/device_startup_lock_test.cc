#include "worker/device_startup_lock.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

std::string TempDir() {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("device_startup_lock_test." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(DeviceStartupLockTest, ASecondWorkerOnTheGpuWaitsUntilTheFirstReleases) {
  const std::string dir = TempDir();
  auto first = DeviceStartupLock::Acquire("0000:17:00.0", absl::Minutes(1), dir);
  ASSERT_TRUE(first->held());
  EXPECT_EQ(first->path(), dir + "/loom-gpu-0000_17_00.0.lock");
  // Another process's lock (flock locks are per open file: a second open in this process
  // conflicts the same way).
  std::atomic<bool> acquired{false};
  std::thread second([&] {
    auto lock = DeviceStartupLock::Acquire("0000:17:00.0", absl::Minutes(1), dir);
    EXPECT_TRUE(lock->held());
    acquired = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(acquired.load());
  first.reset();  // the first worker's pool is allocated
  second.join();
  EXPECT_TRUE(acquired.load());
  // Another GPU does not wait.
  auto other = DeviceStartupLock::Acquire("0000:18:00.0", absl::Seconds(1), dir);
  auto again = DeviceStartupLock::Acquire("0000:17:00.0", absl::Seconds(1), dir);
  EXPECT_TRUE(other->held());
  EXPECT_TRUE(again->held());
}

TEST(DeviceStartupLockTest, AWedgedPeerDelaysStartUpByTheTimeoutOnly) {
  const std::string dir = TempDir();
  auto wedged = DeviceStartupLock::Acquire("1", absl::Seconds(1), dir);
  ASSERT_TRUE(wedged->held());
  auto late = DeviceStartupLock::Acquire("1", absl::Milliseconds(200), dir);
  EXPECT_FALSE(late->held());
  auto nowhere = DeviceStartupLock::Acquire("1", absl::Seconds(1), dir + "/missing/dir");
  EXPECT_FALSE(nowhere->held());
}

}  // namespace
}  // namespace loom::worker
