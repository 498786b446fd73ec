#include "worker/kv_host_tier.h"

#include <algorithm>
#include <chrono>
#include <string_view>

#include "absl/hash/hash.h"
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
                                                               int64_t slot_bytes_without_pool) {
  const int64_t slot_bytes = pool != nullptr ? pool->block_bytes() : slot_bytes_without_pool;
  if (slot_bytes <= 0 || bytes < slot_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the KV host tier of %d bytes holds no block (a block takes %d bytes)", bytes, slot_bytes));
  }
  std::unique_ptr<KvHostTier> tier(new KvHostTier());
  tier->pool_ = pool;
  tier->num_slots_ = std::min<int64_t>(bytes / slot_bytes, INT32_MAX);
  tier->slot_bytes_ = slot_bytes;
  tier->written_.assign(static_cast<size_t>(tier->num_slots_), false);
  if (kChecksumSlots) tier->checksums_.assign(static_cast<size_t>(tier->num_slots_), 0);
  if (pool != nullptr) {
    const int64_t total = tier->num_slots_ * slot_bytes;
    // Uninitialised: pages are committed as slots are first written.
    tier->memory_.reset(new (std::nothrow) uint8_t[static_cast<size_t>(total)]);
    if (tier->memory_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("cannot allocate the KV host tier (%d bytes)", total));
    }
    LOOM_RETURN_IF_ERROR(pool->RegisterHostMemory(tier->memory_.get(), total));
    tier->registered_ = true;
  }
  return tier;
}

KvHostTier::~KvHostTier() {
  if (registered_) pool_->UnregisterHostMemory(memory_.get());
}

uint64_t KvHostTier::Checksum(int32_t index) {
  return absl::HashOf(std::string_view(reinterpret_cast<const char*>(slot(index)),
                                       static_cast<size_t>(slot_bytes_)));
}

absl::Status KvHostTier::Apply(absl::Span<const KvBlockCopy> copies) {
  if (copies.empty()) return absl::OkStatus();
  const int64_t num_blocks = pool_ != nullptr ? pool_->num_blocks() : INT32_MAX;
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
