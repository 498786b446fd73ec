#include "worker/kv_push.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/kv_transfer.h"

namespace loom::worker {

KvPusher::~KvPusher() {
  if (observing_) backend_.SetHalfLayerObserver({});
  const model::KvCache* pool = backend_.kv_pool();
  for (const auto& [key, mapping] : registered_) {
    if (pool != nullptr) pool->UnregisterHostMemory(mapping->writable_data());
  }
}

void KvStagingDeleter::operator()(uint8_t* bytes) const {
  if (pool != nullptr) pool->UnregisterHostMemory(bytes);
  std::free(bytes);
}

absl::StatusOr<uint8_t*> KvPusher::Staging(int64_t bytes) {
  if (bytes <= staging_bytes_) return staging_.get();
  // Whole pages (pinning registers pages; 64 KiB on some aarch64 kernels).
  static const int64_t kPage = std::max<int64_t>(sysconf(_SC_PAGESIZE), 4096);
  const int64_t size = (bytes + kPage - 1) / kPage * kPage;
  staging_.reset();
  staging_bytes_ = 0;
  auto* memory = static_cast<uint8_t*>(std::aligned_alloc(kPage, static_cast<size_t>(size)));
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot allocate %d bytes to stage pushed KV", size));
  }
  const model::KvCache* pool = backend_.kv_pool();
  // Unpinned memory still copies (the driver stages it): a failed registration only slows.
  const bool pinned = pool->RegisterHostMemory(memory, size).ok();
  staging_ =
      std::unique_ptr<uint8_t, KvStagingDeleter>(memory, KvStagingDeleter{pinned ? pool : nullptr});
  staging_bytes_ = size;
  return memory;
}

absl::Status KvPusher::Prepare(const loom::v1::StepPlan& plan) {
  if (tier_ == nullptr || !tier_->layout().known()) {
    return absl::FailedPreconditionError("this worker's host tier does not know its slot layout");
  }
  const model::KvCache* pool = backend_.kv_pool();
  if (pool == nullptr) return absl::FailedPreconditionError("this backend has no KV pool");
  const KvSlotLayout& mine = tier_->layout();
  for (const loom::v1::KvPush& message : plan.kv_pushes()) {
    if (message.device_blocks_size() != message.dest_slots_size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a push names %d blocks and %d destination slots",
                          message.device_blocks_size(), message.dest_slots_size()));
    }
    Push push;
    for (const int32_t block : message.device_blocks()) {
      // The backend's blocks: a CUDA pool's scratch block is never the coordinator's.
      if (block < 0 || block >= backend_.num_kv_blocks()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "pushed block %d is outside the pool of %d", block, backend_.num_kv_blocks()));
      }
      push.blocks.push_back(block);
    }
    push.dest_slots.assign(message.dest_slots().begin(), message.dest_slots().end());
    for (const loom::v1::KvPushDest& to : message.dests()) {
      Destination dest;
      for (int64_t head = mine.kv_head_begin; head < mine.kv_head_begin + mine.num_kv_heads;
           ++head) {
        if (head >= to.kv_head_begin() && head < to.kv_head_begin() + to.num_kv_heads()) {
          dest.heads.push_back(head);
        }
      }
      if (dest.heads.empty()) continue;  // another rank of this replica holds its heads
      dest.layout = mine.WithHeads(to.kv_head_begin(), to.num_kv_heads());
      dest.hold_id = to.hold_id();
      LOOM_RETURN_IF_ERROR(Connect(to, dest));
      for (const int32_t slot : push.dest_slots) {
        // A stream's receiver checks its own tier's bounds.
        const int64_t size =
            dest.mapping != nullptr ? dest.mapping->size() : std::numeric_limits<int64_t>::max();
        if (slot < 0 || (static_cast<int64_t>(slot) + 1) * dest.layout.slot_bytes() > size) {
          return absl::InvalidArgumentError(
              absl::StrFormat("destination slot %d is outside the decode worker's tier", slot));
        }
      }
      push.dests.push_back(std::move(dest));
    }
    pushes_.push_back(std::move(push));
  }
  observing_ = backend_.SetHalfLayerObserver([this] {
    if (half_layers_++ % 2 == 0) CopyLayer(half_layers_ / 2);
  });
  after_pass_ = !observing_;
  return absl::OkStatus();
}

