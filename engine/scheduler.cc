#include "engine/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/check.h"

namespace loom::engine {
namespace {

int64_t CeilDiv(int64_t numerator, int64_t denominator) {
  return (numerator + denominator - 1) / denominator;
}

// Tokens of `seq` known but not yet scheduled for compute.
int32_t PendingTokens(const Sequence& seq) { return seq.num_known_tokens() - seq.num_computed; }

// A sequence with every output produced or on its way only waits for its results (and
// for Finish): scheduling more compute would sample past max_tokens.
bool HasAllOutputs(const Sequence& seq) {
  return seq.num_outputs_expected() >= seq.max_tokens;
}

}  // namespace

bool Scheduler::SchedulingOrder::operator()(const Sequence* a, const Sequence* b) const {
  return std::tie(a->priority, a->arrival, a->seq_id) <
         std::tie(b->priority, b->arrival, b->seq_id);
}

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), block_manager_(config.num_blocks, config.block_size), speculation_policy_(config.speculation) {
  block_manager_.set_record_events(config.record_kv_events);
  if (config.num_host_blocks > 0 && config.enable_prefix_caching) {
    host_tier_ = std::make_unique<HostKvTier>(config.num_host_blocks, config.block_size);
    host_tier_->set_record_events(config.record_kv_events);
    block_manager_.set_eviction_callback(
        [tier = host_tier_.get()](const EvictedBlock& evicted) { tier->Demote(evicted); });
  }
  // The replica validated its configuration; nonsense here is a bug.
  LOOM_CHECK(config.block_size > 0);
  LOOM_CHECK(config.max_num_batched_tokens > 0);
  LOOM_CHECK(config.max_num_seqs > 0);
  LOOM_CHECK(config.max_waiting >= 0);
}

int64_t MaxBlocksHeld(const SchedulerConfig& config, int64_t tokens) {
  const int64_t all = CeilDiv(tokens, config.block_size);
  if (config.sliding_window <= 0) return all;
  // The window and the read-behind margin before a step's first query, the step's tokens,
  // a partial block at either end (the first plan, which frees nothing yet, is one step).
  return std::min<int64_t>(
      all, CeilDiv(config.sliding_window + kWindowReadBehind + config.max_num_batched_tokens,
                   config.block_size) +
               2);
}

absl::Status Scheduler::Add(std::unique_ptr<Sequence> seq) {
  if (seq == nullptr) return absl::InvalidArgumentError("no sequence to add");
  const uint64_t id = seq->seq_id;
  if (seq->prompt_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " has an empty prompt"));
  }
  if (seq->max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", id, ": max_tokens is ", seq->max_tokens, ", must be >= 1"));
  }
  if (static_cast<int64_t>(seq->output_ids.size()) >= seq->max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " already has ",
                                                   seq->output_ids.size(),
                                                   " outputs of max_tokens ", seq->max_tokens));
  }
  if (sequences_.contains(id) || absl::c_linear_search(finished_ids_, id)) {
    return absl::InvalidArgumentError(absl::StrCat("sequence id ", id, " is in use"));
  }
  const int64_t max_length = static_cast<int64_t>(seq->prompt_ids.size()) + seq->max_tokens;
  const int64_t blocks_needed = MaxBlocksHeld(config_, max_length);
  if (blocks_needed > block_manager_.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", id, " can never fit: prompt ", seq->prompt_ids.size(), " + max_tokens ",
        seq->max_tokens, " tokens need ", blocks_needed, " KV blocks of ", config_.block_size,
        " tokens, the pool has ", block_manager_.num_blocks()));
  }
  if (static_cast<int64_t>(waiting_.size()) >= config_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the waiting queue is full (", waiting_.size(), " sequences)"));
  }

  // The scheduling bookkeeping is ours: nothing of it is on any worker yet. Outputs the
  // sequence brings (requeued from another replica) are recomputed like the prompt.
  seq->status = SequenceStatus::kWaiting;
  seq->num_computed = 0;
  seq->samples_in_flight = 0;
  seq->speculative_in_flight = 0;
  seq->blocks.clear();
  seq->num_registered_blocks = 0;
  seq->num_cached_tokens = 0;
  seq->on_worker = false;
  seq->held_blocks = 0;
  seq->host_tail_slot = -1;
  seq->arrival = ++next_arrival_;
  Sequence* raw = seq.get();
  sequences_.emplace(id, Entry{std::move(seq), 0});
  waiting_.insert(raw);
  return absl::OkStatus();
}

