#include "worker/kv_pool_fence.h"

#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/shared_kv_mappings.h"

namespace loom::worker {
namespace {

TEST(KvPoolFence, ReadersOfTheMemoryFileSeeTheGenerationMove) {
  std::unique_ptr<KvPoolFence> fence = *KvPoolFence::Create();
  // As another process maps it: through /proc/PID/fd.
  absl::StatusOr<std::shared_ptr<const SharedKvMapping>> mapped =
      SharedKvMappings::Get().Map(getpid(), fence->fd(), sizeof(uint64_t));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const uint64_t before = ReadPoolGeneration((*mapped)->data());
  EXPECT_EQ(before, fence->generation());
  fence->NewStream();
  EXPECT_EQ(ReadPoolGeneration((*mapped)->data()), before + 1);
}

TEST(KvPoolFence, WritesRunOnlyForTheCurrentStream) {
  std::unique_ptr<KvPoolFence> fence = *KvPoolFence::Create();
  bool wrote = false;
  const absl::Status refused = fence->Write(
      0, [] { return false; },
      [&] {
        wrote = true;
        return absl::OkStatus();
      });
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(wrote);
  EXPECT_TRUE(fence
                  ->Write(
                      0, [] { return true; },
                      [&] {
                        wrote = true;
                        return absl::OkStatus();
                      })
                  .ok());
  EXPECT_TRUE(wrote);
  // A closed hold writes no more; others still do.
  fence->CloseHolds({5});
  wrote = false;
  EXPECT_EQ(fence
                ->Write(
                    5, [] { return true; },
                    [&] {
                      wrote = true;
                      return absl::OkStatus();
                    })
                .code(),
            absl::StatusCode::kAborted);
  EXPECT_FALSE(wrote);
  EXPECT_TRUE(fence
                  ->Write(
                      6, [] { return true; }, [] { return absl::OkStatus(); })
                  .ok());
}

TEST(KvPoolFence, ANewStreamWaitsForTheWriteUnderWay) {
  std::unique_ptr<KvPoolFence> fence = *KvPoolFence::Create();
  absl::Notification writing, release;
  std::atomic<bool> write_done{false};
  std::thread writer([&] {
    fence
        ->Write(
            0, [] { return true; },
            [&] {
              writing.Notify();
              release.WaitForNotification();
              write_done = true;
              return absl::OkStatus();
            })
        .IgnoreError();
  });
  writing.WaitForNotification();
  std::atomic<bool> fenced{false};
  std::thread stream([&] {
    fence->NewStream();
    fenced = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(fenced.load());  // the batch under way holds it back
  release.Notify();
  stream.join();
  writer.join();
  EXPECT_TRUE(write_done.load());
  EXPECT_TRUE(fenced.load());
}

}  // namespace
}  // namespace loom::worker
