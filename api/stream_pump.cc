#include "api/stream_pump.h"

#include <functional>
#include <utility>

namespace loom::api {

StreamPump::StreamPump(absl::Duration tick)
    : tick_(tick > absl::ZeroDuration() ? tick : absl::Nanoseconds(1)) {
  thread_ = std::thread([this] { Run(); });
}

StreamPump::~StreamPump() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void StreamPump::Wake(std::shared_ptr<Stream> stream) {
  absl::MutexLock lock(&mu_);
  ready_.push_back(std::move(stream));
}

void StreamPump::WakeAt(std::shared_ptr<Stream> stream, absl::Time when) {
  // Round up to the tick (on the Unix clock): due times a fraction of a tick apart share
  // one wakeup.
  const absl::Duration since_epoch = when - absl::UnixEpoch();
  const absl::Duration rounded = absl::Ceil(since_epoch, tick_);
  absl::MutexLock lock(&mu_);
  timers_.push(Timer{absl::UnixEpoch() + rounded, next_order_++, std::move(stream)});
}

void StreamPump::Run() {
  std::vector<std::shared_ptr<Stream>> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      wait_until_ = timers_.empty() ? absl::InfiniteFuture() : timers_.top().when;
      // A timer added during the wait that is due sooner ends it too.
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !ready_.empty() ||
               (!timers_.empty() && timers_.top().when < wait_until_);
      };
      mu_.AwaitWithDeadline(absl::Condition(&work), wait_until_);
      if (stopping_) return;
      batch.swap(ready_);
      const absl::Time now = absl::Now();
      while (!timers_.empty() && timers_.top().when <= now) {
        batch.push_back(timers_.top().stream);
        timers_.pop();
      }
    }
    for (const std::shared_ptr<Stream>& stream : batch) stream->Pump();
    batch.clear();  // outside the lock: this may be a stream's last reference
  }
}

}  // namespace loom::api