SchedulerOutput Scheduler::Schedule() {
  ++step_;
  preempted_this_step_ = false;
  // Sequences released by the previous plan can no longer be named by a plan in flight
  // once this one is being built (the caller applied that plan's predecessor already).
  released_.clear();
  std::swap(released_, finishing_);

  // Blocks filled by the plans sent so far can be shared from now on (see the class
  // comment for why not earlier).
  if (config_.enable_prefix_caching) {
    for (Sequence* seq : running_) RegisterFullBlocks(*seq);
  }

  SchedulerOutput out;
  out.finished.swap(finished_ids_);
  int64_t budget = config_.max_num_batched_tokens;

  decode_candidates_.clear();
  prefill_candidates_.clear();
  for (Sequence* seq : running_) {
    // A speculative step in flight: where it continues is known once its result is back.
    if (HasAllOutputs(*seq) || seq->speculative_in_flight > 0) continue;
    if (!config_.overlap_samples && seq->samples_in_flight > 0) continue;
    const int32_t pending = PendingTokens(*seq);
    if (pending == 1) {
      decode_candidates_.push_back(seq);
    } else if (pending > 1) {
      prefill_candidates_.push_back(seq);
    }
  }

  // (1) Decodes, one token each (plus drafts when they speculate): they keep their
  // streams moving.
  ChooseSpeculation(budget);
  const int64_t max_decodes =
      config_.micro_batches > 1
          ? (static_cast<int64_t>(running_.size()) + config_.micro_batches - 1) /
                config_.micro_batches
          : std::numeric_limits<int64_t>::max();
  int64_t decodes = 0;
  for (size_t i = 0; i < decode_candidates_.size(); ++i) {
    Sequence* seq = decode_candidates_[i];
    if (budget == 0 || decodes == max_decodes) break;
    if (seq->status != SequenceStatus::kRunning) continue;  // preempted by this plan
    // Drafts only where the budget and the free blocks allow: never preempt for them.
    int32_t drafts = static_cast<int32_t>(std::min<int64_t>(decode_drafts_[i], budget - 1));
    while (drafts > 0 && BlocksNeeded(*seq, 1 + drafts) > block_manager_.num_free()) --drafts;
    if (ScheduleRunning(seq, 1, drafts, out)) {
      budget -= 1 + drafts;
      ++decodes;
    }
  }
  // (2) The next prefill chunks of running sequences, then (3) admissions: beside decodes
  // max_prefill_tokens_beside_decodes tokens at most, and while sequences wait the running
  // chunks take half of that: a short prompt that arrives behind a long prefill starts in
  // the next step, not after the long prompt's last chunk. A cap of one token goes to a
  // waiting hand-off, whose room is held (its admission cannot fail for blocks).
  int64_t chunk_budget = budget;
  if (const int64_t cap = config_.max_prefill_tokens_beside_decodes;
      (decodes > 0 || config_.cap_prefill_without_decodes) && cap > 0) {
    budget = std::min(budget, cap);
    chunk_budget =
        waiting_.empty() ? budget : std::max<int64_t>(budget / 2, held_for_waiting_ > 0 ? 0 : 1);
  }
  // Sequences whose stream has started (handed off after their first token elsewhere, or
  // preempted) recompute ahead of prompts: their wait is a gap between tokens, and with a
  // small cap a long prompt first in line would hold theirs for its whole prefill.
  std::stable_partition(prefill_candidates_.begin(), prefill_candidates_.end(),
                        [](const Sequence* seq) { return !seq->output_ids.empty(); });
  for (Sequence* seq : prefill_candidates_) {
    if (budget == 0 || chunk_budget == 0) break;
    if (seq->status != SequenceStatus::kRunning) continue;
    const int32_t count = static_cast<int32_t>(
        std::min<int64_t>(PendingTokens(*seq), std::min(budget, chunk_budget)));
    if (ScheduleRunning(seq, count, 0, out)) {
      budget -= count;
      chunk_budget -= count;
    }
  }
  // (3) Admit waiting sequences. Not after a preemption: blocks are short, and a
  // sequence preempted by this plan must not come back in it.
  if (!preempted_this_step_) {
    auto room = [&] {
      return budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_num_seqs;
    };
    // Preempted with a sample in flight: its recompute must include that token.
    auto blocked = [this](const Sequence& seq) {
      return seq.samples_in_flight > 0 || HasAllOutputs(seq);
    };
    // Hand-offs with blocks held for them first: their decode replica promised them room
    // when it sent their prompts to be prefilled elsewhere, not a place in this queue.
    for (auto it = waiting_.begin(); held_for_waiting_ > 0 && it != waiting_.end() && room();) {
      Sequence* seq = *it++;
      if (seq->held_blocks > 0 && !blocked(*seq)) TryAdmit(seq, budget, out);
    }
    auto it = waiting_.begin();
    while (it != waiting_.end() && room()) {
      Sequence* seq = *it;
      if (blocked(*seq)) {
        ++it;
        continue;
      }
      // Strict order: when the head does not fit, nothing behind it jumps the queue.
      ++it;
      if (!TryAdmit(seq, budget, out)) break;
    }
  }
  // Offloads (pool blocks this plan evicted) and reloads, in the order they happened.
  if (host_tier_ != nullptr) {
    out.kv_copies = host_tier_->TakeCopies();
    out.kv_push_holds_closed = host_tier_->TakeClosedHolds();
  }
  out.kv_push_holds_closed.insert(out.kv_push_holds_closed.end(), closed_pool_holds_.begin(),
                                  closed_pool_holds_.end());
  closed_pool_holds_.clear();
  return out;
}

