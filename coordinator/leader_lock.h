#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/leader_election.h"

namespace loom::coordinator {

/// Leader election among coordinators that share a lock file (`loom serve --leader-lock
/// PATH`): the one that holds an exclusive flock(2) on PATH leads; the others follow and
/// try for it every `poll` interval. The kernel releases the lock when its holder exits
/// or dies (a crash, SIGKILL), so a follower takes over within one interval. The leader
/// writes its advertised gRPC address into the file, where followers read it to redirect
/// workers. PATH must be on storage every coordinator sees with working locks (one
/// machine's disk, a shared volume); on Kubernetes a Lease is the equivalent (not built
/// yet). Thread-safe.
class LeaderLock final : public LeaderElection {
 public:
  /// Opens (creating) `path`. `advertise` is this coordinator's gRPC address for workers.
  static absl::StatusOr<std::unique_ptr<LeaderLock>> Open(
      const std::string& path, std::string advertise,
      absl::Duration poll = absl::Milliseconds(100));
  ~LeaderLock() override;  // stops trying; a leader's lock goes with its descriptor

  /// Tries for the lock every `poll`; `on_elected` runs on that thread.
  void Start(std::function<void()> on_elected) override;
  bool leading() const override { return leading_.load(std::memory_order_acquire); }
  /// Empties the file (no one is sent here), then releases the lock.
  void Resign() override;
  /// What the file says.
  std::string LeaderAddress() const override;
  std::string Describe() const override { return "--leader-lock " + path_; }

 private:
  LeaderLock(std::string path, std::string advertise, int fd, absl::Duration poll);
  void Run(std::function<void()> on_elected);

  const std::string path_;
  const std::string advertise_;
  const int fd_;
  const absl::Duration poll_;
  std::atomic<bool> leading_{false};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace loom::coordinator
