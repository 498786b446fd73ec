#include "worker/kv_pool_fence.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "absl/strings/str_format.h"

namespace loom::worker {
namespace {
constexpr size_t kPageBytes = 4096;
}  // namespace

absl::StatusOr<std::unique_ptr<KvPoolFence>> KvPoolFence::Create() {
  const int fd = memfd_create("loom-kv-pool-generation", MFD_CLOEXEC);
  void* mapped = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, kPageBytes) == 0) {
    mapped = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (mapped == MAP_FAILED) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a memory file for the KV pool's stream generation: %s", std::strerror(error)));
  }
  auto* word = new (mapped) std::atomic<uint64_t>(1);
  return std::unique_ptr<KvPoolFence>(new KvPoolFence(fd, word));
}

KvPoolFence::~KvPoolFence() {
  munmap(word_, kPageBytes);
  close(fd_);
}

void KvPoolFence::NewStream() {
  absl::WriterMutexLock lock(&mu_);
  word_->fetch_add(1, std::memory_order_acq_rel);
  closed_.clear();
}

std::optional<uint64_t> KvPoolFence::GenerationIf(const std::function<bool()>& current) const {
  absl::ReaderMutexLock lock(&mu_);
  if (!current()) return std::nullopt;
  return generation();
}

void KvPoolFence::CloseHolds(absl::Span<const uint64_t> hold_ids) {
  if (hold_ids.empty()) return;
  absl::WriterMutexLock lock(&mu_);
  closed_.insert(hold_ids.begin(), hold_ids.end());
}

absl::Status KvPoolFence::Write(uint64_t hold_id, const std::function<bool()>& current,
                                const std::function<absl::Status()>& write) {
  absl::ReaderMutexLock lock(&mu_);
  if (!current()) {
    return absl::AbortedError(
        "this worker's step stream changed since the transfer was planned: its blocks may "
        "belong to other sequences now");
  }
  if (hold_id != 0 && closed_.contains(hold_id)) {
    return absl::AbortedError(
        absl::StrFormat("hold %d has ended: the coordinator gave its blocks back", hold_id));
  }
  return write();
}

}  // namespace loom::worker
