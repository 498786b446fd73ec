#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/kv_index.h"
#include "coordinator/replica_connection.h"
#include "coordinator/replica_role.h"
#include "coordinator/step_liveness.h"
#include "engine/engine_core.h"
#include "engine/request.h"
#include "loom/v1/inference.pb.h"
#include "loom/v1/worker.grpc.pb.h"

namespace loom::coordinator {

struct ReplicaOptions {
  int64_t max_num_batched_tokens = 512;
  int32_t max_num_seqs = 256;
  int64_t max_waiting = 1024;
  // When a worker is stuck: --step-timeout-ms is the no-progress timeout (see StepLiveness);
  // the cluster sets the heartbeat interval it tells workers.
  LivenessOptions liveness;
  int max_plans_in_flight = 2;                      // 2: build plan N+1 while N runs
  // --migration-limit: how often a request that already streamed output may move to
  // another replica when its replica fails, continuing after its outputs (0: it ends with
  // an error). Requests without output are always placed again.
  int32_t migration_limit = 0;
  // The model's window when every layer is a sliding-window layer (ModelConfig::
  // WindowOfEveryLayer): blocks behind it are freed (SchedulerConfig::sliding_window).
  int64_t sliding_window = 0;
  bool enable_prefix_caching = true;                // reuse cached KV blocks (--prefix-caching)
  // Disaggregated serving: a prompt with more uncached tokens than this is prefilled on a
  // prefill replica when one serves (--max-local-prefill-length); 0: the replica's own
  // measure (engine::LocalPrefillLimit).
  int64_t max_local_prefill_length = 0;
  // How long a request waits for KV from another replica (a prefix fetch, a hand-off: the
  // source's answer and the transfer, each) before it is admitted to recompute
  // (--kv-transfer-timeout-ms).
  absl::Duration kv_transfer_timeout = absl::Seconds(20);
  // Disaggregated serving: prefill workers push a hand-off's KV into the decode replica's
  // host tier layer by layer as they compute it (replica_kv_push.cc; through shared memory
  // on one machine, else over TCP), instead of the decode replica pulling it after the
  // first token (--kv-push).
  bool kv_push = true;
  engine::SpeculationConfig speculation;            // --speculative-tokens, --speculative-adaptive
};

/// The model's KV heads one rank's pool holds, [begin, + count); count 0: not reported.
struct KvHeadRange {
  int32_t begin = 0;
  int32_t count = 0;
};

/// Where a registered worker serves its step stream, and its KV pool.
struct WorkerEndpoint {
  std::string address;                 // rank 0's
  std::vector<std::string> addresses;  // every rank's, in rank order (rank 0's first)
  int64_t num_kv_blocks = 0;
  int32_t block_size = 16;
  std::string backend;  // as the worker registered it
  // Pipeline stages (addresses.size() / stages ranks each, stage by stage): the last
  // stage's ranks sample; a sequence is in at most one plan in flight.
  int pipeline_parallel_size = 1;
  // The host KV tier every rank holds (the smallest of theirs), in blocks; 0: none. And
  // the slowest rank's measured reload time per block.
  int64_t num_host_kv_blocks = 0;
  double kv_load_seconds_per_block = 0;
  ReplicaRole role = ReplicaRole::kMixed;  // every rank's (loom-worker --role)
  std::vector<KvHeadRange> kv_heads;       // per rank, in rank order
  // Per rank: its host tier as another worker of its machine maps it (a KV push's
  // destination); boot_id empty where it has none.
  std::vector<loom::v1::SharedKvMemory> host_kv_shared;
  // Per rank: the scope (machine and PID namespace) within which other workers read its KV
  // pool's blocks directly (pool-to-pool transfers); empty where none can.
  std::vector<std::string> kv_pool_scopes;
  std::string kv_dtype;                    // as registered
  // The KV blocks the workers still hold (coordinator/kv_cache_report), for the new block
  // table to adopt; null or empty: it starts cold.
  std::shared_ptr<const std::vector<engine::AdoptedBlock>> cached_blocks;
};

class Replica;

/// A source replica's answer to an export (a cross-replica prefix fetch asked for it, or a
/// prefill replica made it when it handed a request over): where the prefix's blocks are
/// held for the requester to read.
struct KvExport {
  uint64_t fetch_id = 0;
  uint64_t export_id = 0;              // for ReleaseExport; 0: nothing held
  std::string reason;                  // empty: ok
  std::vector<std::string> addresses;  // the source's ranks
  std::vector<KvHeadRange> kv_heads;   // and the KV heads each holds
  std::string kv_layout;               // the source's kv_layout()
  std::vector<int32_t> slots;          // the prefix's blocks in the source's host tier,
  std::vector<int32_t> pool_blocks;    // or in its pool (a pool-to-pool transfer),
  uint64_t stream_id = 0;              // held by the source's step stream with this id
  uint64_t after_step_id = 0;          // the source step that writes them
  Replica* source = nullptr;
  // A hand-off whose KV the prefill workers pushed into this decode replica's tier as they
  // computed it (replica_kv_push.cc): nothing to fetch, the slots are committed.
  bool pushed = false;
};

/// Where a prefill replica pushes one request's prompt blocks (replica_kv_push.cc): host
/// slots of its decode replica's tier, held there, one per full prompt block, and that
/// replica's ranks.
struct KvPushTarget {
  uint64_t seq_id = 0;
  std::weak_ptr<engine::Request> request;
  Replica* decode = nullptr;
  std::vector<int32_t> slots;
  std::vector<loom::v1::KvPushDest> dests;
  uint64_t hold_id = 0;  // the decode replica's hold (0: declined, no slots)
  // The prefill replica's connection_epoch() when it was asked: an answer to an ask made
  // before its worker was lost is stale (the request was placed again since).
  uint64_t prefill_epoch = 0;
};

/// One replica (a tensor-parallel group; one worker today) and the step loop that drives
/// it: a thread that admits requests into the replica's Scheduler, turns each
/// SchedulerOutput into a StepPlan on the worker's step stream (two in flight), applies
/// the results (detokenize, stop checks, stream to clients) and detects a dead worker
/// (its stream breaks or its heartbeats stop) or a stuck one (the step at the head of its
/// queue reports no progress, see StepLiveness); a slow step that progresses is waited
/// for. Requests that had produced no output when their worker was lost go to
/// `retry` (to run elsewhere); the others end with an error. The prefix-cache changes of
/// its block manager are published to the cluster's KvIndex after every scheduling round
/// and every finished request. Thread-safe.
class Replica {
 public:
  using RetryFn = std::function<void(std::shared_ptr<engine::Request>)>;
  /// A prefill replica (`source`) is done with a request's prompt: place it on `target`
  /// (the decode replica chosen at placement) or another, to fetch its KV and decode.
  using HandOffFn = std::function<void(std::shared_ptr<engine::Request> request, Replica* source,
                                       Replica* target, KvExport exported)>;

