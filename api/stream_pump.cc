#include "api/stream_pump.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <utility>

namespace loom::api {

namespace {

// A one-off task as a stream.
class Task final : public StreamPump::Stream {
 public:
  explicit Task(std::function<void()> task) : task_(std::move(task)) {}
  void Pump() override { task_(); }

 private:
  std::function<void()> task_;
};

}  // namespace

StreamPump::StreamPump(absl::Duration tick, int threads)
    : tick_(tick > absl::ZeroDuration() ? tick : absl::Nanoseconds(1)),
      num_threads_(static_cast<size_t>(std::max(1, threads))) {
  threads_.reserve(num_threads_);
  for (size_t i = 0; i < num_threads_; ++i) threads_.emplace_back([this] { Run(); });
}

StreamPump::~StreamPump() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void StreamPump::Wake(std::shared_ptr<Stream> stream) {
  absl::MutexLock lock(&mu_);
  ready_.push_back(std::move(stream));
}

void StreamPump::Post(std::function<void()> task) { Wake(std::make_shared<Task>(std::move(task))); }

void StreamPump::WakeAt(std::shared_ptr<Stream> stream, absl::Time when) {
  // Round up to the tick (on the Unix clock): due times a fraction of a tick apart share
  // one wakeup.
  const absl::Duration since_epoch = when - absl::UnixEpoch();
  const absl::Duration rounded = absl::Ceil(since_epoch, tick_);
  absl::MutexLock lock(&mu_);
  timers_.push(Timer{absl::UnixEpoch() + rounded, next_order_++, std::move(stream)});
}

void StreamPump::Run() {
  std::deque<std::shared_ptr<Stream>> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time wait_until = timers_.empty() ? absl::InfiniteFuture() : timers_.top().when;
      // A timer added during the wait that is due sooner ends it too.
      auto work = [this, wait_until]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !ready_.empty() ||
               (!timers_.empty() && timers_.top().when < wait_until);
      };
      mu_.AwaitWithDeadline(absl::Condition(&work), wait_until);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      while (!timers_.empty() && timers_.top().when <= now) {
        ready_.push_back(timers_.top().stream);
        timers_.pop();
      }
      // One thread takes everything ready; of several, each takes one at a time (a long
      // step must not hold back the ones queued behind it while another thread idles).
      if (num_threads_ == 1) {
        batch.swap(ready_);
      } else if (!ready_.empty()) {
        batch.push_back(std::move(ready_.front()));
        ready_.pop_front();
      }
    }
    for (const std::shared_ptr<Stream>& stream : batch) stream->Pump();
    batch.clear();  // outside the lock: this may be a stream's last reference
  }
}

}  // namespace loom::api
