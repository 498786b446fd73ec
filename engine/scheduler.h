#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "engine/block_manager.h"
#include "engine/host_kv_tier.h"
#include "engine/sequence.h"
#include "engine/speculation_policy.h"

namespace loom::engine {

struct SchedulerConfig {
  int32_t block_size = 16;
  int64_t num_blocks = 0;                 // the replica's KV pool
  int64_t max_num_batched_tokens = 512;   // tokens per step (decodes + prefill chunks)
  // Prefill tokens a step that carries decodes takes at most (0: the step's budget): each
  // prefill chunk beside decodes stalls them, so a replica whose decodes' inter-token
  // latency comes first (a decode replica of disaggregated serving) prefills in smaller
  // chunks; while sequences wait, running prefills take half of it (the rest admits). A
  // step without decodes uses its whole budget, unless cap_prefill_without_decodes.
  int64_t max_prefill_tokens_beside_decodes = 0;
  // The cap holds in steps without decodes too: on a decode replica hand-offs and short
  // prompts arrive while a step runs, and each would wait out the plans in flight (two
  // 512-token chunks: over a second on a CPU core) before its first decode.
  bool cap_prefill_without_decodes = false;
  int32_t max_num_seqs = 256;             // running sequences at most
  int64_t max_waiting = 1024;             // waiting queue bound (Add answers past it)
  // Reuse cached full blocks of earlier sequences (same tokens, same hash seed) instead of
  // recomputing them; off: every block is computed by the sequence that uses it.
  bool enable_prefix_caching = true;
  // Record KvCacheEvents for the cluster's KV index (TakeKvEvents drains them).
  bool record_kv_events = false;
  // Speculative decoding's policy (each sequence carries its own cap).
  SpeculationConfig speculation;
  // true: a decode may be planned while the sample it computes is still in flight (the
  // worker that sampled it knows the token). false (pipeline parallelism, whose first
  // stage never samples): a sequence waits for its sample's result, so each plan can name
  // the tokens it computes, and nothing speculates.
  bool overlap_samples = true;
  // Pipeline parallelism: the plans in flight are micro-batches, one per stage. A plan takes
  // at most ceil(running / micro_batches) decodes, so the running sequences split into that
  // many balanced groups instead of riding in one plan while the other stages idle (each
  // group's results come back at their own time and the split persists). 1: no cap.
  int32_t micro_batches = 1;
  // Sliding-window attention on every layer (Mistral 7B v0.1's 4096): a query attends to
  // its last `sliding_window` positions at most, so a sequence's blocks that lie wholly
  // before the window of every query it will still compute are freed as it moves on (a
  // registered one stays in the prefix cache). 0: a layer attends to everything (a model
  // whose global layers keep every position).
  int64_t sliding_window = 0;
  // The host KV tier (engine/host_kv_tier): slots of the workers' host memory that keep
  // cached blocks the pool evicts, reloaded on a later prefix hit. 0: none.
  int64_t num_host_blocks = 0;
  // Seconds to reload one block, measured by the worker at start-up: a host-tier hit is
  // reloaded when that is below the recompute time the step timings predict. 0: always.
  double host_load_seconds_per_block = 0;
};

/// How far before a window's first position the CPU attention kernels read (masked): they
/// start at that position rounded down to a chunk of 32 positions (AVX-512 per-token path)
/// or a KV tile (32 on AVX-512, 16 on AVX2). Blocks are freed only behind this margin too,
/// so no kernel reads a block another sequence reuses.
inline constexpr int64_t kWindowReadBehind = 32;

/// The most KV blocks a sequence of `tokens` tokens (prompt + max_tokens) holds at once
/// under `config`: all of them, or with a sliding window on every layer those of the
/// window, the read-behind margin and one step's tokens, and a partial block at either end.
/// What a pool must hold for the sequence to ever fit.
int64_t MaxBlocksHeld(const SchedulerConfig& config, int64_t tokens);

/// Whether bringing `blocks` blocks of `block_size` tokens from elsewhere (a host tier, another
/// replica) at `seconds_per_block` beats recomputing them, by `cost`'s measured time for a
/// step of those tokens. True when either side is unmeasured (0 seconds per block, or no
/// step recorded yet): moving KV is the optimistic default.
bool TransferPays(double seconds_per_block, int64_t blocks, int32_t block_size,
                  const StepCostModel& cost);

/// Disaggregated serving: the uncached prompt tokens past which a prompt is better
/// prefilled on another replica than here. Run here, a prefill of n tokens beside the
/// replica's `num_decodes` running decodes stalls their step by n times the per-token cost
/// (StepCostModel::SecondsPerToken, a line fitted to the measured steps). Sent away, it
/// costs a hand-off of `handoff_seconds` (the mean measured so far, 0 for hand-offs whose
/// KV was pushed as it was computed; nullopt: none yet) and frees nothing here below one
/// decode step (cost(b)). The limit is the smallest n (a power of two from 16) whose stall
/// exceeds both; 512 before two step sizes were measured, and at least 512 before a
/// hand-off was.
int64_t LocalPrefillLimit(const StepCostModel& cost, int64_t num_decodes,
                          std::optional<double> handoff_seconds);

/// A decode replica's prefill chunk beside `num_decodes` running decodes: the most prompt
/// tokens whose cost (StepCostModel::PrefillSecondsPerToken) stays within one decode step
/// (cost(b)), so a step with a chunk takes at most twice a step of the decodes alone and
/// their inter-token latency at most doubles (Sarathi-Serve's token budget, set from the
/// stall the decodes can take). At least 1 and at most `largest`, which it is without
/// decodes; 16 at most before a prompt token's cost is measured. LocalPrefillLimit rounds
/// up to a power of two from 16, a threshold for where a prompt runs; as a chunk it stalled
/// the decodes up to four times a step on a slow CPU.
int64_t PrefillChunkBesideDecodes(const StepCostModel& cost, int64_t num_decodes, int64_t largest);

/// How fast a replica gets through prompts, from its measured steps: what placement needs
/// to tell when a prompt put there now would have its first token.
struct PrefillRate {
  double seconds_per_token = 0;  // StepCostModel::SecondsPerToken (0: not measured yet)
  double step_seconds = 0;       // what a step costs besides its prompt tokens (its decodes)
  int64_t chunk = 0;             // prompt tokens per step at most (0: any)
  int64_t queued_tokens = 0;     // prompt tokens still to compute ahead of a new arrival
};

/// The PrefillRate of a replica measured by `cost` that runs `num_decodes` decodes beside
/// its prefill chunks of at most `chunk` tokens, with `queued_tokens` ahead: the fitted
/// slope and a decode step's cost, or where the measured step sizes give no slope (all
/// one size) a full chunk's measured step spread over its tokens.
PrefillRate MeasurePrefillRate(const StepCostModel& cost, int64_t num_decodes, int64_t chunk,
                               int64_t queued_tokens);

/// Seconds until the first token of a prompt of `tokens` uncached tokens submitted to a
/// replica of `rate`: the tokens ahead and its own at the measured slope, plus the fixed
/// cost of every step their chunks take. 0 when the rate is not measured.
double FirstTokenSeconds(const PrefillRate& rate, int64_t tokens);

/// One sequence's work in a plan.
struct ScheduledWork {
  Sequence* seq = nullptr;
  bool is_new = false;                 // the worker has no state: send a NewSequence first
  int32_t num_cached_tokens = 0;       // is_new: leading tokens already in its blocks
  // Appended to its block table by this plan; for a new sequence every block it holds,
  // the cached ones included.
  std::vector<int32_t> new_block_ids;
  int32_t num_tokens = 0;              // tokens [num_computed_before, +num_tokens)
  bool sample = false;                 // the last computed position is sampled
  int32_t num_speculative_tokens = 0;  // draft tokens the worker may verify after it
};

/// The next step's plan, before it becomes a loom.v1.StepPlan.
struct SchedulerOutput {
  std::vector<ScheduledWork> scheduled;  // decodes first, then prefill chunks
  std::vector<uint64_t> finished;        // released since the previous plan
  std::vector<uint64_t> preempted;       // preempted by this plan (state dropped on worker)
  std::vector<KvCopy> kv_copies;         // host tier copies, run before the forward pass
  // Push holds that ended (HostKvTier::CloseHold): closed on the workers before the copies.
  std::vector<uint64_t> kv_push_holds_closed;
  int64_t num_decode_tokens = 0;
  int64_t num_prefill_tokens = 0;
  int64_t num_speculative_tokens = 0;    // draft slots reserved by speculative decodes
  bool empty() const {
    return scheduled.empty() && finished.empty() && preempted.empty() && kv_copies.empty() &&
           kv_push_holds_closed.empty();
  }
};

/// Iteration-level continuous batching for one replica (Orca, vLLM's scheduler):
/// every step, running decodes first (1 token each), then prefill chunks of running and
/// then waiting sequences within the token budget, admitting waiting sequences by
/// (priority, arrival). When blocks run out, the lowest-priority, latest-arrived running
/// sequence is preempted by recompute (blocks freed, back to the front of its class in the
/// waiting queue). Plans may be built while earlier ones execute (see Sequence).
///
/// Prefix caching: a sequence being admitted takes the longest chain of cached full
/// blocks matching its tokens (never the block of its last known token: at least one
/// token is computed, to produce logits) and starts its computed count there. A full
/// block is registered in the cache once the plan computing it has been sent (at the next
/// Schedule, or when its sequence is released): plans run in order on the worker, so any
/// later plan that reuses it finds its K/V written. Blocks whose content includes a
/// sampled token are registered only once that token's id came back.
/// Not thread-safe: the replica's step loop owns it.
class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  /// Queues a new sequence (status kWaiting, no blocks). ResourceExhausted when the
  /// waiting queue holds max_waiting sequences; InvalidArgument when the sequence can
  /// never fit (prompt + max_tokens needs more blocks than the pool has) or its id is in
  /// use.
  absl::Status Add(std::unique_ptr<Sequence> seq);