  /// `kv_index` (may be null: nothing is published) must outlive the replica.
  Replica(std::string replica_id, ReplicaOptions options, RetryFn retry,
          KvIndex* kv_index = nullptr, HandOffFn hand_off = nullptr);
  ~Replica();  // Stop()s

  /// A worker registered (first time or after a restart): the loop (re)opens the step
  /// stream to it. Any stream to an earlier worker is treated as lost first.
  void Connect(const WorkerEndpoint& endpoint);
  /// Admits a request. Unavailable when the replica has no live worker or is stopping;
  /// ResourceExhausted when its waiting queue is full; InvalidArgument when the request
  /// can never fit in its KV pool.
  absl::Status Submit(std::shared_ptr<engine::Request> request);
  /// How a request arrives besides its prompt.
  struct SubmitOptions {
    // Before admitting it, fetch the prefix this replica (same layout) holds into this
    // replica's host tier instead of recomputing it (replica_kv_fetch.cc). A failed or
    // slow fetch admits it as Submit does.
    Replica* fetch_source = nullptr;
    // It comes from the prefill replica fetch_source after its first token (disaggregated
    // serving): its KV is fetched whatever fetches have cost so far, and a fetch that
    // fails counts as a failed hand-off.
    bool handed_off = false;
    // This replica prefills it (a prefill replica) and hands it to `hand_off_to` after its
    // first token (HandOffFn).
    Replica* hand_off_to = nullptr;
    // A hand-off: the prefill replica exported the prompt's blocks when it handed the
    // request over (no AskExport round trip); released by whoever reads them.
    std::optional<KvExport> export_reply;
    // With hand_off_to: its decode replica was asked for slots to push the prompt's KV
    // into (AskPushTarget); its first plan waits briefly for the answer, so that every
    // layer it computes is pushed (replica_kv_push.cc).
    bool await_push_target = false;
  };
  absl::Status Submit(std::shared_ptr<engine::Request> request, const SubmitOptions& options);
  /// Disaggregated serving: holds `blocks` KV blocks of this (decode) replica free for
  /// `request`, whose prompt a prefill replica computes before handing it over: other
  /// admissions leave them free until it is admitted here (it then goes ahead of the
  /// queue when they fit it) or the hold is released. ResourceExhausted when fewer free
  /// blocks are not held already; Unavailable without a live worker.
  absl::Status ReserveForHandOff(const std::shared_ptr<engine::Request>& request, int64_t blocks);
  /// Ends the hold for the request `seq_id` (it finished, or goes elsewhere) and returns
  /// its blocks (0: none held). Idempotent.
  int64_t ReleaseReservation(uint64_t seq_id);
  /// The connected workers' host tier in blocks (0: none), and their KV layout: block size,
  /// KV dtype and pipeline stages must match for a transfer between replicas (tensor-
  /// parallel sizes may differ: ranks read the KV heads they hold).
  int64_t host_tier_blocks() const { return host_tier_blocks_.load(); }
  /// Whether prefill replicas may push hand-offs' KV into this one's host tier (--kv-push).
  bool kv_push_enabled() const { return options_.kv_push; }
  std::string kv_layout() const;
  /// Whether this replica's workers can copy blocks straight out of `source`'s pools
  /// (worker/kv_pool_transfer): both replicas' pools are shared in one scope (one machine
  /// and PID namespace), in the same layout, and every rank's KV heads are held by ranks of
  /// `source` (the same rank, or between tensor-parallel sizes the ranks holding them); not
  /// for kPoolReadRetry after a transfer from `source` was refused (FAILED_PRECONDITION).
  bool ReadsPoolOf(const Replica& source) const;
  /// How long a replica whose pools could not be read is not read pool to pool again.
  static constexpr absl::Duration kPoolReadRetry = absl::Seconds(60);
  /// Disaggregated serving: whether hand-offs from `prefill` reach this (decode) replica
  /// pool to pool after their first token instead of being pushed into its host tier as
  /// they are computed: where it ReadsPoolOf(prefill) and its pools are on GPUs (device
  /// to device beats two trips over the host link), or pushes are off.
  bool PullsHandOffsFromPool(const Replica& prefill) const;