absl::Status KvPusher::Connect(const loom::v1::KvPushDest& to, Destination& dest) {
  absl::Status mapped = absl::UnavailableError("the decode worker shares no memory");
  if (!to.shared().boot_id().empty()) {
    if (to.shared().boot_id() != BootId()) {
      mapped = absl::UnavailableError("the decode worker runs on another machine");
    } else if (absl::StatusOr<std::shared_ptr<const SharedKvMapping>> mapping =
                   SharedKvMappings::Get().Map(to.shared().pid(), to.shared().fd(),
                                               to.shared().size(), /*writable=*/true);
               mapping.ok()) {
      dest.mapping = *std::move(mapping);
      return absl::OkStatus();
    } else {
      mapped = mapping.status();  // another container of this machine, perhaps
    }
  }
  if (to.address().empty()) return mapped;
  std::shared_ptr<KvPushStream>& stream = streams_[to.address()];
  if (stream == nullptr) {
    // The deadline covers a long step; a decode worker that stops reading fails the stream
    // after KvPushStream's stall timeout. The heads both hold go (one run of them): the
    // rank's own slot bytes when they are all its heads, else mapped by the receiver.
    const int64_t begin = dest.heads.front();
    const int64_t count = static_cast<int64_t>(dest.heads.size());
    const bool whole = begin == dest.layout.kv_head_begin && count == dest.layout.num_kv_heads;
    stream = std::make_shared<KvPushStream>(
        to.address(), dest.layout.slot_bytes(), absl::Now() + absl::Minutes(5),
        whole ? KvSlotLayout{} : tier_->layout().WithHeads(begin, count));
  }
  dest.stream = stream;
  return absl::OkStatus();
}

void KvPusher::Begin(const loom::v1::StepPlan& plan, std::function<bool()> abandoned) {
  abandoned_ = std::move(abandoned);
  pushes_.clear();
  streams_.clear();
  half_layers_ = layers_copied_ = bytes_pushed_ = 0;
  failure_ = absl::OkStatus();
  after_pass_ = false;
  if (plan.kv_pushes_size() == 0) return;
  failure_ = Prepare(plan);
  if (!failure_.ok()) {
    pushes_.clear();
    streams_.clear();  // cancelled
  }
}

void KvPusher::CopyLayer(int64_t layer) {
  if (!failure_.ok()) return;
  const model::KvCache& pool = *backend_.kv_pool();
  const KvSlotLayout& mine = tier_->layout();
  const int64_t num_layers = mine.num_layers;
  KvSlotLayout source_layer = mine;
  source_layer.num_layers = 1;
  const int64_t layer_bytes = source_layer.slot_bytes();
  source_bytes_.resize(static_cast<size_t>(layer_bytes));
  for (const Push& push : pushes_) {
    for (size_t i = 0; i < push.blocks.size(); ++i) {
      if (absl::Status saved = pool.SaveBlockLayer(push.blocks[i], layer, source_bytes_.data());
          !saved.ok()) {
        failure_ = saved;
        return;
      }
      if (absl::Status delivered = Deliver(push, i, layer, source_bytes_.data()); !delivered.ok()) {
        failure_ = delivered;
        return;
      }
    }
  }
  layers_copied_ = std::max(layers_copied_, std::min(layer + 1, num_layers));
}