  /// Builds the next plan and advances the sequences' bookkeeping as if it had been sent.
  SchedulerOutput Schedule();

  /// Applies a sampled token from a step result: appends it to output_ids and decrements
  /// samples_in_flight. Returns the sequence, or nullptr for an unknown or finished id
  /// (its output is dropped: e.g. it was aborted while the step ran).
  Sequence* ApplyOutput(uint64_t seq_id, int32_t token_id);

  /// Applies one sequence's outputs of a step result. A plain step brings one token; a
  /// speculative one (`speculative`: the plan asked it to) brings the `num_accepted`
  /// accepted drafts and one more token: they are appended, the drafts count as
  /// computed, the table gives back the blocks only rejected drafts used (tail first) and
  /// the sequence may be scheduled again. nullptr as ApplyOutput does, and for outputs
  /// that do not match what was scheduled (dropped).
  Sequence* ApplyOutputs(uint64_t seq_id, absl::Span<const int32_t> token_ids, bool speculative,
                         int32_t num_draft_tokens, int32_t num_accepted);

  /// Records a finished step's size (`num_decode_tokens` of its `num_tokens` decodes, the
  /// rest prompt tokens) and forward time for the speculation policy and placement.
  void RecordStep(int64_t num_tokens, double seconds, int64_t num_decode_tokens = 0) {
    speculation_policy_.RecordStep(num_tokens, seconds, num_decode_tokens);
  }
  const SpeculationPolicy& speculation_policy() const { return speculation_policy_; }