void Scheduler::ChooseSpeculation(int64_t budget) {
  const size_t count = decode_candidates_.size();
  decode_drafts_.assign(count, 0);
  draft_limits_.assign(count, 0);
  draft_stats_.assign(count, nullptr);
  bool any = false;
  for (size_t i = 0; i < count; ++i) {
    const Sequence& seq = *decode_candidates_[i];
    // Never draft past max_tokens: the step emits at most 1 + drafts outputs.
    const int32_t room = seq.max_tokens - seq.num_outputs_expected() - 1;
    draft_limits_[i] =
        config_.overlap_samples ? std::max(0, std::min(seq.max_speculative_tokens, room)) : 0;
    draft_stats_[i] = &seq.speculation;
    any = any || draft_limits_[i] > 0;
  }
  if (!any) return;
  // The step's other tokens: the prefill chunks it will likely carry.
  int64_t other = 0;
  for (const Sequence* seq : prefill_candidates_) other += PendingTokens(*seq);
  other = std::min<int64_t>(other, std::max<int64_t>(0, budget - static_cast<int64_t>(count)));
  const bool other_work = running_.size() > 1 || !waiting_.empty();
  speculation_policy_.Choose(draft_limits_, draft_stats_, other, other_work, decode_drafts_);
}

bool Scheduler::TryAdmit(Sequence* seq, int64_t& budget, SchedulerOutput& out) {
  const int32_t count = AdmitWithCachedPrefix(*seq, budget, num_held_blocks() - seq->held_blocks);
  if (count == 0) return false;
  waiting_.erase(seq);
  held_for_waiting_ -= seq->held_blocks;
  seq->held_blocks = 0;
  seq->status = SequenceStatus::kRunning;
  running_.insert(seq);
  Emit(seq, count, 0, out);
  budget -= count;
  return true;
}

void Scheduler::HoldBlocksFor(uint64_t seq_id, int64_t blocks) {
  Sequence* seq = Find(seq_id);
  if (seq == nullptr || seq->status != SequenceStatus::kWaiting || blocks <= 0) return;
  held_for_waiting_ += blocks - seq->held_blocks;
  seq->held_blocks = static_cast<int32_t>(blocks);
}

