#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace loom::worker {

/// Fences pool-to-pool transfers (worker/kv_pool_transfer) at this worker's step-stream
/// changes. A pool block belongs to the coordinator's block table of one step stream: when a
/// newer stream begins (the coordinator lost this worker, or another one took it over), the
/// block may be another sequence's.
///   * Reads by other processes: the stream generation is published in a one-page memory
///     file (`fd()`, mapped by readers through /proc/PID/fd): a reader that finds it changed
///     after copying a block discards the copy (a seqlock: the generation moves before any
///     plan of the new stream writes the pool).
///   * Writes into this worker's pool (a fetch): each batch runs under Write, which refuses
///     once the fetch's stream is not the current one or its hold was closed (the
///     coordinator gave the blocks back); NewStream and CloseHolds wait for a batch under way.
/// Thread-safe.
class KvPoolFence {
 public:
  /// The memory file; ResourceExhausted when it cannot be made.
  static absl::StatusOr<std::unique_ptr<KvPoolFence>> Create();
  ~KvPoolFence();
  KvPoolFence(const KvPoolFence&) = delete;
  KvPoolFence& operator=(const KvPoolFence&) = delete;

  /// The memory file holding the generation (8 bytes at offset 0), and its value now.
  int fd() const { return fd_; }
  uint64_t generation() const { return word_->load(std::memory_order_acquire); }
  /// The generation, read under the fence while `current()` holds (a stream change, which
  /// moves it, waits meanwhile); nullopt when it does not.
  std::optional<uint64_t> GenerationIf(const std::function<bool()>& current) const;

  /// A step stream begins: waits for the write batch under way, then moves the generation
  /// (and forgets the closed holds: the stream check covers earlier streams' fetches).
  void NewStream();
  /// A plan closes these holds (StepPlan.kv_push_holds_closed) before it runs: waits for
  /// the write batch under way; no later batch of theirs writes.
  void CloseHolds(absl::Span<const uint64_t> hold_ids);

  /// Runs `write` (one batch of a fetch into this worker's pool, under hold `hold_id`; 0:
  /// none named) unless `current()` (asked under the fence) says the fetch's stream is no
  /// longer this worker's, or the hold was closed: Aborted then, and nothing is written.
  absl::Status Write(uint64_t hold_id, const std::function<bool()>& current,
                     const std::function<absl::Status()>& write);

 private:
  KvPoolFence(int fd, std::atomic<uint64_t>* word) : fd_(fd), word_(word) {}

  const int fd_;
  std::atomic<uint64_t>* const word_;  // in the memory file's mapping
  mutable absl::Mutex mu_;  // writers (batches) shared, NewStream and CloseHolds exclusive
  absl::flat_hash_set<uint64_t> closed_ ABSL_GUARDED_BY(mu_);
};

/// A reader's view of another worker's generation (its KvPoolFence's memory file, mapped).
inline uint64_t ReadPoolGeneration(const uint8_t* mapped) {
  return reinterpret_cast<const std::atomic<uint64_t>*>(mapped)->load(std::memory_order_acquire);
}

}  // namespace loom::worker