  /// Ends a sequence (finished, cancelled or failed): frees its blocks (tail first) and
  /// queues its id for the next plan's `finished` if the worker holds it. Waiting
  /// sequences are simply removed. Unknown ids are ignored. The Sequence object is
  /// destroyed once no plan in flight can name it (after the next Schedule()).
  void Finish(uint64_t seq_id);

  /// Drops every sequence (the replica's worker died): returns them, blocks freed,
  /// on_worker false, for the caller to fail or requeue elsewhere.
  std::vector<std::unique_ptr<Sequence>> TakeAll();

  /// The waiting or running sequence with this id; nullptr when unknown or finished.
  Sequence* Find(uint64_t seq_id);
  /// Sequences holding blocks (status kRunning), at most max_num_seqs.
  int32_t num_running() const;
  /// Running sequences past their prompt: the decodes a prefill chunk would stall.
  int32_t num_decoding() const;
  /// Sequences queued for admission, new or preempted.
  int32_t num_waiting() const;
  /// Prompt tokens (and a preempted sequence's outputs) still to compute, waiting and
  /// running: the prefill work queued here.
  int64_t num_prompt_tokens_pending() const;
  /// Something to schedule or to release. A plan may still come out empty (every
  /// sequence is waiting for results in flight): check SchedulerOutput::empty().
  bool has_work() const;
  const BlockManager& block_manager() const { return block_manager_; }
  /// The prefix-cache changes since the last call (record_kv_events), oldest first. With a
  /// host tier, a hash counts as held while the pool or the tier holds it (a reload is
  /// cheap, so routing should still prefer this replica): one event per hash that changed,
  /// its state now.
  std::vector<KvCacheEvent> TakeKvEvents();
  /// Drops every cached block from the prefix cache (a failed step may have left their
  /// K/V half written); blocks in use stay with their sequences.
  void ForgetPrefixCache() {
    block_manager_.ForgetCachedBlocks();
    if (host_tier_ != nullptr) host_tier_->Forget();
  }
  /// Before the first step: takes the blocks the workers still hold into the prefix cache
  /// (BlockManager::AdoptCachedBlocks); nothing with prefix caching off. Returns how many.
  int64_t AdoptPrefixCache(absl::Span<const AdoptedBlock> blocks) {
    return config_.enable_prefix_caching ? block_manager_.AdoptCachedBlocks(blocks) : 0;
  }
  // ---- fetching a prefix between replicas (engine/scheduler_transfer.cc) ----
  /// Slots of the host tier, held for a transfer, valid while the tier's generation is.
  struct HeldSlots {
    std::vector<int32_t> slots;
    uint64_t generation = 0;
    // ReserveImport: the tier's copy plan that last touched one of them (0: none;
    // HostKvTier::Reserve): the slots may be written once that plan ran.
    uint64_t last_copy_plan = 0;
  };
  /// The source side: the longest verified chain of `hashes` (the blocks of `tokens`,
  /// first salted with `cache_salt`) this replica holds, pool or host tier, as host slots
  /// held until ReleaseSlots. Blocks only in the pool are copied out (queued device-to-
  /// host copies: the next plan must run before the slots are read). Empty without a tier.
  HeldSlots ExportPrefix(absl::Span<const BlockHash> hashes, absl::Span<const int32_t> tokens,
                         std::string_view cache_salt);
  /// The destination side: `count` empty slots held for a fetch (fewer when the tier is
  /// busy). Then CommitImport once their bytes arrived, or ReleaseSlots if they did not.
  HeldSlots ReserveImport(int64_t count);
  /// These very slots held empty, as ReserveImport's, where the tier has not handed them
  /// out (HostKvTier::ReserveSlots): a new table's guard over slots that transfers of the
  /// replica's earlier workers may still touch. A slot named by several holds is freed by
  /// the last ReleaseSlots(held, /*import=*/false).
  HeldSlots ReserveSlots(absl::Span<const int32_t> slots);
  /// The fetched blocks `import` holds (the first hashes.size() blocks of `tokens`, as
  /// ExportPrefix named them) become host-tier content of this replica, chained after what
  /// its pool and tier already hold (those slots are freed). Returns the blocks stored.
  /// `keep`: the stored slots stay held there (not evicted by later imports and offloads
  /// before the request they came for is admitted) until ReleaseSlots(*keep, false).
  int64_t CommitImport(const HeldSlots& import, absl::Span<const BlockHash> hashes,
                       absl::Span<const int32_t> tokens, std::string_view cache_salt,
                       HeldSlots* keep = nullptr);
  /// Ends a hold: an export's slots can be reused, an import's are freed.
  void ReleaseSlots(const HeldSlots& held, bool import);
  /// Ends an import hold that other workers were told to write into as `hold_id`, any of
  /// whose writes may still come: freed, and closed on the workers by the next plan
  /// before any copy reuses its slots (HostKvTier::CloseHold).
  void ReleaseClosedImport(const HeldSlots& held, uint64_t hold_id);
  // ---- pool-to-pool transfers (engine/scheduler_transfer.cc) ----
  /// The source side: the blocks of the longest verified chain of `hashes` (the blocks of
  /// `tokens`, the first salted with `cache_salt`) in this replica's pool, each referenced
  /// (not evicted, not reused) until ReleasePoolBlocks. Its workers' pools are read by
  /// another replica's workers meanwhile (worker/kv_pool_transfer).
  std::vector<int32_t> HoldPoolPrefix(absl::Span<const BlockHash> hashes,
                                      absl::Span<const int32_t> tokens,
                                      std::string_view cache_salt);
  /// The destination side: `count` pool blocks referenced by no sequence, held for a
  /// transfer to write; empty when fewer are free (nothing taken). Then CommitPoolImport
  /// once the bytes arrived, or ReleasePoolBlocks if they did not.
  std::vector<int32_t> ReservePoolImport(int64_t count);
  /// The transferred blocks (the first hashes.size() blocks of `tokens`, in order) become
  /// cached prefix blocks of this replica, chained after what its pool already holds (a
  /// block whose content the pool holds already is released, as is the rest of a chain
  /// that cannot be verified here). Returns the blocks stored; those stay referenced in
  /// `keep` (not evicted before the request they came for is admitted) until
  /// ReleasePoolBlocks(*keep).
  int64_t CommitPoolImport(absl::Span<const int32_t> blocks, absl::Span<const BlockHash> hashes,
                           absl::Span<const int32_t> tokens, std::string_view cache_salt,
                           std::vector<int32_t>* keep);
  /// Drops the references HoldPoolPrefix, ReservePoolImport or CommitPoolImport took.
  void ReleasePoolBlocks(absl::Span<const int32_t> blocks);
  /// Ends a ReservePoolImport hold whose transfer failed while a worker may still be writing
  /// it as `hold_id`: the blocks are freed now, and the next plan closes the hold on the
  /// workers (StepPlan.kv_push_holds_closed) before it runs, so no write lands after it.
  void ReleaseClosedPoolImport(absl::Span<const int32_t> blocks, uint64_t hold_id) {
    ReleasePoolBlocks(blocks);
    closed_pool_holds_.push_back(hold_id);
  }
  /// HostKvTier::CloseEarlierHolds: a new table's first plan closes the holds the table
  /// before it named to writers that may still write.
  void CloseEarlierHolds(absl::Span<const uint64_t> hold_ids) {
    if (host_tier_ != nullptr) host_tier_->CloseEarlierHolds(hold_ids);
  }
  /// Whether `seq_id` finished and the plan telling the worker has not been built yet: the
  /// id cannot be added again until then (results of plans in flight may still name it).
  bool releasing(uint64_t seq_id) const { return absl::c_linear_search(finished_ids_, seq_id); }
  /// The host KV tier's table; nullptr without one.
  const HostKvTier* host_tier() const { return host_tier_.get(); }
  /// Prompt tokens admitted from the host tier (reloaded, a subset of the cached ones).
  int64_t num_host_tokens_admitted() const { return num_host_tokens_admitted_; }
  /// Prompt tokens admitted so far, and how many of them were served from the cache.
  int64_t num_prompt_tokens_admitted() const { return num_prompt_tokens_admitted_; }
  int64_t num_cached_tokens_admitted() const { return num_cached_tokens_admitted_; }
  uint64_t num_preemptions() const { return num_preemptions_; }
  /// Blocks freed because they fell behind every layer's sliding window (sliding_window).
  uint64_t num_window_freed_blocks() const { return num_window_freed_blocks_; }
  const SchedulerConfig& config() const { return config_; }

