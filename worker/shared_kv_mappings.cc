#include "worker/shared_kv_mappings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"

namespace loom::worker {

SharedKvMapping::~SharedKvMapping() { munmap(data_, static_cast<size_t>(size_)); }

SharedKvMappings& SharedKvMappings::Get() {
  static SharedKvMappings* const mappings = new SharedKvMappings();
  return *mappings;
}

absl::StatusOr<std::shared_ptr<const SharedKvMapping>> SharedKvMappings::Map(int pid, int fd,
                                                                             int64_t size,
                                                                             bool writable) {
  const std::string path = absl::StrFormat("/proc/%d/fd/%d", pid, fd);
  const int opened = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (opened < 0) return absl::UnavailableError(absl::StrFormat("cannot open %s", path));
  struct stat file;
  if (fstat(opened, &file) != 0 || file.st_size < size || size <= 0) {
    close(opened);
    return absl::UnavailableError(
        absl::StrFormat("%s is not a memory file of %d bytes", path, size));
  }
  absl::MutexLock lock(&mu_);
  // Sources gone or restarted: their memory is not kept alive by a mapping here.
  std::erase_if(entries_, [](const Entry& entry) {
    struct stat now;
    return stat(entry.path.c_str(), &now) != 0 || !entry.mapping->Is(now.st_dev, now.st_ino);
  });
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->path == path && it->writable == writable && it->size == size &&
        it->mapping->Is(file.st_dev, file.st_ino)) {
      close(opened);
      Entry used = std::move(*it);
      entries_.erase(it);
      entries_.push_back(std::move(used));
      return entries_.back().mapping;
    }
  }
  void* mapped = mmap(nullptr, static_cast<size_t>(size),
                      writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, opened, 0);
  close(opened);
  if (mapped == MAP_FAILED) return absl::UnavailableError(absl::StrFormat("cannot map %s", path));
  auto mapping = std::make_shared<const SharedKvMapping>(static_cast<uint8_t*>(mapped), size,
                                                         file.st_dev, file.st_ino, writable);
  std::erase_if(entries_, [&path, writable](const Entry& entry) {
    return entry.path == path && entry.writable == writable;
  });
  if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
  entries_.push_back({path, writable, size, mapping});
  return mapping;
}

size_t SharedKvMappings::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace loom::worker