absl::Status KvPusher::Deliver(const Push& push, size_t i, int64_t layer, const uint8_t* bytes) {
  if (abandoned_ && abandoned_()) {
    return absl::AbortedError("the coordinator gave this step up: no more KV is pushed");
  }
  const KvSlotLayout& mine = tier_->layout();
  KvSlotLayout source_layer = mine;
  source_layer.num_layers = 1;
  const int64_t layer_bytes = source_layer.slot_bytes();
  for (const Destination& dest : push.dests) {
    KvSlotLayout dest_layer = dest.layout;
    dest_layer.num_layers = 1;
    const int64_t dest_layer_bytes = dest_layer.slot_bytes();
    const bool same_heads = dest_layer.kv_head_begin == mine.kv_head_begin &&
                            dest_layer.num_kv_heads == mine.num_kv_heads;
    if (dest.stream != nullptr) {
      // The layer's heads the rank holds (those of this worker's it does not hold are not
      // sent; where the rank holds more, the receiver maps these into place and another
      // rank of this replica sends the others).
      const uint8_t* out = bytes;
      int64_t out_bytes = layer_bytes;
      if (static_cast<int64_t>(dest.heads.size()) != mine.num_kv_heads) {
        const KvSlotLayout part =
            source_layer.WithHeads(dest.heads.front(), static_cast<int64_t>(dest.heads.size()));
        stream_bytes_.resize(static_cast<size_t>(part.slot_bytes()));
        CopyKvHeads(source_layer, absl::MakeConstSpan(bytes, static_cast<size_t>(layer_bytes)),
                    part, absl::MakeSpan(stream_bytes_), dest.heads);
        out = stream_bytes_.data();
        out_bytes = part.slot_bytes();
      }
      LOOM_RETURN_IF_ERROR(dest.stream->Send(
          push.dest_slots[i], layer * dest_layer_bytes,
          absl::MakeConstSpan(out, static_cast<size_t>(out_bytes)), dest.hold_id));
      bytes_pushed_ += out_bytes;
      continue;
    }
    uint8_t* to = dest.mapping->writable_data() +
                  static_cast<int64_t>(push.dest_slots[i]) * dest.layout.slot_bytes() +
                  layer * dest_layer_bytes;
    if (same_heads) {
      std::memcpy(to, bytes, static_cast<size_t>(layer_bytes));
    } else {
      CopyKvHeads(source_layer, absl::MakeConstSpan(bytes, static_cast<size_t>(layer_bytes)),
                  dest_layer, absl::MakeSpan(to, static_cast<size_t>(dest_layer_bytes)),
                  dest.heads);
    }
    bytes_pushed_ += layer_bytes / mine.num_kv_heads * static_cast<int64_t>(dest.heads.size());
  }
  return absl::OkStatus();
}

absl::Status KvPusher::FinishStreams() {
  absl::Status first;
  for (auto& [address, stream] : streams_) {
    if (absl::Status finished = stream->Finish(); first.ok()) first = finished;
  }
  streams_.clear();
  return first;
}

absl::Status KvPusher::CopyBlocks() {
  const model::KvCache& pool = *backend_.kv_pool();
  const int64_t block_bytes = pool.block_bytes();
  const int64_t num_layers = tier_->layout().num_layers;
  if (block_bytes != tier_->layout().slot_bytes()) {
    return absl::InternalError(absl::StrFormat("the pool's blocks are %d bytes, its slots %d",
                                               block_bytes, tier_->layout().slot_bytes()));
  }
  const size_t batch = static_cast<size_t>(std::max<int64_t>(1, max_staging_bytes_ / block_bytes));
  for (const Push& push : pushes_) {
    LOOM_ASSIGN_OR_RETURN(const bool direct, CopyBlocksDirect(push));
    if (direct) continue;
    for (size_t first = 0; first < push.blocks.size(); first += batch) {
      const size_t count = std::min(batch, push.blocks.size() - first);
      LOOM_ASSIGN_OR_RETURN(uint8_t * staging, Staging(static_cast<int64_t>(count) * block_bytes));
      std::vector<uint8_t*> host(count);
      for (size_t b = 0; b < count; ++b) host[b] = staging + static_cast<int64_t>(b) * block_bytes;
      LOOM_RETURN_IF_ERROR(pool.SaveBlocks(absl::MakeConstSpan(push.blocks).subspan(first, count),
                                           absl::MakeConstSpan(host)));
      for (size_t b = 0; b < count; ++b) {
        for (int64_t layer = 0; layer < num_layers; ++layer) {
          LOOM_RETURN_IF_ERROR(
              Deliver(push, first + b, layer, host[b] + layer * (block_bytes / num_layers)));
        }
      }
    }
  }
  layers_copied_ = num_layers;
  return absl::OkStatus();
}

