#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "model/device.h"
#include "worker/kv_slot_layout.h"

namespace loom::worker {

/// One entry of a plan's kv_copies (loom.v1.KvBlockCopy).
struct KvBlockCopy {
  bool to_host = true;  // pool block -> host slot; false: host slot -> pool block
  int32_t device_block = 0;
  int32_t host_slot = 0;
};

/// What a host tier moved so far (the worker's metrics).
struct KvTransferStats {
  int64_t blocks_to_host = 0;
  int64_t blocks_to_device = 0;
  int64_t bytes_to_host = 0;
  int64_t bytes_to_device = 0;
  double seconds = 0;  // spent copying, both ways
  // Worker to worker (the KV transfer: FetchKvBlocks / ReadKvBlocks).
  int64_t bytes_served = 0;
  int64_t bytes_fetched = 0;
  int64_t bytes_fetched_shared = 0;  // of bytes_fetched, read from a shared memory map
  double fetch_seconds = 0;
};

/// Whom a remote write into a host tier slot is for, asked under the tier's lock before
/// it: a write that `wanted` (optional) no longer wants (a push its writer gave up on), or
/// for a hold (`hold_id`, 0: none) closed by now (KvHostTier::CloseHolds), leaves the slot
/// alone (Cancelled).
struct KvWriteGuard {
  uint64_t hold_id = 0;
  std::function<bool()> wanted;
};

/// A worker's host-memory KV tier: `num_slots` slots, each one block of the device pool
/// (every layer this worker holds, its tensor-parallel slice, K, V and 8-bit scales
/// contiguous: KvCache::block_bytes()). The coordinator owns the table (which content
/// sits in which slot, LRU: engine/host_kv_tier); a plan names copies between pool blocks
/// and slots, which the step executor runs before the plan's forward pass, in order.
/// On CUDA the slots are pinned (cudaHostRegister), so a copy is one DMA per layer.
/// Debug builds checksum each slot when it is written and verify it before it is read.
/// Not thread-safe: the step executor's thread.
class KvHostTier {
 public:
  /// A tier of `bytes` (rounded down to whole slots; at least one) for blocks of `pool`.
  /// `pool` nullptr: bookkeeping only, no memory (the no-op backend), `bytes` counted in
  /// slots of `slot_bytes_without_pool`. Copies name the pool's blocks [0,
  /// `num_pool_blocks`) (the backend's num_kv_blocks: a CUDA pool's scratch block, which
  /// graph padding writes, is never a copy's); 0: every block of the pool. InvalidArgument
  /// when not even one slot fits.
  static absl::StatusOr<std::unique_ptr<KvHostTier>> Create(int64_t bytes,
                                                            const model::KvCache* pool,
                                                            int64_t slot_bytes_without_pool = 1,
                                                            int64_t num_pool_blocks = 0);
  ~KvHostTier();
  KvHostTier(const KvHostTier&) = delete;
  KvHostTier& operator=(const KvHostTier&) = delete;