  // ---- messages between replicas' loops (cross-replica prefix fetch) ----
  /// Asks this replica (the source) to hold `request`'s cached prefix in its host tier
  /// for `requester` to fetch; answered through requester->DeliverExport.
  void AskExport(Replica* requester, uint64_t fetch_id, std::shared_ptr<engine::Request> request);
  using ExportReply = KvExport;
  void DeliverExport(ExportReply reply);
  /// The requester is done reading an export: its slots may be reused.
  void ReleaseExport(uint64_t export_id);

  // ---- KV pushes between replicas' loops (disaggregated serving, replica_kv_push.cc) ----
  /// Decode side: `request`, placed on the prefill replica `prefill` with this replica as
  /// its decode replica, gets host slots here for its prompt blocks, handed to `prefill`
  /// (DeliverPushTarget) once no plan in flight may still copy into or out of them. No
  /// push where this replica's tiers cannot be mapped by other workers (then it pulls).
  /// `prefill_epoch`: prefill->connection_epoch() read before the request was submitted to it.
  void AskPushTarget(const std::shared_ptr<engine::Request>& request, Replica* prefill,
                     uint64_t prefill_epoch);
  /// Prefill side: where the blocks of `target.seq_id` go.
  void DeliverPushTarget(KvPushTarget target);
  /// Decode side: the slots held for `seq_id`'s push are freed (it went elsewhere). Called
  /// by the prefill replica once no plan of its own pushes into them (or its worker was
  /// lost), and by the cluster when the decode replica refused the pushed hand-off.
  /// `hold_id` (KvPushTarget::hold_id; 0: whichever): a hold that replaced it stays.
  /// `writer_lost`: the prefill replica lost its worker, which may still be running and
  /// writing through shared memory (no hold id fences that): the slots go back only after a
  /// grace period, by when it has seen its step stream cancelled and stopped.
  void ReleasePushHold(uint64_t seq_id, uint64_t hold_id, bool writer_lost = false);
  /// Decode side: no plan of the prefill replica writes into the slots held for `seq_id`'s
  /// push any more; they stay held for its hand-off, and go if its request ends first.
  void SettlePushHold(uint64_t seq_id, uint64_t hold_id);
  /// Prefill side: the decode replica lost the worker whose tier `hold_id`'s slots are in
  /// (the hold is carried into its next worker's table, replica_carried_slots.cc): nothing
  /// more is pushed for `seq_id` (its hand-off is pulled), and the hold is released once no
  /// plan in flight pushes into it.
  void VoidPushTarget(uint64_t seq_id, uint64_t hold_id);
  /// Bumped each time this replica loses its worker: what was asked of other replicas
  /// before then is answered for requests placed again since.
  uint64_t connection_epoch() const { return connection_epoch_.load(); }
  /// Prefill side, on this replica's loop thread (Cluster::HandOff): the prompt's blocks
  /// held for a decode replica to pull (Export), when its push went nowhere.
  KvExport ExportForHandOff(const engine::Request& request) { return Export(request, 0); }