int32_t Scheduler::AdmitWithCachedPrefix(Sequence& seq, int64_t budget, int64_t held_for_others) {
  LOOM_CHECK(seq.blocks.empty() && seq.num_computed == 0);
  BlockManager::PrefixMatch match;
  int64_t max_blocks = 0;
  if (config_.enable_prefix_caching) {
    // The block holding the last known token is never taken from the cache: computing
    // that token is what produces the logits to sample from.
    max_blocks = (seq.num_known_tokens() - 1) / config_.block_size;
    // A scoring sequence computes every position from the one that predicts its first
    // scored token on.
    if (seq.score_prompt_from > 0) {
      max_blocks = std::min<int64_t>(max_blocks, (seq.score_prompt_from - 1) / config_.block_size);
    }
    ExtendHashes(seq, max_blocks);
    match = block_manager_.MatchPrefix(
        absl::MakeConstSpan(seq.block_hashes).first(static_cast<size_t>(max_blocks)),
        AppliedTokens(seq, max_blocks * config_.block_size), seq.cache_salt);
  }
  host_hits_.clear();
  if (host_tier_ != nullptr && match.num_blocks < max_blocks) {
    MatchHostPrefix(seq, match.num_blocks, max_blocks, match.last_content_id);
  }
  const int64_t num_host = static_cast<int64_t>(host_hits_.size());
  const int64_t prompt = static_cast<int64_t>(seq.prompt_ids.size());
  // A hand-off whose prefill replica pushed its partial last block too: the prompt is whole.
  const bool tail = seq.host_tail_slot >= 0 && HostTailFits(seq, match.num_blocks + num_host);
  if (seq.host_tail_slot >= 0 && !tail) DropHostTail(seq);
  const int64_t cached_tokens = tail ? prompt : (match.num_blocks + num_host) * config_.block_size;
  const int32_t count =
      static_cast<int32_t>(std::min<int64_t>(seq.num_known_tokens() - cached_tokens, budget));
  // Reviving a free cached block uses up a free block just like allocating one; a reload
  // takes a fresh block like a recompute.
  const int64_t blocks_needed =
      CeilDiv(cached_tokens + count, config_.block_size) - match.num_blocks + match.num_free_blocks;
  if (blocks_needed > block_manager_.num_free() - held_for_others) return 0;
  seq.blocks = block_manager_.TakeCachedPrefix(seq.block_hashes, match.num_blocks);
  if (num_host > 0) ReloadHostPrefix(seq);
  if (tail) ReloadHostTail(seq);
  seq.num_computed = static_cast<int32_t>(cached_tokens);
  seq.num_registered_blocks = static_cast<int32_t>(match.num_blocks + num_host);
  seq.num_cached_tokens = static_cast<int32_t>(cached_tokens);
  num_prompt_tokens_admitted_ += prompt;
  num_cached_tokens_admitted_ += std::min<int64_t>(cached_tokens, prompt);
  num_host_tokens_admitted_ +=
      std::clamp<int64_t>(prompt - match.num_blocks * config_.block_size, 0,
                          cached_tokens - match.num_blocks * config_.block_size);
  return count;
}

void Scheduler::MatchHostPrefix(Sequence& seq, int64_t first, int64_t max_blocks,
                                uint64_t parent_id) {
  const absl::Span<const int32_t> tokens = AppliedTokens(seq, max_blocks * config_.block_size);
  for (int64_t b = first; b < max_blocks; ++b) {
    const BlockHash& hash = seq.block_hashes[static_cast<size_t>(b)];
    // The pool holds this hash with other content (its match stopped here): a reload
    // could not be registered under it.
    if (block_manager_.holds_hash(hash)) break;
    const std::optional<HostKvTier::Hit> hit =
        host_tier_->Find(hash,
                         tokens.subspan(static_cast<size_t>(b * config_.block_size),
                                        static_cast<size_t>(config_.block_size)),
                         parent_id, seq.cache_salt);
    if (!hit.has_value()) break;
    host_hits_.push_back(*hit);
    parent_id = hit->content_id;
  }
  // Reload only what is cheaper than recomputing, as measured: the worker's load time
  // per block against the step cost model's time for those tokens.
  if (!host_hits_.empty() &&
      !TransferPays(config_.host_load_seconds_per_block, static_cast<int64_t>(host_hits_.size()),
                    config_.block_size, speculation_policy_.cost_model())) {
    host_hits_.clear();
  }
}