  int64_t num_slots() const { return num_slots_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  /// How a slot lays out its block, when the worker knows it (it must describe
  /// slot_bytes()): a fetch from a replica of another tensor-parallel size maps heads.
  const KvSlotLayout& layout() const { return layout_; }
  void set_layout(const KvSlotLayout& layout) { layout_ = layout; }

  /// Validates every copy, then runs them in order (runs of one direction in one call).
  /// InvalidArgument naming the first bad copy, with nothing copied: a pool block out of
  /// range, a slot out of range, or a slot read that no earlier copy (this plan's or a
  /// previous one's) wrote. DataLoss (debug builds) when a slot's bytes changed since
  /// they were written.
  absl::Status Apply(absl::Span<const KvBlockCopy> copies);

  /// Seconds one block takes to load into the pool: the median of `rounds` round trips of
  /// block 0 through slot 0 (saved, then loaded back: the pool is unchanged). For the
  /// coordinator's load-or-recompute decision; run before the first step.
  absl::StatusOr<double> MeasureLoadSeconds(int rounds = 5);

  KvTransferStats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  // ---- remote transfers (worker/worker_service: ReadKvBlocks, FetchKvBlocks) ----
  // These run on gRPC threads beside the step executor's Apply; the coordinator keeps a
  // slot being read or written out of every plan meanwhile, and the lock orders the bytes.
  /// Copies `out.size()` bytes at `offset` of `slot` into `out`. InvalidArgument out of
  /// range or for a slot that holds no block.
  absl::Status ReadSlot(int32_t slot, int64_t offset, absl::Span<uint8_t> out) const;
  /// Writes `data` at `offset` of `slot`, which then holds no block until MarkWritten.
  absl::Status WriteSlot(int32_t slot, int64_t offset, absl::Span<const uint8_t> data,
                         const KvWriteGuard& guard = {});
  /// Lets `write` change `slot`'s bytes in place (the whole slot; not called without
  /// memory), which then holds no block until MarkWritten.
  absl::Status WriteSlotWith(int32_t slot, const std::function<void(absl::Span<uint8_t>)>& write,
                             const KvWriteGuard& guard = {});
  /// The coordinator's push holds that ended (StepPlan.kv_push_holds_closed): their slots
  /// may be given to other content now, and writes that name them are refused from here
  /// on. The last kMaxClosedHolds are remembered.
  void CloseHolds(absl::Span<const uint64_t> hold_ids);
  static constexpr size_t kMaxClosedHolds = 1 << 16;
  /// `slot` holds a block now (its bytes written whole). DataLoss when `checksum` (non-zero)
  /// is not the slot's FNV-1a 64.
  absl::Status MarkWritten(int32_t slot, uint64_t checksum, const KvWriteGuard& guard = {});
  /// FNV-1a 64 of `slot`'s bytes in debug builds, 0 in release builds (not computed).
  uint64_t TransferChecksum(int32_t slot) const;
  /// Counts a remote transfer's bytes (served to or fetched from another worker).
  void RecordRemote(int64_t bytes_served, int64_t bytes_fetched, double seconds,
                    bool shared = false);
  /// The tier's memory as another process on this machine can map it read-only: an
  /// anonymous memory file (memfd) opened through /proc/PID/fd/FD. -1 when the tier lives
  /// on the heap (memfd unavailable, or no pool) or after StopSharing.
  int shared_fd() const { return sharing_ ? memfd_ : -1; }
  /// From now on shared_fd() is -1: the tier is not offered to other processes (the
  /// memory stays where it is).
  void StopSharing() { sharing_ = false; }
  int64_t mapped_bytes() const { return num_slots_ * slot_bytes_; }

 private:
  KvHostTier() = default;
  uint8_t* slot(int32_t index) { return memory_ + static_cast<int64_t>(index) * slot_bytes_; }
  absl::Status Run(bool to_host, absl::Span<const KvBlockCopy> copies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t Checksum(int32_t index) const;
  // Whether `guard` lets a write through now (Cancelled if not).
  absl::Status Admit(const KvWriteGuard& guard) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The populating thread's loop, and the raise of its target to slots [0, end) plus
  // kPopulateAhead bytes.
  void Populate();
  void PopulateThrough(int64_t end);

  const model::KvCache* pool_ = nullptr;
  int64_t num_pool_blocks_ = 0;  // the blocks copies may name
  KvSlotLayout layout_;
  int64_t num_slots_ = 0;
  int64_t slot_bytes_ = 0;
  // The slots: a shared memory file mapped here (memfd_ >= 0), else heap_.
  uint8_t* memory_ = nullptr;
  int memfd_ = -1;
  bool sharing_ = true;  // shared_fd() offers memfd_
  std::unique_ptr<uint8_t[]> heap_;
  bool registered_ = false;
  // Commits the slots' pages in the background (Populate), kPopulateAhead bytes past the
  // highest slot written (the coordinator hands out never-used slots in increasing order):
  // a slot's first write would otherwise fault every page, 10x the copy itself. Not the
  // whole tier at creation: that cost start-up time and memory a tier may never use, and
  // on the Firecracker VMs this project measures on, a pool that fits served 5-10% slower
  // beside a 2.7 GB tier committed up front (bench/kv_offload_bench.py's fits case).
  static constexpr int64_t kPopulateAhead = int64_t{512} << 20;
  std::thread populating_;
  absl::Mutex populate_mu_;
  int64_t populate_target_ ABSL_GUARDED_BY(populate_mu_) = 0;  // bytes from memory_
  bool stop_populating_ ABSL_GUARDED_BY(populate_mu_) = false;
  mutable absl::Mutex mu_;
  std::vector<bool> written_ ABSL_GUARDED_BY(mu_);        // [num_slots]
  std::vector<uint64_t> checksums_ ABSL_GUARDED_BY(mu_);  // [num_slots], debug builds
  KvTransferStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> closed_holds_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> closed_order_ ABSL_GUARDED_BY(mu_);  // oldest first, for the bound
  // Scratch for one run of copies.
  std::vector<int32_t> blocks_;
  std::vector<uint8_t*> host_;
};

}  // namespace loom::worker
