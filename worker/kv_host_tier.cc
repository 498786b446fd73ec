#include "worker/kv_host_tier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace loom::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

#ifdef NDEBUG
constexpr bool kChecksumSlots = false;
#else
constexpr bool kChecksumSlots = true;
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<KvHostTier>> KvHostTier::Create(int64_t bytes,
                                                               const model::KvCache* pool,
                                                               int64_t slot_bytes_without_pool,
                                                               int64_t num_pool_blocks) {
  const int64_t slot_bytes = pool != nullptr ? pool->block_bytes() : slot_bytes_without_pool;
  if (slot_bytes <= 0 || bytes < slot_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the KV host tier of %d bytes holds no block (a block takes %d bytes)", bytes, slot_bytes));
  }
  std::unique_ptr<KvHostTier> tier(new KvHostTier());
  tier->pool_ = pool;
  tier->num_pool_blocks_ = pool == nullptr       ? INT32_MAX
                           : num_pool_blocks > 0 ? std::min(num_pool_blocks, pool->num_blocks())
                                                 : pool->num_blocks();
  tier->num_slots_ = std::min<int64_t>(bytes / slot_bytes, INT32_MAX);
  tier->slot_bytes_ = slot_bytes;
  tier->written_.assign(static_cast<size_t>(tier->num_slots_), false);
  if (kChecksumSlots) tier->checksums_.assign(static_cast<size_t>(tier->num_slots_), 0);
  if (pool != nullptr) {
    const int64_t total = tier->num_slots_ * slot_bytes;
    // A memory file, so that a worker of another replica on this machine can map it to
    // fetch blocks (worker/kv_transfer); its pages committed in the background (Populate).
    const int fd = memfd_create("loom-kv-host-tier", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, total) == 0) {
      void* mapped =
          mmap(nullptr, static_cast<size_t>(total), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (mapped != MAP_FAILED) {
        tier->memory_ = static_cast<uint8_t*>(mapped);
        tier->memfd_ = fd;
      }
    }
    if (tier->memory_ == nullptr) {
      if (fd >= 0) close(fd);
      tier->heap_.reset(new (std::nothrow) uint8_t[static_cast<size_t>(total)]);
      tier->memory_ = tier->heap_.get();
    }
    if (tier->memory_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("cannot allocate the KV host tier (%d bytes)", total));
    }
    // Pinning only speeds the copies up (a device copies pageable memory through its own
    // staging): a driver or sandbox that refuses it leaves a slower tier, not none.
    if (absl::Status pinned = pool->RegisterHostMemory(tier->memory_, total); pinned.ok()) {
      tier->registered_ = true;
    } else {
      std::fprintf(stderr,
                   "loom-worker: the KV host tier (%lld bytes) is not pinned, its copies run "
                   "through the driver's staging: %s\n",
                   static_cast<long long>(total), std::string(pinned.message()).c_str());
    }
    KvHostTier* populated = tier.get();
    tier->populating_ = std::thread([populated] { populated->Populate(); });
    tier->PopulateThrough(0);
  }
  return tier;
}

void KvHostTier::Populate() {
  // Page tables only (MADV_POPULATE_WRITE keeps the bytes): safe beside the slots' copies.
  // Chunks, so that a tier dropped at once stops soon; a kernel without it (before 5.14)
  // leaves the pages to their first writes.
  constexpr int64_t kChunk = int64_t{64} << 20;
  int64_t done = 0;
  const auto wanted = [this, &done] {
    populate_mu_.AssertHeld();
    return stop_populating_ || populate_target_ > done;
  };
  while (true) {
    int64_t target = 0;
    {
      absl::MutexLock lock(&populate_mu_);
      populate_mu_.Await(absl::Condition(&wanted));
      if (stop_populating_) return;
      target = populate_target_;
    }
    const int64_t length = std::min(kChunk, target - done);
    if (madvise(memory_ + done, static_cast<size_t>(length), MADV_POPULATE_WRITE) != 0) return;
    done += length;
  }
}

void KvHostTier::PopulateThrough(int64_t end) {
  if (!populating_.joinable()) return;
  const int64_t target = std::min(mapped_bytes(), end * slot_bytes_ + kPopulateAhead);
  absl::MutexLock lock(&populate_mu_);
  populate_target_ = std::max(populate_target_, target);
}

KvHostTier::~KvHostTier() {
  if (populating_.joinable()) {
    {
      absl::MutexLock lock(&populate_mu_);
      stop_populating_ = true;
    }
    populating_.join();
  }
  if (registered_) pool_->UnregisterHostMemory(memory_);
  if (memfd_ >= 0) {
    munmap(memory_, static_cast<size_t>(num_slots_ * slot_bytes_));
    close(memfd_);
  }
}

