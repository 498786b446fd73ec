#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"

namespace loom::worker {

/// Serializes the start-up of processes that share one GPU. A CUDA forward pass sizes its
/// KV pool from what it took itself since it began (free memory then, less free memory
/// now), and cudaMemGetInfo reports the whole device: a second worker loading meanwhile
/// would count the first one's pool as its own and get no room. Held from before the
/// first measurement until the pool is allocated, so each worker measures only itself.
///
/// An exclusive flock on `<dir>/loom-gpu-<key>.lock` (`key`: the device's PCI bus id, or
/// its index), released by the destructor or when the process dies. Acquire waits at
/// most `timeout`, then goes on without it (logged): a wedged peer must not keep a worker
/// from starting.
class DeviceStartupLock {
 public:
  /// `dir` empty: $TMPDIR, else /tmp.
  static std::unique_ptr<DeviceStartupLock> Acquire(const std::string& key,
                                                    absl::Duration timeout = absl::Minutes(10),
                                                    const std::string& dir = "");
  ~DeviceStartupLock();
  DeviceStartupLock(const DeviceStartupLock&) = delete;
  DeviceStartupLock& operator=(const DeviceStartupLock&) = delete;

  /// Whether the lock is held (false: waited `timeout`, or the file could not be opened).
  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  DeviceStartupLock() = default;
  int fd_ = -1;
  std::string path_;
};

}  // namespace loom::worker