  // The worker calls of one fetch in flight (one per rank), cancellable from the loop (the
  // client went away), AbandonFetches and Stop: each worker's reads from the source are
  // children of its call, so they end too and the slots come back at once.
  class FetchCalls {
   public:
    /// Cancels every call running and any started later.
    void Cancel();
    /// Registers a call about to start; false when the fetch was cancelled already.
    bool Add(grpc::ClientContext* context);
    void Remove(grpc::ClientContext* context);

   private:
    absl::Mutex mu_;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
  };

  /// Wakes the loop (a request was cancelled).
  void Wake();
  /// Declares the worker dead (heartbeat timeout): the stream is cancelled and the loop
  /// fails or retries its requests.
  void MarkLost(const std::string& reason);
  /// Records rank `rank`'s heartbeat and the progress of its step.
  void Heartbeat(int rank, const loom::v1::StepProgress& progress);
  /// MarkLost()s when some rank has not heartbeated for `timeout` (called periodically by
  /// the cluster's monitor).
  void CheckHeartbeat(absl::Duration timeout);
  /// Ends every request with ABORT and stops the loop. Idempotent.
  void Stop();

  const std::string& replica_id() const { return replica_id_; }
  /// The connected workers' role (mixed before one connected).
  ReplicaRole role() const { return role_.load(); }
  /// Disaggregated serving: prompts with more uncached tokens than this are better
  /// prefilled elsewhere (ReplicaOptions::max_local_prefill_length, else this replica's
  /// step timings: engine::LocalPrefillLimit), updated after every step.
  int64_t local_prefill_limit() const { return local_prefill_limit_.load(); }
  /// ReplicaOptions::max_num_batched_tokens: the prompt tokens of one full step.
  int64_t max_num_batched_tokens() const { return options_.max_num_batched_tokens; }
  /// Requests this replica's queue takes (--max-waiting).
  int64_t max_waiting() const { return options_.max_waiting; }
  /// Disaggregated serving: the expected seconds until this replica gives the first token
  /// of a prompt of `tokens` uncached tokens submitted now (engine::FirstTokenSeconds from
  /// its measured steps and the prompt tokens queued here; a decode replica prefills in
  /// chunks beside its decodes that at most double their step:
  /// engine::PrefillChunkBesideDecodes). 0 before its steps were measured.
  double FirstTokenSeconds(int64_t tokens) const;
  /// Whether local_prefill_limit() is measured (no --max-local-prefill-length): placement
  /// then also compares the expected first-token times (Cluster::PlaceDisaggregated).
  bool prefill_limit_measured() const { return options_.max_local_prefill_length <= 0; }
  /// The mean time of the KV hand-offs this replica received (0: none measured yet).
  double mean_handoff_seconds() const;
  /// Counts a prompt past the local limit that stays here (the prefill replicas are slower).
  void CountKeptLocal() { num_prefills_kept_local_.fetch_add(1); }
  bool healthy() const { return healthy_.load(); }
  /// The replica lost its worker for silence or a stuck step and no worker registered
  /// since: a rank that still heartbeats lives on (it was stopped, stuck or cut off for a
  /// while) and is told to register again (Cluster::Heartbeat), so that it serves once more.
  bool wants_registration() const { return wants_registration_.load(); }
  /// Requests admitted and not finished (waiting + running + not yet admitted).
  int64_t load() const { return load_.load(); }
  /// Tokens of the requests admitted and not finished: prompts plus tokens generated so
  /// far (the router's load measure; approximate, updated without locks).
  int64_t load_tokens() const { return load_tokens_.load(); }
  /// The KV block size of the connected worker (0 before one connected).
  int32_t block_size() const { return block_size_.load(); }
  loom::v1::ReplicaStatus Status() const;

 private:
  // How long the slots of a push whose prefill worker was lost stay held: that worker may
  // still be running (a step counted as stuck, a re-registration) and writing a layer
  // through shared memory until it sees its step stream cancelled (KvPusher's `abandoned`).
  static constexpr absl::Duration kLostWriterGrace = absl::Seconds(5);
  struct InFlightPlan {
    uint64_t step_id = 0;
    uint64_t copy_plan = 0;     // the host tier's copy_plans_taken() once it was built
    engine::StepRecord record;  // what it scheduled, for the engine core to apply its result
    absl::Time sent;
    // KV pushes it carries: (sequence, its blocks pushed once this plan ran).
    std::vector<std::pair<uint64_t, int64_t>> pushes;
    std::vector<uint64_t> holds_closed;  // StepPlan.kv_push_holds_closed
  };
  // What the reader thread hands to the loop: a result, or the end of the stream.
  struct StreamEvent {
    std::optional<loom::v1::StepResult> result;
    std::string closed_reason;
  };