uint64_t KvHostTier::Checksum(int32_t index) const {
  // FNV-1a 64: the same value in every process (a transfer's reader checks the writer's).
  return KvSlotChecksum(absl::MakeConstSpan(memory_ + static_cast<int64_t>(index) * slot_bytes_,
                                            static_cast<size_t>(slot_bytes_)));
}

uint64_t KvHostTier::TransferChecksum(int32_t slot) const {
  if (!kChecksumSlots || pool_ == nullptr) return 0;
  absl::MutexLock lock(&mu_);
  return Checksum(slot);
}

absl::Status KvHostTier::ReadSlot(int32_t slot, int64_t offset, absl::Span<uint8_t> out) const {
  absl::MutexLock lock(&mu_);
  if (slot < 0 || slot >= num_slots_ || !written_[static_cast<size_t>(slot)]) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host slot %d holds no block to read (tier of %d slots)", slot, num_slots_));
  }
  if (offset < 0 || offset + static_cast<int64_t>(out.size()) > slot_bytes_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "read of %d bytes at %d is outside a slot of %d bytes", out.size(), offset, slot_bytes_));
  }
  if (pool_ != nullptr) {
    std::copy_n(memory_ + static_cast<int64_t>(slot) * slot_bytes_ + offset, out.size(),
                out.data());
  }
  return absl::OkStatus();
}

absl::Status KvHostTier::Admit(const KvWriteGuard& guard) const {
  if (guard.hold_id != 0 && closed_holds_.contains(guard.hold_id)) {
    return absl::CancelledError(absl::StrFormat(
        "push hold %d has ended: its slots may hold other blocks now", guard.hold_id));
  }
  if (guard.wanted && !guard.wanted()) return absl::CancelledError("the write is no longer wanted");
  return absl::OkStatus();
}

void KvHostTier::CloseHolds(absl::Span<const uint64_t> hold_ids) {
  absl::MutexLock lock(&mu_);
  for (const uint64_t id : hold_ids) {
    if (id == 0 || !closed_holds_.insert(id).second) continue;
    closed_order_.push_back(id);
    if (closed_order_.size() > kMaxClosedHolds) {
      closed_holds_.erase(closed_order_.front());
      closed_order_.pop_front();
    }
  }
}

absl::Status KvHostTier::WriteSlot(int32_t slot, int64_t offset, absl::Span<const uint8_t> data,
                                   const KvWriteGuard& guard) {
  absl::MutexLock lock(&mu_);
  LOOM_RETURN_IF_ERROR(Admit(guard));
  if (slot < 0 || slot >= num_slots_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host slot %d is not in the host tier [0, %d)", slot, num_slots_));
  }
  const int64_t size = static_cast<int64_t>(data.size());
  if (offset < 0 || size > slot_bytes_ || offset > slot_bytes_ - size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "write of %d bytes at %d is outside a slot of %d bytes", data.size(), offset, slot_bytes_));
  }
  written_[static_cast<size_t>(slot)] = false;
  PopulateThrough(int64_t{slot} + 1);
  if (pool_ != nullptr) {
    std::copy(data.begin(), data.end(),
              memory_ + static_cast<int64_t>(slot) * slot_bytes_ + offset);
  }
  return absl::OkStatus();
}

absl::Status KvHostTier::WriteSlotWith(int32_t slot,
                                       const std::function<void(absl::Span<uint8_t>)>& write,
                                       const KvWriteGuard& guard) {
  absl::MutexLock lock(&mu_);
  LOOM_RETURN_IF_ERROR(Admit(guard));
  if (slot < 0 || slot >= num_slots_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host slot %d is not in the host tier [0, %d)", slot, num_slots_));
  }
  written_[static_cast<size_t>(slot)] = false;
  PopulateThrough(int64_t{slot} + 1);
  if (pool_ != nullptr) {
    write(absl::MakeSpan(memory_ + static_cast<int64_t>(slot) * slot_bytes_,
                         static_cast<size_t>(slot_bytes_)));
  }
  return absl::OkStatus();
}

absl::Status KvHostTier::MarkWritten(int32_t slot, uint64_t checksum, const KvWriteGuard& guard) {
  absl::MutexLock lock(&mu_);
  LOOM_RETURN_IF_ERROR(Admit(guard));
  if (slot < 0 || slot >= num_slots_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host slot %d is not in the host tier", slot));
  }
  const uint64_t actual =
      pool_ != nullptr && (kChecksumSlots || checksum != 0) ? Checksum(slot) : 0;
  if (checksum != 0 && pool_ != nullptr && actual != checksum) {
    return absl::DataLossError(absl::StrFormat(
        "host slot %d: the transferred block's checksum does not match the sender's", slot));
  }
  written_[static_cast<size_t>(slot)] = true;
  if (kChecksumSlots) checksums_[static_cast<size_t>(slot)] = actual;
  return absl::OkStatus();
}