  // ---- disaggregated serving: free blocks held for hand-offs ----
  /// Blocks held for hand-offs placed on this replica that have not arrived (their prompts
  /// are computed on a prefill replica): admissions leave them free. Set before each plan.
  void set_blocks_held_for_arrivals(int64_t blocks) { held_for_arrivals_ = blocks; }
  /// SchedulerConfig::max_prefill_tokens_beside_decodes, from the next plan on.
  void set_max_prefill_tokens_beside_decodes(int64_t tokens, bool without_decodes = false) {
    config_.max_prefill_tokens_beside_decodes = tokens;
    config_.cap_prefill_without_decodes = without_decodes;
  }
  /// Holds `blocks` free blocks for the waiting sequence `seq_id` (a hand-off whose
  /// reservation arrived with it): other admissions leave them free, and it is admitted
  /// ahead of the queue's strict order when it fits in them. The hold ends when it is
  /// admitted or finished. Ignored for an unknown or running sequence.
  void HoldBlocksFor(uint64_t seq_id, int64_t blocks);
  /// A hand-off's last partial prompt block arrived in the reserved host slot `slot` (of
  /// the tier's generation `generation`): the waiting sequence `seq_id` reloads it with the
  /// prompt's full blocks at admission and starts at its first output, computing no prompt
  /// token; when those blocks are not all cached then, or it ends before, the slot is
  /// freed. Freed at once when `seq_id` is not waiting (engine/scheduler_transfer.cc).
  void SetHostTail(uint64_t seq_id, int32_t slot, uint64_t generation);
  /// Blocks held now: for arrivals and for waiting sequences.
  int64_t num_held_blocks() const { return held_for_arrivals_ + held_for_waiting_; }
  int64_t num_blocks_held_for_waiting() const { return held_for_waiting_; }