void Scheduler::ReloadHostPrefix(Sequence& seq) {
  // Offloads that the allocations below trigger must not reuse the slots being read.
  for (const HostKvTier::Hit& hit : host_hits_) host_tier_->Hold(hit.slot);
  for (const HostKvTier::Hit& hit : host_hits_) {
    absl::StatusOr<std::vector<int32_t>> block = block_manager_.Allocate(1);
    LOOM_CHECK(block.ok());  // the caller counted the blocks
    const HostKvTier::Content content = host_tier_->Promote(hit.slot, block->front());
    // The chain's earlier blocks are in use, so nothing evicted them; the hash was not
    // held (MatchHostPrefix), so the registration takes.
    const bool restored =
        block_manager_.RestoreBlock(block->front(), content.hash, content.tokens,
                                    content.content_id, content.parent_id, seq.cache_salt);
    LOOM_CHECK(restored);
    seq.blocks.push_back(block->front());
  }
  for (const HostKvTier::Hit& hit : host_hits_) host_tier_->Release(hit.slot);
}

std::vector<KvCacheEvent> Scheduler::TakeKvEvents() {
  std::vector<KvCacheEvent> events = block_manager_.TakeEvents();
  if (host_tier_ == nullptr) return events;
  std::vector<KvCacheEvent> tier = host_tier_->TakeEvents();
  events.insert(events.end(), tier.begin(), tier.end());
  std::vector<KvCacheEvent> merged;
  absl::flat_hash_set<BlockHash> seen;
  for (const KvCacheEvent& event : events) {
    if (!seen.insert(event.hash).second) continue;
    const bool held = block_manager_.holds_hash(event.hash) || host_tier_->holds_hash(event.hash);
    merged.push_back(
        {held ? KvCacheEvent::Kind::kStored : KvCacheEvent::Kind::kRemoved, event.hash});
  }
  return merged;
}

absl::Span<const int32_t> Scheduler::AppliedTokens(const Sequence& seq, int64_t num_tokens) {
  if (num_tokens <= static_cast<int64_t>(seq.prompt_ids.size())) return seq.prompt_ids;
  // They reach into the outputs: prompt + outputs, contiguous.
  token_scratch_.assign(seq.prompt_ids.begin(), seq.prompt_ids.end());
  token_scratch_.insert(token_scratch_.end(), seq.output_ids.begin(), seq.output_ids.end());
  return token_scratch_;
}

void Scheduler::ExtendHashes(Sequence& seq, int64_t num_blocks) {
  if (static_cast<int64_t>(seq.block_hashes.size()) >= num_blocks) return;
  ExtendBlockHashes(seq.hash_seed, AppliedTokens(seq, num_blocks * config_.block_size),
                    config_.block_size, num_blocks, &seq.block_hashes);
}

void Scheduler::RegisterFullBlocks(Sequence& seq) {
  // Full blocks whose tokens were all scheduled for compute by plans already sent and
  // whose ids are known here (a sampled token's id is known once its result is applied).
  const int64_t applied = static_cast<int64_t>(seq.prompt_ids.size() + seq.output_ids.size());
  const int64_t full_blocks =
      std::min<int64_t>(std::min<int64_t>(seq.num_computed, applied) / config_.block_size,
                        static_cast<int64_t>(seq.blocks.size()));
  if (full_blocks <= seq.num_registered_blocks) return;
  ExtendHashes(seq, full_blocks);
  const absl::Span<const int32_t> tokens = AppliedTokens(seq, full_blocks * config_.block_size);
  for (int64_t b = seq.num_registered_blocks; b < full_blocks; ++b) {
    const int32_t block = seq.blocks[static_cast<size_t>(b)];
    const int32_t parent =
        b == 0 ? BlockManager::kNoParent : seq.blocks[static_cast<size_t>(b - 1)];
    // Freed behind a sliding window before it was offered (FreeBehindWindow frees only
    // registered blocks, so this is a guard, not a path).
    if (block == kFreedBlock || (b > 0 && parent == kFreedBlock)) continue;
    // False when another block already holds this content (that copy stays the cached
    // one) or a collision was caught.
    block_manager_.RegisterBlock(block, seq.block_hashes[static_cast<size_t>(b)],
                                 tokens.subspan(static_cast<size_t>(b * config_.block_size),
                                                static_cast<size_t>(config_.block_size)),
                                 parent, seq.cache_salt);
  }
  seq.num_registered_blocks = static_cast<int32_t>(full_blocks);
}