void KvHostTier::RecordRemote(int64_t bytes_served, int64_t bytes_fetched, double seconds,
                              bool shared) {
  absl::MutexLock lock(&mu_);
  if (shared) stats_.bytes_fetched_shared += bytes_fetched;
  stats_.bytes_served += bytes_served;
  stats_.bytes_fetched += bytes_fetched;
  stats_.fetch_seconds += seconds;
}

absl::Status KvHostTier::Apply(absl::Span<const KvBlockCopy> copies) {
  if (copies.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  const int64_t num_blocks = num_pool_blocks_;
  // Which slots hold a block once the copies before each one ran.
  std::vector<int32_t> newly_written;
  const auto written = [&](int32_t s) {
    return written_[static_cast<size_t>(s)] ||
           std::find(newly_written.begin(), newly_written.end(), s) != newly_written.end();
  };
  for (size_t i = 0; i < copies.size(); ++i) {
    const KvBlockCopy& copy = copies[i];
    if (copy.device_block < 0 || copy.device_block >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "KV copy %d: block %d is not in the pool [0, %d)", i, copy.device_block, num_blocks));
    }
    if (copy.host_slot < 0 || copy.host_slot >= num_slots_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("KV copy %d: host slot %d is not in the host tier [0, %d)", i,
                          copy.host_slot, num_slots_));
    }
    if (copy.to_host) {
      newly_written.push_back(copy.host_slot);
    } else if (!written(copy.host_slot)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("KV copy %d: host slot %d holds no block (nothing was offloaded into it)",
                          i, copy.host_slot));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  size_t begin = 0;
  while (begin < copies.size()) {
    size_t end = begin + 1;
    while (end < copies.size() && copies[end].to_host == copies[begin].to_host) ++end;
    LOOM_RETURN_IF_ERROR(Run(copies[begin].to_host, copies.subspan(begin, end - begin)));
    begin = end;
  }
  stats_.seconds += SecondsSince(start);
  return absl::OkStatus();
}

absl::Status KvHostTier::Run(bool to_host, absl::Span<const KvBlockCopy> copies) {
  blocks_.clear();
  host_.clear();
  if (to_host) {
    const auto highest = std::max_element(
        copies.begin(), copies.end(),
        [](const KvBlockCopy& a, const KvBlockCopy& b) { return a.host_slot < b.host_slot; });
    if (highest != copies.end()) PopulateThrough(int64_t{highest->host_slot} + 1);
  }
  for (const KvBlockCopy& copy : copies) {
    blocks_.push_back(copy.device_block);
    host_.push_back(pool_ != nullptr ? slot(copy.host_slot) : nullptr);
    if (!to_host && kChecksumSlots && pool_ != nullptr &&
        Checksum(copy.host_slot) != checksums_[static_cast<size_t>(copy.host_slot)]) {
      return absl::DataLossError(absl::StrFormat(
          "KV host slot %d changed since it was written (checksum mismatch)", copy.host_slot));
    }
  }
  if (pool_ != nullptr) {
    if (to_host) {
      LOOM_RETURN_IF_ERROR(pool_->SaveBlocks(blocks_, host_));
    } else {
      std::vector<const uint8_t*> source(host_.begin(), host_.end());
      LOOM_RETURN_IF_ERROR(pool_->LoadBlocks(source, blocks_));
    }
  }
  const int64_t bytes = static_cast<int64_t>(copies.size()) * slot_bytes_;
  if (to_host) {
    for (const KvBlockCopy& copy : copies) {
      written_[static_cast<size_t>(copy.host_slot)] = true;
      if (kChecksumSlots && pool_ != nullptr) {
        checksums_[static_cast<size_t>(copy.host_slot)] = Checksum(copy.host_slot);
      }
    }
    stats_.blocks_to_host += static_cast<int64_t>(copies.size());
    stats_.bytes_to_host += bytes;
  } else {
    stats_.blocks_to_device += static_cast<int64_t>(copies.size());
    stats_.bytes_to_device += bytes;
  }
  return absl::OkStatus();
}

absl::StatusOr<double> KvHostTier::MeasureLoadSeconds(int rounds) {
  if (pool_ == nullptr) return 0.0;
  absl::MutexLock lock(&mu_);
  std::vector<double> seconds;
  const int32_t block = 0;
  uint8_t* host = slot(0);
  for (int r = 0; r < std::max(rounds, 1); ++r) {
    LOOM_RETURN_IF_ERROR(
        pool_->SaveBlocks(absl::MakeConstSpan(&block, 1), absl::MakeConstSpan(&host, 1)));
    const uint8_t* source = host;
    const auto start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(
        pool_->LoadBlocks(absl::MakeConstSpan(&source, 1), absl::MakeConstSpan(&block, 1)));
    seconds.push_back(SecondsSince(start));
  }
  // Slot 0 holds block 0's bytes now, not an offloaded block.
  written_[0] = false;
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace loom::worker
