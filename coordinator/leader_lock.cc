#include "coordinator/leader_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace loom::coordinator {

absl::StatusOr<std::unique_ptr<LeaderLock>> LeaderLock::Open(const std::string& path,
                                                             std::string advertise,
                                                             absl::Duration poll) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--leader-lock: cannot open '%s': %s", path, std::strerror(errno)));
  }
  return std::unique_ptr<LeaderLock>(new LeaderLock(path, std::move(advertise), fd, poll));
}

LeaderLock::LeaderLock(std::string path, std::string advertise, int fd, absl::Duration poll)
    : path_(std::move(path)), advertise_(std::move(advertise)), fd_(fd), poll_(poll) {}

LeaderLock::~LeaderLock() {
  Resign();
  ::close(fd_);
}

void LeaderLock::Resign() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (!leading_.exchange(false)) return;
  // The address goes before the lock: a follower that reads the file from now on finds no
  // one until the next leader writes itself there.
  if (::ftruncate(fd_, 0) != 0) {
    std::fprintf(stderr, "loom: cannot clear %s: %s\n", path_.c_str(), std::strerror(errno));
  }
  ::flock(fd_, LOCK_UN);
}

void LeaderLock::Start(std::function<void()> on_elected) {
  thread_ = std::thread([this, on_elected = std::move(on_elected)] { Run(on_elected); });
}

void LeaderLock::Run(std::function<void()> on_elected) {
  while (true) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) break;
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), poll_)) return;
  }
  // Leading: tell followers where workers find this coordinator.
  const std::string record = advertise_ + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, record.data(), record.size(), 0) < 0) {
    std::fprintf(stderr, "loom: cannot write the leader's address into %s: %s\n", path_.c_str(),
                 std::strerror(errno));
  }
  ::fsync(fd_);
  leading_.store(true, std::memory_order_release);
  on_elected();
}

std::string LeaderLock::LeaderAddress() const {
  std::ifstream file(path_);
  std::stringstream text;
  text << file.rdbuf();
  return std::string(absl::StripAsciiWhitespace(text.str()));
}

}  // namespace loom::coordinator