int64_t Scheduler::BlocksNeeded(const Sequence& seq, int32_t num_tokens) const {
  return CeilDiv(static_cast<int64_t>(seq.num_computed) + num_tokens, config_.block_size) -
         static_cast<int64_t>(seq.blocks.size());
}

bool Scheduler::ScheduleRunning(Sequence* seq, int32_t num_tokens, int32_t num_drafts,
                                SchedulerOutput& out) {
  while (BlocksNeeded(*seq, num_tokens + num_drafts) > block_manager_.num_free()) {
    // `seq` itself has not been scheduled in this plan, so there is always a victim.
    Sequence* victim = PickVictim();
    LOOM_CHECK(victim != nullptr);
    Preempt(victim, out);
    if (victim == seq) return false;
  }
  Emit(seq, num_tokens, num_drafts, out);
  return true;
}

void Scheduler::Emit(Sequence* seq, int32_t num_tokens, int32_t num_drafts,
                     SchedulerOutput& out) {
  const int32_t pending = PendingTokens(*seq);
  LOOM_CHECK(num_tokens >= 1 && num_tokens <= pending);
  auto entry = sequences_.find(seq->seq_id);
  LOOM_CHECK(entry != sequences_.end());
  entry->second.scheduled_in_step = step_;

  ScheduledWork& work = out.scheduled.emplace_back();
  work.seq = seq;
  work.is_new = !seq->on_worker;
  // A new sequence's table goes to the worker whole; it frees from its next plan on.
  if (!work.is_new) FreeBehindWindow(*seq);
  // A new sequence's cached prefix is already computed; the worker starts there.
  if (work.is_new) work.num_cached_tokens = seq->num_computed;
  seq->on_worker = true;
  // Speculation only extends a decode (the worker verifies drafts after a sampled token).
  LOOM_CHECK(num_drafts == 0 || (num_tokens == pending && pending == 1));
  const int64_t blocks_needed = BlocksNeeded(*seq, num_tokens + num_drafts);
  if (blocks_needed > 0) {
    absl::StatusOr<std::vector<int32_t>> blocks = block_manager_.Allocate(blocks_needed);
    LOOM_CHECK(blocks.ok());  // the caller made room
    work.new_block_ids = *std::move(blocks);
    seq->blocks.insert(seq->blocks.end(), work.new_block_ids.begin(),
                       work.new_block_ids.end());
  }
  // The worker's table of a new sequence is empty: it gets every block, cached ones first.
  if (work.is_new) work.new_block_ids = seq->blocks;
  work.num_tokens = num_tokens;
  if (pending == 1) {
    out.num_decode_tokens += 1;
  } else {
    out.num_prefill_tokens += num_tokens;
  }
  seq->num_computed += num_tokens;
  // Computing the last known token yields the next one: sample it. Its id joins the
  // known tokens at once, so the next plan can schedule its decode before it comes back.
  if (num_tokens == pending) {
    work.sample = true;
    ++seq->samples_in_flight;
  }
  if (num_drafts > 0) {
    work.num_speculative_tokens = num_drafts;
    seq->speculative_in_flight = num_drafts;
    out.num_speculative_tokens += num_drafts;
  }
}

Sequence* Scheduler::PickVictim() {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    auto entry = sequences_.find((*it)->seq_id);
    LOOM_CHECK(entry != sequences_.end());
    if (entry->second.scheduled_in_step != step_) return *it;
  }
  return nullptr;
}

