#include "api/stream_pump.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom::api {
namespace {

// Records when and on which thread the pump ran it.
class RecordingStream : public StreamPump::Stream {
 public:
  void Pump() override {
    absl::MutexLock lock(&mu_);
    times_.push_back(absl::Now());
    thread_ = std::this_thread::get_id();
  }
  bool WaitForPumps(size_t count, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return times_.size() >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::vector<absl::Time> times() {
    absl::MutexLock lock(&mu_);
    return times_;
  }
  std::thread::id thread() {
    absl::MutexLock lock(&mu_);
    return thread_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Time> times_ ABSL_GUARDED_BY(mu_);
  std::thread::id thread_ ABSL_GUARDED_BY(mu_);
};

TEST(StreamPumpTest, WakeRunsTheStreamOnThePumpThread) {
  StreamPump pump;
  auto stream = std::make_shared<RecordingStream>();
  pump.Wake(stream);
  ASSERT_TRUE(stream->WaitForPumps(1, absl::Seconds(10)));
  EXPECT_NE(stream->thread(), std::this_thread::get_id());
}

TEST(StreamPumpTest, WakeAtRunsNoEarlierThanAsked) {
  StreamPump pump(absl::Milliseconds(1));
  auto stream = std::make_shared<RecordingStream>();
  const absl::Time when = absl::Now() + absl::Milliseconds(60);
  pump.WakeAt(stream, when);
  ASSERT_TRUE(stream->WaitForPumps(1, absl::Seconds(10)));
  EXPECT_GE(stream->times()[0], when);
}

TEST(StreamPumpTest, AnEarlierTimerAddedWhileThePumpWaitsForALaterOneRunsFirst) {
  StreamPump pump(absl::Milliseconds(1));
  auto late = std::make_shared<RecordingStream>();
  auto soon = std::make_shared<RecordingStream>();
  pump.WakeAt(late, absl::Now() + absl::Seconds(30));
  absl::SleepFor(absl::Milliseconds(20));  // the pump now waits for the 30 s timer
  const absl::Time start = absl::Now();
  pump.WakeAt(soon, start + absl::Milliseconds(20));
  ASSERT_TRUE(soon->WaitForPumps(1, absl::Seconds(10)));
  EXPECT_LT(soon->times()[0] - start, absl::Seconds(5));
  EXPECT_TRUE(late->times().empty());
}

TEST(StreamPumpTest, TimersDueWithinOneTickShareAWakeup) {
  StreamPump pump(absl::Milliseconds(50));
  std::vector<std::shared_ptr<RecordingStream>> streams;
  // Just past a 50 ms boundary of the Unix clock, where the pump rounds: a spread that
  // straddled one (1 time in 50 from an arbitrary start) would split the wakeups.
  const absl::Time base = absl::UnixEpoch() +
                          absl::Ceil(absl::Now() - absl::UnixEpoch() + absl::Milliseconds(100),
                                     absl::Milliseconds(50)) +
                          absl::Milliseconds(1);
  for (int i = 0; i < 8; ++i) {
    streams.push_back(std::make_shared<RecordingStream>());
    // Spread over 1 ms: all round up to the same 50 ms boundary.
    pump.WakeAt(streams.back(), base + absl::Microseconds(125 * i));
  }
  for (auto& stream : streams) ASSERT_TRUE(stream->WaitForPumps(1, absl::Seconds(10)));
  // Rounded up, never early: every one ran at or after the latest due time.
  for (auto& stream : streams) EXPECT_GE(stream->times()[0], base + absl::Microseconds(875));
}

TEST(StreamPumpTest, DestructionDropsPendingTimersAndReleasesTheStreams) {
  auto stream = std::make_shared<RecordingStream>();
  {
    StreamPump pump;
    pump.WakeAt(stream, absl::Now() + absl::Hours(1));
    EXPECT_EQ(stream.use_count(), 2);
  }
  EXPECT_EQ(stream.use_count(), 1);
  EXPECT_TRUE(stream->times().empty());
}

TEST(StreamPumpTest, SeveralThreadsShareTheReadyStreamsAndRunPostedTasks) {
  constexpr int kThreads = 3;
  auto pump = std::make_unique<StreamPump>(absl::Milliseconds(1), kThreads);
  // Each task blocks until all of them run at once: only distinct threads get there.
  absl::Mutex mu;
  int running = 0;
  std::atomic<int> met{0};
  for (int i = 0; i < kThreads; ++i) {
    pump->Post([&] {
      absl::MutexLock lock(&mu);
      ++running;
      auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return running == kThreads; };
      if (mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(30))) met.fetch_add(1);
    });
  }
  // Queued behind the tasks: runs once a thread is free.
  auto stream = std::make_shared<RecordingStream>();
  pump->Wake(stream);
  ASSERT_TRUE(stream->WaitForPumps(1, absl::Seconds(60)));
  pump.reset();  // joins: every task has returned
  EXPECT_EQ(met.load(), kThreads);
}

}  // namespace
}  // namespace loom::api