 private:
  // The scheduling order: (priority, arrival, seq_id) ascending, so the front runs first
  // and the back is the first preemption victim. priority and arrival must not change
  // while the sequence is queued or running.
  struct SchedulingOrder {
    bool operator()(const Sequence* a, const Sequence* b) const;
  };
  using OrderedSequences = std::set<Sequence*, SchedulingOrder>;

  struct Entry {
    std::unique_ptr<Sequence> seq;
    uint64_t scheduled_in_step = 0;  // the step_ of the last plan that scheduled it
  };

  // Blocks `seq` needs beyond its table to hold `num_tokens` more computed tokens.
  int64_t BlocksNeeded(const Sequence& seq, int32_t num_tokens) const;
  // Schedules `num_tokens` of a running sequence (plus `num_drafts` speculative slots),
  // preempting others (or itself) when blocks run out. False when `seq` itself was
  // preempted instead.
  bool ScheduleRunning(Sequence* seq, int32_t num_tokens, int32_t num_drafts,
                       SchedulerOutput& out);
  // Appends `num_tokens` of `seq` (and `num_drafts` draft slots) to the plan and advances
  // its bookkeeping; the blocks must be available.
  void Emit(Sequence* seq, int32_t num_tokens, int32_t num_drafts, SchedulerOutput& out);
  // The draft tokens each decode candidate may speculate this step (decode_drafts_).
  void ChooseSpeculation(int64_t budget);
  // The running sequence latest in SchedulingOrder that this plan has not scheduled yet.
  Sequence* PickVictim();
  // Preempts a running sequence by recompute: blocks freed, back to the waiting queue.
  void Preempt(Sequence* seq, SchedulerOutput& out);
  // Frees the sequence's blocks, tail first, and clears its table.
  void ReleaseBlocks(Sequence& seq);
  // Frees the blocks of `seq` that no query from num_computed on will read (sliding_window).
  void FreeBehindWindow(Sequence& seq);
  // Extends seq.block_hashes to cover its first `num_blocks` full blocks of applied tokens.
  void ExtendHashes(Sequence& seq, int64_t num_blocks);
  // The first `num_tokens` (or more) of seq's applied tokens, prompt then outputs,
  // contiguous: the prompt itself, or token_scratch_ (valid until the next call).
  absl::Span<const int32_t> AppliedTokens(const Sequence& seq, int64_t num_tokens);
  // Registers the sequence's blocks that became full with computed, known tokens.
  void RegisterFullBlocks(Sequence& seq);
  // Admission of a waiting `seq` (empty table): when its first chunk (within `budget`)
  // fits in the free blocks, takes its cached prefix (if caching is on), sets num_computed
  // past it and returns the chunk's token count; 0 when it does not fit (nothing changed).
  // `held_for_others`: free blocks it must leave (held for other hand-offs).
  int32_t AdmitWithCachedPrefix(Sequence& seq, int64_t budget, int64_t held_for_others);
  // Admits the waiting `seq` when its first chunk fits (AdmitWithCachedPrefix, leaving the
  // blocks held for others) and emits it; false when it does not fit.
  bool TryAdmit(Sequence* seq, int64_t& budget, SchedulerOutput& out);
  // The host tier's continuation of a prefix matched in the pool up to block `first`
  // (whose last content is `parent_id`), up to `max_blocks`, into host_hits_ (empty when
  // reloading would cost more than recomputing).
  void MatchHostPrefix(Sequence& seq, int64_t first, int64_t max_blocks, uint64_t parent_id);
  // Reloads host_hits_ after seq's table: allocates a block for each, queues its copy and
  // registers it with its content. Every block must be free to take.
  void ReloadHostPrefix(Sequence& seq);
  // Whether seq's host tail (SetHostTail) completes its prompt after `cached_blocks` full
  // blocks found in the pool and the tier.
  bool HostTailFits(const Sequence& seq, int64_t cached_blocks) const;
  // Takes a block for seq's host tail and queues its reload (after ReloadHostPrefix).
  void ReloadHostTail(Sequence& seq);
  // Frees seq's host tail slot, if any (stale generations are void already).
  void DropHostTail(Sequence& seq);