void Scheduler::Preempt(Sequence* seq, SchedulerOutput& out) {
  LOOM_CHECK(seq->status == SequenceStatus::kRunning);
  running_.erase(seq);
  // What it computed stays cached for its recompute (unless evicted meanwhile).
  if (config_.enable_prefix_caching) RegisterFullBlocks(*seq);
  ReleaseBlocks(*seq);
  seq->num_computed = 0;
  seq->status = SequenceStatus::kWaiting;
  if (seq->on_worker) out.preempted.push_back(seq->seq_id);
  seq->on_worker = false;
  ++seq->num_preemptions;
  ++num_preemptions_;
  preempted_this_step_ = true;
  // It keeps its arrival, so it sorts ahead of everything that arrived after it.
  waiting_.insert(seq);
}

void Scheduler::ReleaseBlocks(Sequence& seq) {
  // Tail first: the least shareable blocks become the first candidates for reuse.
  for (auto it = seq.blocks.rbegin(); it != seq.blocks.rend(); ++it) {
    if (*it == kFreedBlock) continue;
    const absl::Status status = block_manager_.Free(absl::MakeConstSpan(&*it, 1));
    LOOM_CHECK(status.ok());  // a block table names only blocks it holds
  }
  seq.blocks.clear();
  seq.num_registered_blocks = 0;
  seq.num_window_freed = 0;
}

void Scheduler::FreeBehindWindow(Sequence& seq) {
  if (config_.sliding_window <= 0) return;
  // The plan being built and every later one compute queries at num_computed or after:
  // none reads a key before num_computed - window + 1, nor a kernel before that less
  // kWindowReadBehind. Plans already sent ran (or run) before anything this plan
  // allocates is written: the worker executes plans in order.
  const int64_t first_read =
      static_cast<int64_t>(seq.num_computed) - config_.sliding_window + 1 - kWindowReadBehind;
  if (first_read <= 0) return;
  const int64_t dead =
      std::min<int64_t>(first_read / config_.block_size, static_cast<int64_t>(seq.blocks.size()));
  // Registered blocks stay cached for other sequences, as on release; a block is freed
  // only after its registration (at the start of the Schedule that follows its plan).
  for (int64_t b = seq.num_window_freed; b < dead; ++b) {
    int32_t& block = seq.blocks[static_cast<size_t>(b)];
    const absl::Status status = block_manager_.Free(absl::MakeConstSpan(&block, 1));
    LOOM_CHECK(status.ok());
    block = kFreedBlock;
    ++num_window_freed_blocks_;
  }
  seq.num_window_freed = static_cast<int32_t>(std::max<int64_t>(seq.num_window_freed, dead));
}

Sequence* Scheduler::ApplyOutput(uint64_t seq_id, int32_t token_id) {
  return ApplyOutputs(seq_id, absl::MakeConstSpan(&token_id, 1), false, 0, 0);
}

Sequence* Scheduler::ApplyOutputs(uint64_t seq_id, absl::Span<const int32_t> token_ids,
                                  bool speculative, int32_t num_draft_tokens,
                                  int32_t num_accepted) {
  auto entry = sequences_.find(seq_id);
  if (entry == sequences_.end()) return nullptr;
  Sequence* seq = entry->second.seq.get();
  // No sample was scheduled, or not this kind: a stale or malformed result, dropped like
  // an unknown id.
  // (A plain decode's result may arrive while the next plan's speculative step for the
  // same sequence is in flight: it applies as usual.)
  if (seq->samples_in_flight == 0 || token_ids.empty()) return nullptr;
  if (speculative && seq->speculative_in_flight == 0) return nullptr;
  if (!speculative && token_ids.size() != 1) return nullptr;
  if (speculative && static_cast<int64_t>(token_ids.size()) > seq->speculative_in_flight + 1) {
    return nullptr;
  }
  // A preempted sequence keeps the tokens: its recompute includes them.
  seq->output_ids.insert(seq->output_ids.end(), token_ids.begin(), token_ids.end());
  --seq->samples_in_flight;
  if (speculative) {
    seq->speculative_in_flight = 0;
    seq->speculation.Record(num_draft_tokens,
                            std::min(num_accepted, static_cast<int32_t>(token_ids.size()) - 1));
    if (seq->status == SequenceStatus::kRunning) {
      // The accepted drafts' K/V are in the pool; the rejected ones' slots are free again.
      seq->num_computed += static_cast<int32_t>(token_ids.size()) - 1;
      const size_t needed =
          static_cast<size_t>(CeilDiv(seq->num_computed, config_.block_size));
      while (seq->blocks.size() > needed) {
        const absl::Status status = block_manager_.Free(absl::MakeConstSpan(&seq->blocks.back(), 1));
        LOOM_CHECK(status.ok());
        seq->blocks.pop_back();
      }
    }
  }
  return seq;
}

