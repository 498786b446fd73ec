#pragma once

#include <cstdint>
#include <memory>
#include <queue>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom::api {

/// One thread that runs the next step of many output streams when they become ready:
/// at once (Wake, from a producer that queued output) or at a time (WakeAt, when a
/// stream's flush interval ends). Wake times are rounded up to `tick`, so the streams due
/// at about the same time are served in one wakeup instead of one thread switch each.
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

  explicit StreamPump(absl::Duration tick = absl::Milliseconds(1));
  ~StreamPump();  // runs nothing more (pending wakeups are dropped) and joins

  /// Runs `stream->Pump()` on the pump thread soon. Cheap; callable under other locks
  /// (it takes only the pump's own).
  void Wake(std::shared_ptr<Stream> stream);
  /// Runs `stream->Pump()` on the pump thread at `when` (rounded up to the tick).
  void WakeAt(std::shared_ptr<Stream> stream, absl::Time when);

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
  std::vector<std::shared_ptr<Stream>> ready_ ABSL_GUARDED_BY(mu_);
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time wait_until_ ABSL_GUARDED_BY(mu_);  // the earliest timer when the wait began
  std::thread thread_;
};

}  // namespace loom::api
