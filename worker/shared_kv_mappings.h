#ifndef LOOM_WORKER_SHARED_KV_MAPPINGS_H_
#define LOOM_WORKER_SHARED_KV_MAPPINGS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace loom::worker {

/// Another process's host KV tier (a memory file reached as /proc/PID/fd/FD), mapped
/// read-only here (or writable, for pushes into it). Unmapped when the last holder lets go.
class SharedKvMapping {
 public:
  SharedKvMapping(uint8_t* data, int64_t size, dev_t device, ino_t inode, bool writable)
      : data_(data), size_(size), device_(device), inode_(inode), writable_(writable) {}
  ~SharedKvMapping();
  SharedKvMapping(const SharedKvMapping&) = delete;
  SharedKvMapping& operator=(const SharedKvMapping&) = delete;

  const uint8_t* data() const { return data_; }
  /// The mapped bytes to write (a writable mapping only; nullptr otherwise).
  uint8_t* writable_data() const { return writable_ ? data_ : nullptr; }
  int64_t size() const { return size_; }
  bool Is(dev_t device, ino_t inode) const { return device_ == device && inode_ == inode; }

 private:
  uint8_t* data_;
  int64_t size_;
  dev_t device_;
  ino_t inode_;
  bool writable_;
};

/// The sources' tiers this worker fetched from, kept mapped between fetches: a fresh
/// mapping faults in every page it reads (a 2k-token prompt's 47 MB read 8x slower than
/// through a mapping read before). A mapping is reused while /proc/PID/fd/FD still names
/// the same memory file (device and inode) of the same size; one whose file is gone (its
/// worker exited or restarted) is dropped at the next Map, so a dead source's memory is
/// not kept alive. Thread-safe.
class SharedKvMappings {
 public:
  /// The process-wide set.
  static SharedKvMappings& Get();

  /// The tier `pid` shares as its descriptor `fd`, `size` bytes, read-only or `writable`
  /// (a prefill worker pushing into a decode worker's slots). Unavailable when it cannot be
  /// opened or mapped from here (another container, other permissions).
  absl::StatusOr<std::shared_ptr<const SharedKvMapping>> Map(int pid, int fd, int64_t size,
                                                             bool writable = false);
  /// Mappings held now (tests).
  size_t size() const;

 private:
  struct Entry {
    std::string path;
    bool writable = false;
    int64_t size = 0;
    std::shared_ptr<const SharedKvMapping> mapping;
  };
  static constexpr size_t kMaxEntries = 16;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);  // most recently used last
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_SHARED_KV_MAPPINGS_H_