void Scheduler::Finish(uint64_t seq_id) {
  auto entry = sequences_.find(seq_id);
  if (entry == sequences_.end()) return;
  std::unique_ptr<Sequence> seq = std::move(entry->second.seq);
  sequences_.erase(entry);
  if (seq->status == SequenceStatus::kRunning) {
    running_.erase(seq.get());
  } else {
    waiting_.erase(seq.get());
    held_for_waiting_ -= seq->held_blocks;
    seq->held_blocks = 0;
    DropHostTail(*seq);
  }
  if (config_.enable_prefix_caching) RegisterFullBlocks(*seq);
  ReleaseBlocks(*seq);
  seq->status = SequenceStatus::kFinished;
  if (seq->on_worker) finished_ids_.push_back(seq_id);
  finishing_.push_back(std::move(seq));
}

std::vector<std::unique_ptr<Sequence>> Scheduler::TakeAll() {
  std::vector<std::unique_ptr<Sequence>> taken;
  taken.reserve(running_.size() + waiting_.size());
  for (const OrderedSequences* queue : {&running_, &waiting_}) {
    for (Sequence* seq : *queue) {
      ReleaseBlocks(*seq);
      seq->num_computed = 0;
      // The worker is gone: the samples it owed will never come back.
      seq->samples_in_flight = 0;
      seq->speculative_in_flight = 0;
      seq->on_worker = false;
      seq->held_blocks = 0;
      DropHostTail(*seq);
      seq->status = SequenceStatus::kWaiting;
      auto entry = sequences_.find(seq->seq_id);
      LOOM_CHECK(entry != sequences_.end());
      taken.push_back(std::move(entry->second.seq));
    }
  }
  running_.clear();
  waiting_.clear();
  sequences_.clear();
  held_for_waiting_ = 0;
  held_for_arrivals_ = 0;
  // Nothing is left on the worker to release.
  finished_ids_.clear();
  return taken;
}

Sequence* Scheduler::Find(uint64_t seq_id) {
  auto entry = sequences_.find(seq_id);
  return entry == sequences_.end() ? nullptr : entry->second.seq.get();
}

int32_t Scheduler::num_running() const { return static_cast<int32_t>(running_.size()); }

int32_t Scheduler::num_decoding() const {
  return static_cast<int32_t>(
      std::count_if(running_.begin(), running_.end(), [](const Sequence* seq) {
        return seq->num_computed >= static_cast<int64_t>(seq->prompt_ids.size());
      }));
}

int32_t Scheduler::num_waiting() const { return static_cast<int32_t>(waiting_.size()); }

int64_t Scheduler::num_prompt_tokens_pending() const {
  int64_t tokens = 0;
  for (const Sequence* seq : waiting_) tokens += seq->num_known_tokens() - seq->num_computed;
  for (const Sequence* seq : running_) {
    tokens +=
        std::max<int64_t>(static_cast<int64_t>(seq->prompt_ids.size()) - seq->num_computed, 0);
  }
  return tokens;
}

bool Scheduler::has_work() const {
  return !running_.empty() || !waiting_.empty() || !finished_ids_.empty() ||
         !closed_pool_holds_.empty() ||
         (host_tier_ != nullptr && (host_tier_->has_copies() || host_tier_->has_closed_holds()));
}

}  // namespace loom::engine