  SchedulerConfig config_;
  BlockManager block_manager_;
  std::unique_ptr<HostKvTier> host_tier_;  // num_host_blocks > 0 and prefix caching
  std::vector<HostKvTier::Hit> host_hits_;
  int64_t num_host_tokens_admitted_ = 0;
  SpeculationPolicy speculation_policy_;
  uint64_t num_preemptions_ = 0;
  uint64_t num_window_freed_blocks_ = 0;
  int64_t held_for_arrivals_ = 0;  // set_blocks_held_for_arrivals
  std::vector<uint64_t> closed_pool_holds_;  // ReleaseClosedPoolImport, for the next plan
  int64_t held_for_waiting_ = 0;   // the held_blocks of waiting sequences

  // Every waiting or running sequence, by id; finished ones leave at Finish().
  absl::flat_hash_map<uint64_t, Entry> sequences_;
  OrderedSequences running_;  // status kRunning
  OrderedSequences waiting_;  // status kWaiting
  uint64_t next_arrival_ = 0;
  uint64_t step_ = 0;               // Schedule() calls so far
  bool preempted_this_step_ = false;
  int64_t num_prompt_tokens_admitted_ = 0;
  int64_t num_cached_tokens_admitted_ = 0;
  std::vector<int32_t> token_scratch_;  // prompt + outputs, for hashing output blocks

  // Ids the worker holds that Finish() released; sent in the next plan's `finished`. They
  // stay reserved (Add refuses them) until then.
  std::vector<uint64_t> finished_ids_;
  // Finished sequences kept alive while a plan in flight may still name them: those
  // finished since the last Schedule(), and those the last Schedule() released (destroyed
  // at the start of the next one).
  std::vector<std::unique_ptr<Sequence>> finishing_;
  std::vector<std::unique_ptr<Sequence>> released_;

  // Per-step scratch, kept to reuse its capacity.
  std::vector<Sequence*> decode_candidates_;
  std::vector<Sequence*> prefill_candidates_;
  std::vector<int32_t> decode_drafts_;  // per decode candidate: draft tokens this step
  std::vector<int32_t> draft_limits_;
  std::vector<const SpeculationStats*> draft_stats_;
};

}  // namespace loom::engine