absl::StatusOr<bool> KvPusher::CopyBlocksDirect(const Push& push) {
  const model::KvCache& pool = *backend_.kv_pool();
  const KvSlotLayout& mine = tier_->layout();
  if (push.dests.size() != 1) return false;
  const Destination& dest = push.dests.front();
  if (dest.mapping == nullptr || dest.mapping->writable_data() == nullptr ||
      dest.layout.kv_head_begin != mine.kv_head_begin ||
      dest.layout.num_kv_heads != mine.num_kv_heads ||
      dest.layout.slot_bytes() != pool.block_bytes()) {
    return false;
  }
  if (abandoned_ && abandoned_()) {
    return absl::AbortedError("the coordinator gave this step up: no more KV is pushed");
  }
  // Mappings that SharedKvMappings let go (their worker exited, or 16 others since) held only
  // here: unregistered and dropped, so a dead decode worker's memory is not kept.
  for (auto it = registered_.begin(); it != registered_.end();) {
    if (it->second.use_count() > 1 || it->second == dest.mapping) {
      ++it;
      continue;
    }
    pool.UnregisterHostMemory(it->second->writable_data());
    it = registered_.erase(it);
  }
  const SharedKvMapping* key = dest.mapping.get();
  if (!registered_.contains(key) && !unregistrable_.contains(key)) {
    // Pinned here too, the tier's pages take DMA straight from the device; a mapping the
    // pool cannot register is still written, the driver staging the copies.
    if (pool.RegisterHostMemory(dest.mapping->writable_data(), dest.mapping->size()).ok()) {
      registered_[key] = dest.mapping;
    } else {
      unregistrable_.insert(key);
    }
  }
  const int64_t slot_bytes = dest.layout.slot_bytes();
  std::vector<uint8_t*> slots;
  for (const int32_t slot : push.dest_slots) {
    slots.push_back(dest.mapping->writable_data() + static_cast<int64_t>(slot) * slot_bytes);
  }
  LOOM_RETURN_IF_ERROR(pool.SaveBlocks(push.blocks, slots));
  bytes_pushed_ += static_cast<int64_t>(push.blocks.size()) * slot_bytes;
  return true;
}

void KvPusher::End(loom::v1::StepResult& result) {
  if (observing_) {
    backend_.SetHalfLayerObserver({});
    observing_ = false;
  }
  if (after_pass_ && failure_.ok() && !pushes_.empty()) {
    failure_ = result.error_code() != 0
                   ? absl::AbortedError("the forward pass failed before its KV could be pushed")
                   : CopyBlocks();
  }
  after_pass_ = false;
  if (failure_.ok() && !pushes_.empty() && layers_copied_ < tier_->layout().num_layers) {
    failure_ = absl::AbortedError(absl::StrFormat("the forward pass stopped after %d of %d layers",
                                                  layers_copied_, tier_->layout().num_layers));
  }
  if (failure_.ok()) {
    failure_ = FinishStreams();  // the step's result waits for the bytes to have arrived
  }
  if (!failure_.ok()) {
    result.set_kv_push_error(std::string(failure_.message()));
  } else if (bytes_pushed_ > 0) {
    tier_->RecordRemote(/*bytes_served=*/bytes_pushed_, /*bytes_fetched=*/0, /*seconds=*/0);
  }
  pushes_.clear();
  streams_.clear();  // cancelled, if not finished
  failure_ = absl::OkStatus();
  abandoned_ = nullptr;  // it may name the step stream's context
}

absl::Status AdoptPushedSlots(KvHostTier* tier, const loom::v1::StepPlan& plan) {
  if (plan.kv_pushed_slots_size() == 0) return absl::OkStatus();
  if (tier == nullptr) {
    return absl::FailedPreconditionError("pushed slots named, but this worker has no host tier");
  }
  for (const int32_t slot : plan.kv_pushed_slots()) {
    if (slot < 0 || slot >= tier->num_slots()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pushed host slot %d is out of [0, %d)", slot, tier->num_slots()));
    }
  }
  for (const int32_t slot : plan.kv_pushed_slots()) {
    LOOM_RETURN_IF_ERROR(tier->MarkWritten(slot, /*checksum=*/0));
  }
  return absl::OkStatus();
}

}  // namespace loom::worker
