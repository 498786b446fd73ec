#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <queue>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom::api {

/// A fixed set of threads (one by default) that runs the next step of many output streams
/// when they become ready: at once (Wake, from a producer that queued output) or at a
/// time (WakeAt, when a stream's flush interval ends), and one-off tasks (Post). Wake
/// times are rounded up to `tick`, so the streams due at about the same time are served in
/// one wakeup instead of one thread switch each. With several threads, each takes one ready
/// stream at a time, and one stream's Pump may run on two of them at once if it was woken
/// twice: a stream guards its own state.
/// Thread-safe.
class StreamPump {
 public:
  /// A stream the pump drives.
  class Stream {
   public:
    virtual ~Stream() = default;
    /// Does whatever the stream can do now without blocking (pump thread).
    virtual void Pump() = 0;
  };

  explicit StreamPump(absl::Duration tick = absl::Milliseconds(1), int threads = 1);
  ~StreamPump();  // runs nothing more (pending wakeups are dropped) and joins

  /// Runs `stream->Pump()` on the pump thread soon. Cheap; callable under other locks
  /// (it takes only the pump's own).
  void Wake(std::shared_ptr<Stream> stream);
  /// Runs `stream->Pump()` on the pump thread at `when` (rounded up to the tick).
  void WakeAt(std::shared_ptr<Stream> stream, absl::Time when);
  /// Runs `task` once on a pump thread soon.
  void Post(std::function<void()> task);

 private:
  struct Timer {
    absl::Time when;
    uint64_t order;  // FIFO among equal times
    std::shared_ptr<Stream> stream;
    bool operator>(const Timer& other) const {
      return when != other.when ? when > other.when : order > other.order;
    }
  };

  void Run();

  const absl::Duration tick_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::shared_ptr<Stream>> ready_ ABSL_GUARDED_BY(mu_);
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  const size_t num_threads_;
  std::vector<std::thread> threads_;
};

}  // namespace loom::api
