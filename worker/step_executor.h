#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grammar/grammar_matcher_factory.h"
#include "common/sampling_params.h"
#include "loom/v1/worker.pb.h"
#include "worker/draft_proposer.h"
#include "worker/kv_block_ledger.h"
#include "worker/kv_host_tier.h"
#include "worker/kv_push.h"
#include "worker/sampler.h"
#include "worker/step_backend.h"
#include "worker/step_progress.h"

namespace loom::worker {

/// The wire's sampling parameters (common/sampling_params: an unset field takes its
/// default; the coordinator sets every field) and the protocol's draft limit.
using common::kMaxSpeculativeTokens;
using common::SamplingParamsFromProto;

struct StepExecutorOptions {
  // Prompt-lookup speculation: the longest and shortest suffix n-grams searched for.
  int32_t ngram_max = 4;
  int32_t ngram_min = 2;
  // Draft-model speculation instead of prompt lookup (not owned; must outlive the
  // executor); null: prompt lookup.
  DraftProposer* draft_proposer = nullptr;
  // Where each step's start, phases and end are counted for the heartbeat (not owned;
  // null: not reported). The forward pass counts its layers into the same object.
  StepProgress* progress = nullptr;
  // Test-only (`--debug-step-delay-ms`): every step first sleeps this long in 20 ms slices,
  // each counted as progress: a worker as slow as wanted that is visibly not stuck.
  int64_t debug_step_delay_ms = 0;
  // Test-only (`--debug-hang-at-step`): the Nth plan executed (1-based, over the process's
  // life; 0: never) blocks without progress until ReleaseDebugHang(): a worker stuck
  // inside a step while its heartbeat goes on.
  int64_t debug_hang_at_step = 0;
  // Compiles the grammars of constrained sequences (structured output) over the model's
  // vocabulary (not owned; must outlive the executor); null: a sequence with a grammar
  // is refused.
  common::GrammarMatcherFactory* grammars = nullptr;
  // The worker's host KV tier (not owned; must outlive the executor): each plan's
  // kv_copies run on it after the plan validates and before its forward pass. null: a
  // plan with copies is refused.
  KvHostTier* host_tier = nullptr;
};

/// The worker's side of the step protocol: owns every sequence's execution state (its
/// tokens, block table, how many tokens are computed, its sampler) and turns each
/// StepPlan (a diff: sequences added, scheduled, released) into one StepResult through
/// a StepBackend. A plan is all or nothing: a plan that fails leaves the sequences it
/// does not name as they were and drops the ones it names. Per-step work does not grow
/// with the sequences' context lengths beyond handing the backend their block tables.
/// Not thread-safe: the worker service serializes calls.
class StepExecutor {
 public:
  /// `backend` must outlive the executor.
  explicit StepExecutor(StepBackend& backend, StepExecutorOptions options = {});
  ~StepExecutor();

  /// Applies `plan` and returns its result: the sampled tokens in plan order (a
  /// speculative sequence's accepted drafts and next token as consecutive outputs), or, when
  /// the plan is invalid or the backend fails, error_code (an absl/google.rpc code) and
  /// error_message with no outputs. step_ids must strictly increase between Resets.
  loom::v1::StepResult Execute(const loom::v1::StepPlan& plan);
  /// The same into `result`, cleared first: a result reused step after step keeps its
  /// output messages allocated.
  /// `abandoned` (optional): true once the coordinator gave the step up (its stream was
  /// cancelled); the plan's KV pushes stop writing then (KvPusher::Begin).
  void Execute(const loom::v1::StepPlan& plan, loom::v1::StepResult& result,
               const std::function<bool()>& abandoned = nullptr);

  /// Drops every sequence and forgets the last step id (a new step stream).
  absl::Status Reset();
  /// Ends a debug_hang_at_step hang (the process is stopping). Thread-safe.
  void ReleaseDebugHang() { hang_released_.store(true); }

  /// Sequences whose state the executor holds.
  int num_sequences() const { return static_cast<int>(sequences_.size()); }
  /// The last plan whose host-tier copies ran (before its forward pass); any thread. The
  /// slots it wrote can be read by another worker from then on. 0 after Reset.
  uint64_t kv_copied_step_id() const { return kv_copied_step_id_.load(std::memory_order_acquire); }
  /// Whether a plan in [first, last] carried host-tier copies that did not run (it was
  /// refused before them, or they failed): a reader waiting for them must not read the
  /// slots. The last kMaxFailedCopySteps such plans of the stream (since Reset) are
  /// remembered; any thread.
  bool kv_copies_failed(uint64_t first, uint64_t last) const;
  static constexpr size_t kMaxFailedCopySteps = 64;
  /// True when the executor holds state for `seq_id`.
  bool HasSequence(uint64_t seq_id) const { return sequences_.contains(seq_id); }
  /// Tokens of `seq_id` computed so far (its KV length), or -1 when unknown.
  int64_t NumComputed(uint64_t seq_id) const;
  /// Known tokens of `seq_id` (prompt, then outputs), or -1 when unknown.
  int64_t NumTokens(uint64_t seq_id) const;
  /// Leading tokens of `seq_id` whose K/V the draft model holds, or -1 when unknown.
  int64_t NumDraftComputed(uint64_t seq_id) const;