  void Loop();
  bool ConnectStream(const WorkerEndpoint& endpoint);  // loop thread
  void ReadResults(grpc::ClientReaderWriter<loom::v1::StepPlan, loom::v1::StepResult>* stream,
                   grpc::ClientContext* context);
  void AdmitInbox();
  void DropCancelled();
  // Tells the scheduler the blocks held for hand-offs not admitted yet (before each plan);
  // drops holds whose request is gone.
  void SyncReservations();
  // A prefill replica is done with `seq_id` before its hand-off (it ended, or its worker
  // was lost): the decode replica's hold for it ends.
  void ReleaseHandOffTarget(uint64_t seq_id);
  bool SendPlans();  // false: the stream failed
  // Whether the plan that took the host tier's copies number `last_copy_plan` (and every
  // one before it) came back: slots those copies touched may be written (true for 0).
  bool CopiesRan(uint64_t last_copy_plan) const;
  void ApplyResult(const loom::v1::StepResult& result);
  // `registered_again`: a new registration replaces the worker (no need to ask for one).
  void LoseWorker(const std::string& reason, bool registered_again = false);
  void EndRequest(uint64_t seq_id, loom::v1::FinishReason reason, const std::string& message);
  void PublishStats();
  // Forwards the scheduler's prefix-cache events to the KV index (loop thread).
  void PublishKvEvents();
  // Takes `request` off the load counters (it ended or left this replica).
  void Unload(const engine::Request& request);
  // Cross-replica prefix fetch (replica_kv_fetch.cc), loop thread: answers export asks,
  // starts fetches for replies, commits finished fetches and admits their requests, gives
  // up on fetches past their deadline.
  void HandleKvFetches();
  // Returns the fetch's id; `ask`: ask the source for an export (else one comes with it).
  uint64_t StartFetch(std::shared_ptr<engine::Request> request, Replica* source, bool handed_off,
                      bool ask = true);
  // The source side of an export: holds `request`'s cached prefix for `reader` (null:
  // unknown) to fetch: in this replica's pool where `reader` reads it (ReadsPoolOf), else in
  // the host tier (blocks only in the pool are copied out by the next plan); says where
  // (reason set: nothing).
  KvExport Export(const engine::Request& request, uint64_t fetch_id,
                  const Replica* reader = nullptr);
  // Whether fetching `request`'s prefix from `source` (as fetches measured so far) beats
  // recomputing it.
  bool FetchPays(const engine::Request& request, const Replica& source) const;
  // Admits into the engine (a refusal ends the request); `hand_off_to`: prefill it only.
  void AdmitOne(const std::shared_ptr<engine::Request>& request, Replica* hand_off_to = nullptr);
  // local_prefill_limit() by the options, `cost` and the hand-offs measured so far.
  int64_t LocalPrefillLimitNow(const engine::StepCostModel& cost, int64_t num_running) const;
  // The mean time of the hand-offs received so far (0 for pushed ones); nullopt before the
  // first.
  std::optional<double> MeasuredHandOffSeconds() const;
  // Passes the requests the engine core handed off to the cluster (loop thread).
  void HandOffPrefilled();
  void EndFetch(uint64_t fetch_id, const absl::Status& status);
  // Has the workers pull `pending`'s reserved reply into its slots or pool blocks (a thread
  // bounded by the transfer's deadline; its result comes back through fetch_results_).
  struct PendingFetch;
  void StartPull(uint64_t fetch_id, PendingFetch& pending,
                 const std::vector<std::string>& addresses,
                 const std::vector<KvHeadRange>& kv_heads);
  // Lets the fetched slots of requests admitted into the pool (or ended) go.
  void ReleaseImportHolds();
  // The worker was lost: the requests waiting for a prefix, to place again.
  std::vector<std::shared_ptr<engine::Request>> AbandonFetches();
  // KV pushes (replica_kv_push.cc), loop thread: holds slots for asks, hands them to the
  // prefill replicas once plans in flight are clear of them, frees released ones; takes
  // delivered targets.
  void HandleKvPushes();
  // Prefill side, admitting: a prompt placed with await_push_target and no answer yet
  // waits (awaiting_push_; moved from `request`: true) until TakeAnsweredPushWaits adds
  // it back to the requests being admitted, answered or kPushTargetWait later.
  bool AwaitPushTarget(std::shared_ptr<engine::Request>& request, const SubmitOptions& placement);
  void TakeAnsweredPushWaits(std::deque<std::shared_ptr<engine::Request>>& inbox,
                             std::vector<SubmitOptions>& placements);
  absl::Time NextPushWaitDeadline() const;  // InfiniteFuture when none waits
  // Worker lost or stopping: the waiting prompts go back to the inbox (mu_ held).
  void ReturnPushWaitsToInbox() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prefill side: the pushes `plan` carries (blocks of sequences with a target that are
  // whole once it ran), recorded in `flight`; decode side: the slots pushes filled.
  void AddKvPushes(loom::v1::StepPlan& plan, InFlightPlan& flight);
  // Prefill side: a plan's result confirms its pushes (or marks them failed).
  void ConfirmKvPushes(const InFlightPlan& flight, const loom::v1::StepResult& result);
  // Prefill side, at hand-off: whether every block of `request` reached `decode` (the
  // target then ends here; a decode replica holding slots in vain is told).
  bool TakePushedHandOff(const engine::Request& request, Replica* decode);
  // Decode side: the hold for `seq_id`'s push ends (false: none); its slots are freed, and
  // closed on the workers where a write may still come.
  bool EndPushHold(uint64_t seq_id);
  // Decode side: a delivered hold whose writer was lost waits out kLostWriterGrace among
  // the carried slots (replica_carried_slots.cc), whatever its request does meanwhile.
  void SetPushHoldAside(uint64_t seq_id, absl::Time now);
  // Prefill side: the push targets decode replicas delivered.
  void TakePushTargets(std::vector<KvPushTarget>& deliveries);
  // Prefill side: the push of a sequence ends; its slots are released once no plan in flight
  // pushes into them.
  void EndPush(uint64_t seq_id);
  // Decode side: a hand-off whose KV was pushed: commits the slots and admits it.
  void AdmitPushed(const std::shared_ptr<engine::Request>& request);
  // The worker was lost: holds and targets end (the requests are placed again).
  void AbandonPushes();
  // Slots of this replica's host tier that transfers may still touch after their holder let
  // them go (replica_carried_slots.cc): a lost writer's push (SetPushHoldAside), and what
  // transfers begun for a lost worker touch, whose process may live on (a stuck step, a
  // re-registration) with the same tier memory while the next engine's table starts empty.
  struct CarriedSlots {
    std::vector<int32_t> slots;
    uint64_t hold_id = 0;        // a push hold named to its writers (closed on release)
    uint64_t seq_id = 0;         // the push's sequence
    Replica* prefill = nullptr;  // the push's writer
    uint64_t export_id = 0;      // or an export read by another replica (ReleaseExport)
    absl::Time release_at = absl::InfiniteFuture();    // a lost writer's grace
    std::optional<engine::Scheduler::HeldSlots> held;  // in the current table
  };
  // `hold`'s slots carried (not held in any table yet).
  struct PushHold;
  CarriedSlots& CarryPushHold(uint64_t seq_id, const PushHold& hold);
  // LoseWorker, before the engine goes: what the lost worker's transfers may still touch
  // (delivered push holds, exports, and the holds closed or written that no plan that came
  // back has closed on the workers).
  void CarryLostTransfers();
  // ConnectStream: the new table holds the carried slots, and its first plan closes the
  // holds before any slot is written.
  void ClaimCarriedSlots();
  // A carried push hold's writer is done (`writer_lost`: after kLostWriterGrace), a carried
  // export's reader; false: none matched.
  bool ReleaseCarriedPush(uint64_t hold_id, bool writer_lost, absl::Time now);
  bool ReleaseCarriedExport(uint64_t export_id);
  bool ReleaseDueCarriedSlots(absl::Time now);
  void ReleaseCarried(CarriedSlots& carried);
  struct FetchResult {
    uint64_t fetch_id = 0;
    absl::Status status;
  };
  struct ExportAsk {
    Replica* requester = nullptr;
    uint64_t fetch_id = 0;
    std::shared_ptr<engine::Request> request;
  };
  struct PendingFetch {
    std::shared_ptr<engine::Request> request;
    std::shared_ptr<FetchCalls> calls = std::make_shared<FetchCalls>();
    Replica* source = nullptr;
    uint64_t export_id = 0;
    engine::Scheduler::HeldSlots import;
    int64_t num_blocks = 0;
    absl::Time deadline;
    absl::Time started;
    bool fetching = false;  // the workers are pulling the blocks
    uint64_t hold_id = 0;   // named to them (FetchKvBlocksRequest.hold_id)
    // A pool-to-pool transfer: the pool blocks held for it (import then holds no slots).
    std::vector<int32_t> pool_import;
    bool handed_off = false;  // SubmitOptions::handed_off
    // Slots reserved, the pull not started: a plan sent (or to be sent) may still copy
    // into or out of them (import.last_copy_plan), so the workers write them only once
    // its result came back (CopiesRan).
    std::optional<KvExport> reserved_reply;
    // The source's answer while every tier slot is held (by pushes and pulls under way, or
    // blocks not yet reloaded): retried as slots free, until the deadline.
    std::optional<KvExport> awaiting_slots;
  };

  const std::string replica_id_;
  const ReplicaOptions options_;
  const RetryFn retry_;
  const HandOffFn hand_off_;
  std::atomic<ReplicaRole> role_{ReplicaRole::kMixed};
  std::atomic<int64_t> local_prefill_limit_{0};
  std::atomic<int64_t> prefill_chunk_{0};  // ReplicaStatus.prefill_chunk_tokens
  std::atomic<uint64_t> num_prefills_kept_local_{0};
  std::atomic<bool> healthy_{false};
  std::atomic<bool> wants_registration_{false};
  std::atomic<uint64_t> connection_epoch_{0};
  std::atomic<int64_t> load_{0};
  std::atomic<int64_t> load_tokens_{0};
  std::atomic<int32_t> block_size_{0};
  KvIndex* const kv_index_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<WorkerEndpoint> pending_connect_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<engine::Request>> inbox_ ABSL_GUARDED_BY(mu_);
  int64_t inbox_handoffs_ ABSL_GUARDED_BY(mu_) = 0;  // hand-offs among them
  // Requests the loop took from inbox_ and has not yet counted in stats_ (Submit's bound).
  int64_t admitting_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<StreamEvent> stream_events_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::string lost_reason_ ABSL_GUARDED_BY(mu_);
  // The worker is being lost for silence or a stuck step: it may live on
  // (wants_registration).
  bool lost_alive_ ABSL_GUARDED_BY(mu_) = false;
  ReplicaConnection* live_connection_ ABSL_GUARDED_BY(mu_) = nullptr;  // for MarkLost
  // Heartbeats and progress of the connected ranks; the loop tells it when the head plan
  // starts and how long steps take.
  StepLiveness liveness_ ABSL_GUARDED_BY(mu_);
  WorkerEndpoint endpoint_ ABSL_GUARDED_BY(mu_);
  loom::v1::ReplicaStatus stats_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> host_tier_blocks_{0};
  // Disaggregated serving: blocks held for hand-offs placed here, by sequence id, until the
  // request is admitted (then the scheduler holds them for it while it waits); their sum;
  // and the blocks the scheduler holds for waiting hand-offs (as last published).
  struct Reservation {
    std::weak_ptr<engine::Request> request;
    int64_t blocks = 0;
  };
  absl::flat_hash_map<uint64_t, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t held_for_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::string kv_layout_ ABSL_GUARDED_BY(mu_);
  // The scope (machine and PID namespace) within which other workers read every rank's
  // pool; empty: not all ranks share one.
  std::string pool_scope_ ABSL_GUARDED_BY(mu_);
  // Replicas whose pools this one's workers failed to open or read (a pool-to-pool transfer
  // refused with FAILED_PRECONDITION: no peer access between their GPUs, say), by replica id,
  // and until when ReadsPoolOf says no for them: their KV goes through the host tiers (or is
  // pushed) meanwhile, instead of every transfer failing and recomputing.
  absl::flat_hash_map<std::string, absl::Time> pools_refused_until_ ABSL_GUARDED_BY(mu_);
  // Cross-replica prefix fetch: requests to fetch for, asks from other replicas, their
  // answers, finished fetches, exports to release.
  absl::flat_hash_map<const engine::Request*, SubmitOptions> placements_ ABSL_GUARDED_BY(mu_);
  // FirstTokenSeconds' inputs: set by PublishStats, queued tokens raised by every Submit.
  engine::PrefillRate prefill_rate_ ABSL_GUARDED_BY(mu_);
  double mean_handoff_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<ExportAsk> export_asks_ ABSL_GUARDED_BY(mu_);
  std::deque<ExportReply> export_replies_ ABSL_GUARDED_BY(mu_);
  std::deque<FetchResult> fetch_results_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> export_releases_ ABSL_GUARDED_BY(mu_);
  int fetch_threads_ ABSL_GUARDED_BY(mu_) = 0;  // running; Stop waits for them
  // KV pushes: asks for slots (decode side), targets delivered (prefill side), holds to end.
  struct PushAsk {
    std::shared_ptr<engine::Request> request;
    Replica* prefill = nullptr;
    uint64_t prefill_epoch = 0;
  };
  std::vector<PushAsk> push_asks_ ABSL_GUARDED_BY(mu_);
  std::vector<KvPushTarget> push_deliveries_ ABSL_GUARDED_BY(mu_);
  struct PushRelease {
    uint64_t seq_id = 0;
    uint64_t hold_id = 0;
    bool writer_lost = false;
  };
  std::vector<PushRelease> push_releases_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> push_settles_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> push_voids_ ABSL_GUARDED_BY(mu_);

  // Loop thread only.
  absl::flat_hash_map<uint64_t, PendingFetch> pending_fetches_;
  uint64_t next_fetch_id_ = 1;
  absl::flat_hash_map<uint64_t, engine::Scheduler::HeldSlots> exports_;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> pool_exports_;  // their pool blocks
  // Fetched prefixes held for their requests (by sequence id) until they are admitted.
  absl::flat_hash_map<uint64_t, engine::Scheduler::HeldSlots> import_holds_;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> pool_import_holds_;
  // The first step id of the current connection (plans before it went to another stream).
  uint64_t stream_first_step_id_ = 1;
  // KV pushes, decode side: slots held per sequence for its prefill replica to push into,
  // and pushed slots the next plan tells the workers about; prefill side: the targets.
  struct PushHold {
    std::weak_ptr<engine::Request> request;
    Replica* prefill = nullptr;
    engine::Scheduler::HeldSlots slots;  // delivered once CopiesRan(slots.last_copy_plan)
    bool delivered = false;
    uint64_t id = 0;  // named to the workers (KvPushDest.hold_id), unique to this replica
    uint64_t prefill_epoch = 0;  // the prefill replica's when asked (KvPushTarget)
    // No plan of the prefill replica writes into the slots any more (SettlePushHold).
    // Until then a delivered hold whose request ended stays held: its slots go back to the
    // tier only when the prefill replica releases them (or its worker is lost).
    bool settled = false;
  };
  // Decode side: where `hold`'s prefill workers write (every rank of this replica).
  KvPushTarget PushTargetOf(uint64_t seq_id, const PushHold& hold,
                            const std::shared_ptr<engine::Request>& request,
                            const WorkerEndpoint& endpoint);
  absl::flat_hash_map<uint64_t, PushHold> push_holds_;
  // Holds on this replica's host slots named to the workers that write them (pushes,
  // fetches), closed by a plan when given back while a write may still come. From the
  // clock at start-up: a worker that outlived an earlier coordinator has not closed the ids
  // this one names.
  uint64_t next_hold_id_ = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  std::vector<int32_t> pushed_slots_to_adopt_;
  std::vector<CarriedSlots> carried_slots_;
  std::vector<uint64_t> carried_close_ids_;  // for the next table's first plan
  struct PushState {
    KvPushTarget target;
    int64_t planned = 0;    // blocks in plans sent
    int64_t confirmed = 0;  // blocks whose plans came back without a push error
    int in_flight = 0;      // plans sent that push its blocks and have not come back
    bool failed = false;
    bool ended = false;  // its request went: released once in_flight is 0
  };
  absl::flat_hash_map<uint64_t, PushState> push_targets_;
  struct PushWait {
    std::shared_ptr<engine::Request> request;
    SubmitOptions placement;
    absl::Time deadline;
  };
  std::vector<PushWait> awaiting_push_;
  std::atomic<int64_t> awaiting_push_count_{0};  // read by Submit and Status
  uint64_t num_handoffs_pushed_ = 0;
  uint64_t next_export_id_ = 1;
  uint64_t num_kv_fetches_ = 0, num_kv_fetch_failures_ = 0, num_kv_fetched_blocks_ = 0;
  uint64_t num_kv_pool_fetches_ = 0;  // of num_kv_fetches_: pool to pool
  // Disaggregated serving: prefill-only requests' decode replicas (by sequence id), those
  // the engine core handed back after their first token, and the hand-offs so far.
  absl::flat_hash_map<uint64_t, Replica*> hand_off_targets_;
  std::vector<std::shared_ptr<engine::Request>> prefilled_;
  uint64_t num_handoffs_out_ = 0, num_handoffs_in_ = 0, num_handoff_failures_ = 0;
  // Hand-offs received whose KV arrived, and the seconds they took (asked to admitted).
  uint64_t num_handoffs_measured_ = 0;
  double handoff_seconds_ = 0;
  double kv_fetch_seconds_ = 0;
  // The engine core of the connected worker's KV pool: admitted requests, scheduler.
  std::unique_ptr<engine::EngineCore> engine_;
  std::unique_ptr<ReplicaConnection> connection_;  // the loop thread's
  std::deque<InFlightPlan> in_flight_;
  // Plans kept in flight: max_plans_in_flight, and at least one per pipeline stage (each
  // stage works on its own micro-batch of sequences).
  int plans_in_flight_ = 2;
  bool pipelined_ = false;  // the connected replica has pipeline stages
  uint64_t next_step_id_ = 1;
  uint64_t num_steps_ = 0, num_mixed_steps_ = 0, num_tokens_computed_ = 0;
  int32_t num_kv_copies_queued_ = 0;    // host tier copies the last plan carried
  loom::v1::StepPlan plan_scratch_;     // SendPlans: the plan being built
  double schedule_seconds_ = 0, step_seconds_ = 0;

  std::thread loop_;
};

}  // namespace loom::coordinator
