// Scheduler: fetching a prefix between replicas through the host tiers (the source's
// slots are read by the destination's worker: worker/kv_transfer), a hand-off's partial
// last block, pushed there by its prefill replica's workers (worker/kv_push), and the
// block-table side of pool-to-pool transfers (worker/kv_pool_transfer): a source replica
// holds a prefix's pool blocks while another replica's workers copy them into blocks that
// replica holds for them; arrived, they are its cached prefix blocks.
#include <algorithm>
#include <optional>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "engine/scheduler.h"

namespace loom::engine {
namespace {

// Whether `content` is block `tokens` after the content `parent_id` (first: salted).
bool Verified(const EvictedBlock& content, absl::Span<const int32_t> tokens, uint64_t parent_id,
              std::string_view cache_salt) {
  return content.parent_id == parent_id && (parent_id != 0 || content.salt == cache_salt) &&
         std::equal(tokens.begin(), tokens.end(), content.tokens.begin(), content.tokens.end());
}

}  // namespace

bool TransferPays(double seconds_per_block, int64_t blocks, int32_t block_size,
                  const StepCostModel& cost) {
  if (seconds_per_block <= 0 || blocks <= 0 || !cost.measured()) return true;
  return seconds_per_block * static_cast<double>(blocks) < cost.Estimate(blocks * block_size);
}

int64_t LocalPrefillLimit(const StepCostModel& cost, int64_t num_decodes,
                          std::optional<double> handoff_seconds) {
  constexpr int64_t kUnmeasured = 512;
  constexpr int64_t kLargest = int64_t{1} << 20;
  // The stall of n more tokens is n times the fitted per-token cost: the buckets' own
  // means, a few steps each, swing with a neighbour's load and would throw the limit
  // between 16 and "never" from one step to the next.
  const double per_token = cost.SecondsPerToken();
  if (!cost.measured() || per_token <= 0) return kUnmeasured;
  const int64_t batch = std::max<int64_t>(num_decodes, 1);
  const double worth = std::max(cost.Estimate(batch), handoff_seconds.value_or(0.0));
  // Before a hand-off was measured, no shorter prompt than the fixed guess is sent away.
  int64_t n = handoff_seconds.has_value() ? 16 : kUnmeasured;
  for (; n < kLargest; n *= 2) {
    if (per_token * static_cast<double>(n) >= worth) return n;
  }
  return kLargest;
}

int64_t PrefillChunkBesideDecodes(const StepCostModel& cost, int64_t num_decodes, int64_t largest) {
  // Before a prompt token's cost is measured: a chunk whose step measures it.
  constexpr int64_t kUnmeasured = 16;
  largest = std::max<int64_t>(largest, 1);
  const std::optional<double> per_token = cost.PrefillSecondsPerToken();
  if (!per_token.has_value()) return std::min(largest, kUnmeasured);
  if (num_decodes <= 0 || *per_token <= 0) return largest;
  const double tokens = cost.Estimate(num_decodes) / *per_token;
  if (!(tokens < static_cast<double>(largest))) return largest;
  return std::max<int64_t>(static_cast<int64_t>(tokens), 1);
}

PrefillRate MeasurePrefillRate(const StepCostModel& cost, int64_t num_decodes, int64_t chunk,
                               int64_t queued_tokens) {
  PrefillRate rate;
  rate.chunk = std::max<int64_t>(chunk, 0);
  rate.queued_tokens = std::max<int64_t>(queued_tokens, 0);
  if (!cost.measured()) return rate;
  rate.seconds_per_token = cost.SecondsPerToken();
  if (rate.seconds_per_token > 0) {
    // A step of the decodes alone (or of one token, without decodes) is the fixed part.
    rate.step_seconds = cost.Estimate(std::max<int64_t>(num_decodes, 1));
  } else if (rate.chunk > 0) {
    // No line through the step sizes: a prefill replica whose prompts all come in full
    // chunks times one size only. A full chunk's measured step, per token.
    rate.seconds_per_token = cost.Estimate(rate.chunk + std::max<int64_t>(num_decodes, 0)) /
                             static_cast<double>(rate.chunk);
  }
  return rate;
}

double FirstTokenSeconds(const PrefillRate& rate, int64_t tokens) {
  if (rate.seconds_per_token <= 0) return 0;
  const int64_t total = rate.queued_tokens + std::max<int64_t>(tokens, 1);
  const int64_t steps = rate.chunk > 0 ? (total + rate.chunk - 1) / rate.chunk : 1;
  return rate.seconds_per_token * static_cast<double>(total) +
         rate.step_seconds * static_cast<double>(steps);
}

Scheduler::HeldSlots Scheduler::ExportPrefix(absl::Span<const BlockHash> hashes,
                                             absl::Span<const int32_t> tokens,
                                             std::string_view cache_salt) {
  HeldSlots held;
  if (host_tier_ == nullptr) return held;
  held.generation = host_tier_->generation();
  const size_t block_size = static_cast<size_t>(config_.block_size);
  uint64_t parent_id = 0;
  for (size_t i = 0; i < hashes.size() && (i + 1) * block_size <= tokens.size(); ++i) {
    const absl::Span<const int32_t> block_tokens = tokens.subspan(i * block_size, block_size);
    int32_t slot = -1;
    uint64_t content_id = 0;
    const int32_t block = block_manager_.cached_block(hashes[i]);
    if (block >= 0) {
      const EvictedBlock content = block_manager_.Content(block);
      if (!Verified(content, block_tokens, parent_id, cache_salt)) break;
      // In the pool: copied out (or found in the tier already, the same content).
      slot = host_tier_->Demote(content);
      content_id = content.content_id;
    } else if (const std::optional<HostKvTier::Hit> hit =
                   host_tier_->Find(hashes[i], block_tokens, parent_id, cache_salt)) {
      slot = hit->slot;
      content_id = hit->content_id;
    }
    if (slot < 0) break;
    host_tier_->Hold(slot);
    held.slots.push_back(slot);
    parent_id = content_id;
  }
  return held;
}

Scheduler::HeldSlots Scheduler::ReserveImport(int64_t count) {
  HeldSlots held;
  if (host_tier_ == nullptr || count <= 0) return held;
  held.generation = host_tier_->generation();
  held.slots = host_tier_->Reserve(count, &held.last_copy_plan);
  return held;
}

Scheduler::HeldSlots Scheduler::ReserveSlots(absl::Span<const int32_t> slots) {
  HeldSlots held;
  if (host_tier_ == nullptr) return held;
  held.generation = host_tier_->generation();
  held.slots = host_tier_->ReserveSlots(slots);
  return held;
}

int64_t Scheduler::CommitImport(const HeldSlots& import, absl::Span<const BlockHash> hashes,
                                absl::Span<const int32_t> tokens, std::string_view cache_salt,
                                HeldSlots* keep) {
  if (host_tier_ == nullptr) return 0;
  if (import.generation != host_tier_->generation()) {
    // The tier was reset meanwhile (its slots stayed reserved): nothing to commit.
    ReleaseSlots(import, /*import=*/true);
    return 0;
  }
  if (keep != nullptr) keep->generation = host_tier_->generation();
  const size_t block_size = static_cast<size_t>(config_.block_size);
  uint64_t parent_id = 0;
  int64_t stored = 0;
  size_t i = 0;
  for (; i < import.slots.size() && i < hashes.size(); ++i) {
    const int32_t slot = import.slots[i];
    const absl::Span<const int32_t> block_tokens = tokens.subspan(i * block_size, block_size);
    // What this replica holds already stays; the fetched copy chains after it.
    const int32_t block = block_manager_.cached_block(hashes[i]);
    if (block >= 0) {
      const EvictedBlock content = block_manager_.Content(block);
      if (!Verified(content, block_tokens, parent_id, cache_salt)) break;
      parent_id = content.content_id;
      host_tier_->FreeReserved(slot);
      continue;
    }
    if (const std::optional<HostKvTier::Hit> hit =
            host_tier_->Find(hashes[i], block_tokens, parent_id, cache_salt)) {
      parent_id = hit->content_id;
      host_tier_->FreeReserved(slot);
      continue;
    }
    if (host_tier_->holds_hash(hashes[i])) break;  // other content under the hash
    const uint64_t content_id = block_manager_.NewContentId();
    const EvictedBlock content{-1, hashes[i], block_tokens, content_id, parent_id, cache_salt};
    if (!host_tier_->StoreFetched(slot, content)) break;
    if (keep != nullptr) {
      host_tier_->Hold(slot);
      keep->slots.push_back(slot);
    }
    parent_id = content_id;
    ++stored;
  }
  // A chain broken on the way: the rest cannot be verified here, so it is dropped.
  for (size_t rest = i; rest < import.slots.size(); ++rest) {
    if (host_tier_->reserved(import.slots[rest])) host_tier_->FreeReserved(import.slots[rest]);
  }
  return stored;
}

void Scheduler::SetHostTail(uint64_t seq_id, int32_t slot, uint64_t generation) {
  Sequence* seq = Find(seq_id);
  if (seq == nullptr || seq->status != SequenceStatus::kWaiting) {
    ReleaseSlots(HeldSlots{{slot}, generation}, /*import=*/true);
    return;
  }
  DropHostTail(*seq);
  seq->host_tail_slot = slot;
  seq->host_tail_generation = generation;
}

bool Scheduler::HostTailFits(const Sequence& seq, int64_t cached_blocks) const {
  const int64_t prompt = static_cast<int64_t>(seq.prompt_ids.size());
  // Its first output is the next token to compute: the tail holds the rest of the prompt.
  return host_tier_ != nullptr && seq.host_tail_generation == host_tier_->generation() &&
         host_tier_->reserved(seq.host_tail_slot) && prompt % config_.block_size != 0 &&
         cached_blocks == prompt / config_.block_size && seq.num_known_tokens() == prompt + 1 &&
         seq.score_prompt_from == 0;
}

void Scheduler::ReloadHostTail(Sequence& seq) {
  absl::StatusOr<std::vector<int32_t>> block = block_manager_.Allocate(1);
  LOOM_CHECK(block.ok());  // the caller counted the blocks
  host_tier_->LoadReserved(seq.host_tail_slot, block->front());
  seq.blocks.push_back(block->front());
  seq.host_tail_slot = -1;
}

void Scheduler::DropHostTail(Sequence& seq) {
  if (seq.host_tail_slot < 0) return;
  ReleaseSlots(HeldSlots{{seq.host_tail_slot}, seq.host_tail_generation}, /*import=*/true);
  seq.host_tail_slot = -1;
}

void Scheduler::ReleaseClosedImport(const HeldSlots& held, uint64_t hold_id) {
  if (host_tier_ == nullptr) return;
  ReleaseSlots(held, /*import=*/true);
  host_tier_->CloseHold(hold_id, held.slots);
}

void Scheduler::ReleaseSlots(const HeldSlots& held, bool import) {
  // Whatever the tier's generation: a Forget keeps held slots held (the workers' slots
  // are the same memory, and transfers may still use them) until this.
  if (host_tier_ == nullptr) return;
  for (const int32_t slot : held.slots) {
    if (import) {
      if (host_tier_->reserved(slot)) host_tier_->FreeReserved(slot);
    } else {
      host_tier_->Release(slot);
    }
  }
}

std::vector<int32_t> Scheduler::HoldPoolPrefix(absl::Span<const BlockHash> hashes,
                                               absl::Span<const int32_t> tokens,
                                               std::string_view cache_salt) {
  const BlockManager::PrefixMatch match = block_manager_.MatchPrefix(hashes, tokens, cache_salt);
  // Referenced like a sequence's prefix: a free cached block is revived, not evicted.
  return block_manager_.TakeCachedPrefix(hashes, match.num_blocks);
}

std::vector<int32_t> Scheduler::ReservePoolImport(int64_t count) {
  if (count <= 0) return {};
  absl::StatusOr<std::vector<int32_t>> blocks = block_manager_.Allocate(count);
  return blocks.ok() ? *std::move(blocks) : std::vector<int32_t>{};
}

int64_t Scheduler::CommitPoolImport(absl::Span<const int32_t> blocks,
                                    absl::Span<const BlockHash> hashes,
                                    absl::Span<const int32_t> tokens, std::string_view cache_salt,
                                    std::vector<int32_t>* keep) {
  const size_t block_size = static_cast<size_t>(config_.block_size);
  uint64_t parent_id = 0;
  std::vector<int32_t> released;
  int64_t stored = 0;
  size_t i = 0;
  for (; i < blocks.size() && i < hashes.size() && (i + 1) * block_size <= tokens.size(); ++i) {
    const absl::Span<const int32_t> block_tokens = tokens.subspan(i * block_size, block_size);
    // What this replica's pool holds already stays; the transferred copy chains after it.
    if (const int32_t held = block_manager_.cached_block(hashes[i]); held >= 0) {
      const EvictedBlock content = block_manager_.Content(held);
      if (!Verified(content, block_tokens, parent_id, cache_salt)) break;
      parent_id = content.content_id;
      released.push_back(blocks[i]);
      continue;
    }
    // The same content in the host tier keeps its identity (a later reload of it chains).
    uint64_t content_id = 0;
    if (host_tier_ != nullptr) {
      if (const std::optional<HostKvTier::Hit> hit =
              host_tier_->Find(hashes[i], block_tokens, parent_id, cache_salt)) {
        content_id = hit->content_id;
      }
    }
    if (content_id == 0) content_id = block_manager_.NewContentId();
    if (!block_manager_.RestoreBlock(blocks[i], hashes[i], block_tokens, content_id, parent_id,
                                     cache_salt)) {
      break;
    }
    keep->push_back(blocks[i]);
    parent_id = content_id;
    ++stored;
  }
  // A chain broken on the way: the rest cannot be verified here.
  released.insert(released.end(), blocks.begin() + static_cast<ptrdiff_t>(i), blocks.end());
  ReleasePoolBlocks(released);
  return stored;
}

void Scheduler::ReleasePoolBlocks(absl::Span<const int32_t> blocks) {
  const absl::Status freed = block_manager_.Free(blocks);
  LOOM_CHECK(freed.ok());  // every block was referenced by the hold
}

}  // namespace loom::engine