  const StepBackend& backend() const { return backend_; }
  /// What the pool's full blocks hold (kept across Reset: the K/V stay in the pool).
  const KvBlockLedger& kv_ledger() const { return ledger_; }
  /// Blocks written outside the steps (a pool-to-pool transfer): what the ledger recorded
  /// for them is gone.
  void ForgetKvBlocks(absl::Span<const int32_t> blocks) {
    for (const int32_t block : blocks) {
      if (block >= 0 && block < ledger_.num_blocks()) ledger_.Invalidate(block);
    }
  }
  /// The host KV tier the plans' copies run on (StepExecutorOptions::host_tier).
  KvHostTier* host_tier() const { return options_.host_tier; }

 private:
  struct SequenceState;
  struct Prepared;
  class PlanView;

  // Gives `sampler` the matcher of `constraint`'s grammar.
  absl::Status AttachGrammar(const loom::v1::GrammarConstraint& constraint, uint64_t seq_id,
                             SequenceSampler& sampler);
  // Checks the whole plan and builds the batch: the added sequences' states, the scheduled
  // entries, their drafts (Propose), the batch (BuildBatch). The only state it changes is
  // the block tables of sequences the plan schedules (their new blocks), which a failing
  // plan drops; a draft model writes K/V only where the plan's sequences will compute.
  absl::Status Prepare(const loom::v1::StepPlan& plan, Prepared& prepared);
  // An added sequence's state (tokens, sampler, grammar) once its fields check out.
  absl::StatusOr<std::unique_ptr<SequenceState>> NewSequence(const loom::v1::NewSequence& added);
  // InvalidArgument unless `entry` can run on `sequence`: tokens it knows, blocks in the
  // pool and within the context, drafts only on a sampled step.
  absl::Status CheckScheduled(const loom::v1::ScheduledSequence& entry,
                              const SequenceState& sequence) const;
  // Resolves a checked entry (the plan's `index`th) into prepared.entries with the drafts it
  // may take, and appends the step's new blocks to the sequence's table.
  void Schedule(const loom::v1::ScheduledSequence& entry, int index, SequenceState& sequence,
                Prepared& prepared);
  // Lays the resolved entries out in prepared.batch (tokens and drafts, prompt-scoring rows,
  // sample rows) with the sampled sequences' rows.
  absl::Status BuildBatch(const loom::v1::StepPlan& plan, Prepared& prepared);
  // Appends entry `e`'s tokens to prepared.batch, then its drafts with a sample row for the
  // last computed token and each draft.
  absl::Status AppendEntry(size_t e, Prepared& prepared) const;
  // The drafts of each scheduled entry that speculates, from the draft model or by
  // prompt lookup, into prepared.proposals.
  absl::Status Propose(Prepared& prepared);
  // Internal error unless the backend's answer covers the prepared rows.
  absl::Status CheckEmitted(const Prepared& prepared, const std::vector<SampledToken>& tokens,
                            const std::vector<int32_t>& num_emitted) const;
  // Drops every sequence the plan names (after a failed plan).
  void DropNamed(const loom::v1::StepPlan& plan);
  // The ledger forgets the blocks the prepared plan may write (its computed positions and
  // drafts, the blocks its copies load), before anything is written.
  void ForgetWrittenBlocks(const loom::v1::StepPlan& plan, const Prepared& prepared);
  // The ledger records the full blocks the committed step completed (or that a sequence
  // starts with as its cached prefix).
  void RecordCompletedBlocks(const Prepared& prepared);
  // Runs the plan's kv_copies on the host tier.
  absl::Status CopyKvBlocks(const loom::v1::StepPlan& plan);
  // Before the forward pass: pushed slots adopted, then the kv_copies.
  absl::Status MoveKvBlocks(const loom::v1::StepPlan& plan);
  // The test-only delay and hang of StepExecutorOptions, at the start of a step.
  void DebugHooks();

  StepBackend& backend_;
  StepExecutorOptions options_;
  // seq_id -> state. Invariant: num_computed <= tokens.size() and the block table
  // covers num_computed tokens.
  absl::flat_hash_map<uint64_t, std::unique_ptr<SequenceState>> sequences_;
  bool has_last_step_id_ = false;
  std::atomic<uint64_t> kv_copied_step_id_{0};
  absl::Status AdvanceStepId(uint64_t step_id);  // InvalidArgument unless it rises
  mutable absl::Mutex failed_copies_mu_;
  std::deque<uint64_t> failed_copy_steps_ ABSL_GUARDED_BY(failed_copies_mu_);
  uint64_t last_step_id_ = 0;
  // The step being executed; kept between steps so its arrays keep their capacity.
  std::unique_ptr<Prepared> prepared_;
  std::unique_ptr<KvPusher> pusher_;  // StepPlan.kv_pushes (worker/kv_push)
  KvBlockLedger ledger_;
  std::vector<KvBlockCopy> copies_;  // scratch for CopyKvBlocks
  int64_t num_executed_ = 0;  // plans executed (or being executed) since construction
  std::atomic<bool> hang_released_{false};
};

}  // namespace loom::worker
