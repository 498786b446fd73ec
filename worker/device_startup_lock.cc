#include "worker/device_startup_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace loom::worker {
namespace {

std::string LockPath(const std::string& key, const std::string& dir) {
  std::string directory = dir;
  if (directory.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    directory = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string name = key;
  for (char& c : name) {
    if (c == '/' || c == ':' || c == ' ') c = '_';
  }
  return absl::StrCat(directory, "/loom-gpu-", name, ".lock");
}

}  // namespace

std::unique_ptr<DeviceStartupLock> DeviceStartupLock::Acquire(const std::string& key,
                                                              absl::Duration timeout,
                                                              const std::string& dir) {
  std::unique_ptr<DeviceStartupLock> lock(new DeviceStartupLock());
  lock->path_ = LockPath(key, dir);
  const int fd = open(lock->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    std::fprintf(stderr,
                 "loom-worker: cannot open %s (%s): starting without waiting for other workers "
                 "on this GPU\n",
                 lock->path_.c_str(), std::strerror(errno));
    return lock;
  }
  const absl::Time deadline = absl::Now() + timeout;
  bool announced = false;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      std::fprintf(stderr, "loom-worker: cannot lock %s (%s): starting without it\n",
                   lock->path_.c_str(), std::strerror(errno));
      close(fd);
      return lock;
    }
    if (absl::Now() >= deadline) {
      std::fprintf(stderr,
                   "loom-worker: another worker on this GPU held %s for %s: starting without "
                   "it (the KV pool may be sized from memory that worker is still taking)\n",
                   lock->path_.c_str(), absl::FormatDuration(timeout).c_str());
      close(fd);
      return lock;
    }
    if (!announced) {
      std::fprintf(stderr,
                   "loom-worker: waiting for another worker on this GPU to size its KV pool "
                   "(%s)\n",
                   lock->path_.c_str());
      announced = true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  lock->fd_ = fd;
  return lock;
}

DeviceStartupLock::~DeviceStartupLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

}  // namespace loom::worker
