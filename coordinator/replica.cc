#include "coordinator/replica.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/step_plan.h"
#include "grpcpp/grpcpp.h"

namespace loom::coordinator {
namespace {

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

}  // namespace

Replica::Replica(std::string replica_id, ReplicaOptions options, RetryFn retry, KvIndex* kv_index,
                 HandOffFn hand_off)
    : replica_id_(std::move(replica_id)),
      options_(options),
      retry_(std::move(retry)),
      hand_off_(std::move(hand_off)),
      kv_index_(kv_index),
      liveness_(options.liveness) {
  {
    absl::MutexLock lock(&mu_);
    stats_.set_replica_id(replica_id_);
    local_prefill_limit_.store(LocalPrefillLimitNow(engine::StepCostModel(), 0));
    stats_.set_max_plans_in_flight(options_.max_plans_in_flight);
  }
  loop_ = std::thread([this] { Loop(); });
}

Replica::~Replica() { Stop(); }

void Replica::Connect(const WorkerEndpoint& endpoint) {
  role_.store(endpoint.role);
  absl::MutexLock lock(&mu_);
  pending_connect_ = endpoint;
  wants_registration_.store(false);
  // A live connection to an earlier incarnation is cancelled so the loop notices at once.
  if (live_connection_ != nullptr) {
    lost_reason_ = "the worker registered again";
    live_connection_->Cancel(lost_reason_);
  }
}

absl::Status Replica::Submit(std::shared_ptr<engine::Request> request) {
  return Submit(std::move(request), SubmitOptions{});
}

absl::Status Replica::Submit(std::shared_ptr<engine::Request> request,
                             const SubmitOptions& options) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || !healthy_.load()) {
    return absl::UnavailableError(absl::StrFormat("replica %s has no live worker", replica_id_));
  }
  // The queue bound is enforced here, at admission, and only here: once accepted, a
  // request is never dropped for a full queue (the scheduler's own bound is off, since
  // preempted sequences also wait). Requests being admitted by the loop still count.
  const int64_t waiting = stats_.num_waiting() + admitting_ + static_cast<int64_t>(inbox_.size()) +
                          awaiting_push_count_.load();
  if (waiting >= options_.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "replica %s has %d requests waiting (the limit, --max-waiting)", replica_id_, waiting));
  }
  const engine::RequestParams& params = request->params();
  const int64_t tokens = static_cast<int64_t>(params.prompt_ids.size()) + params.max_tokens;
  engine::SchedulerConfig fit;
  fit.block_size = endpoint_.block_size;
  fit.max_num_batched_tokens = options_.max_num_batched_tokens;
  fit.sliding_window = options_.sliding_window;
  const int64_t blocks = engine::MaxBlocksHeld(fit, tokens);
  if (blocks > endpoint_.num_kv_blocks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the prompt (%d tokens) plus max_tokens (%d) needs %d KV blocks; replica %s has %d",
        params.prompt_ids.size(), params.max_tokens, blocks, replica_id_,
        endpoint_.num_kv_blocks));
  }
  load_tokens_.fetch_add(static_cast<int64_t>(params.prompt_ids.size()));
  if (options.handed_off) {
    // Its transfer starts from the loop: it need not wait out the step in flight.
    ++inbox_handoffs_;
  } else {
    // A hand-off brings its prompt's KV; anything else is prefill queued here.
    prefill_rate_.queued_tokens += static_cast<int64_t>(params.prompt_ids.size());
  }
  // A prefix another replica holds is fetched before admission (replica_kv_fetch.cc); a
  // prefill replica's request is handed off after its first token.
  if ((options.fetch_source != nullptr && options.fetch_source != this) ||
      (options.hand_off_to != nullptr && options.hand_off_to != this)) {
    placements_[request.get()] = options;
  }
  inbox_.push_back(std::move(request));
  load_.fetch_add(1);
  return absl::OkStatus();
}

void Replica::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

void Replica::MarkLost(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (live_connection_ == nullptr) return;
  lost_reason_ = reason;
  live_connection_->Cancel(reason);
}

void Replica::Heartbeat(int rank, const loom::v1::StepProgress& progress) {
  absl::MutexLock lock(&mu_);
  liveness_.OnHeartbeat(rank, progress, absl::Now());
}

void Replica::CheckHeartbeat(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (live_connection_ == nullptr) return;
  const absl::Duration silence = liveness_.LongestSilence(absl::Now());
  if (silence > timeout) {
    lost_reason_ = absl::StrFormat("no heartbeat for %d ms (worker dead or stopped)",
                                   absl::ToInt64Milliseconds(silence));
    lost_alive_ = true;
    live_connection_->Cancel(lost_reason_);
  }
}

void Replica::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  // Fetches still pulling blocks post their results here: cancel them (the loop is gone,
  // so nobody else touches pending_fetches_) and wait for them.
  for (auto& [fetch_id, pending] : pending_fetches_) pending.calls->Cancel();
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return fetch_threads_ == 0; };
  mu_.Await(absl::Condition(&done));
}

loom::v1::ReplicaStatus Replica::Status() const {
  absl::MutexLock lock(&mu_);
  loom::v1::ReplicaStatus status = stats_;
  status.set_healthy(healthy_.load());
  status.set_worker_address(endpoint_.address);
  status.set_backend(endpoint_.backend);
  status.set_role(std::string(ReplicaRoleName(role_.load())));
  if (status.num_kv_blocks() > 0) {
    status.set_kv_cache_usage(
        1.0 - static_cast<double>(status.num_free_blocks()) / status.num_kv_blocks());
  }
  status.set_num_waiting(status.num_waiting() +
                         static_cast<int32_t>(admitting_ + static_cast<int64_t>(inbox_.size()) +
                                              awaiting_push_count_.load()));
  status.set_num_reserved_blocks(reserved_blocks_ + held_for_waiting_);
  status.set_local_prefill_limit(local_prefill_limit_.load());
  status.set_prefill_chunk_tokens(prefill_chunk_.load());
  status.set_num_prefills_kept_local(num_prefills_kept_local_.load());
  return status;
}

// ---------------------------------------------------------------------------------------
// The loop thread.

void Replica::Loop() {
  while (true) {
    std::optional<WorkerEndpoint> connect;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      connect.swap(pending_connect_);
    }
    if (connect) {
      if (connection_ != nullptr)
        LoseWorker("the worker registered again", /*registered_again=*/true);
      if (!ConnectStream(*connect)) continue;
    }
    if (connection_ == nullptr) {
      absl::MutexLock lock(&mu_);
      auto wakeup = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || pending_connect_.has_value();
      };
      mu_.AwaitWithTimeout(absl::Condition(&wakeup), absl::Seconds(1));
      continue;
    }

    HandleKvFetches();
    HandleKvPushes();
    AdmitInbox();
    DropCancelled();
    SyncReservations();
    if (!SendPlans()) {
      LoseWorker("writing a plan to the worker failed");
      continue;
    }

    std::optional<StreamEvent> event;
    std::string stuck;  // why the head step counts as stuck
    {
      absl::MutexLock lock(&mu_);
      if (in_flight_.empty()) {
        // Idle: wait for work, a cancellation, a new worker, or the stream's end.
        auto wakeup = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || wake_ || !inbox_.empty() || pending_connect_.has_value() ||
                 !stream_events_.empty();
        };
        mu_.AwaitWithDeadline(
            absl::Condition(&wakeup),
            std::min(absl::Now() + absl::Milliseconds(50), NextPushWaitDeadline()));
        wake_ = false;
      } else {
        // A step may take as long as it needs while it progresses: wait until the head
        // step would count as stuck, then look again (progress may have come meanwhile).
        // KV transfers between replicas (hand-offs arriving, export asks and replies,
        // finished fetches, released exports) are handled at once too, not after the step:
        // a hand-off waits for them.
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !stream_events_.empty() || inbox_handoffs_ > 0 ||
                 !export_asks_.empty() || !export_replies_.empty() || !fetch_results_.empty() ||
                 !export_releases_.empty() || !push_asks_.empty() || !push_deliveries_.empty();
        };
        const absl::Time until = std::min(liveness_.NextCheck(absl::Now()), NextPushWaitDeadline());
        if (!mu_.AwaitWithDeadline(absl::Condition(&ready), until) &&
            liveness_.Stuck(absl::Now())) {
          stuck = absl::StrFormat(
              "step %d made no progress for %d ms (worker stuck; the limit is %d ms: "
              "--step-timeout-ms, or 10x the expected time of a unit of progress at the "
              "measured %.3g ms per token)",
              in_flight_.front().step_id,
              absl::ToInt64Milliseconds(absl::Now() - liveness_.LastActivity()),
              absl::ToInt64Milliseconds(liveness_.NoProgressLimit()),
              liveness_.seconds_per_token() * 1e3);
        }
      }
      if (stopping_) break;
      if (!stream_events_.empty()) {
        event = std::move(stream_events_.front());
        stream_events_.pop_front();
      }
    }
    if (!stuck.empty()) {
      {
        absl::MutexLock lock(&mu_);
        lost_alive_ = true;
      }
      LoseWorker(stuck);
    } else if (event && !event->result) {
      LoseWorker(event->closed_reason);
    } else if (event) {
      ApplyResult(*event->result);
      // Unless the result lost the worker, its messages serve the next results.
      if (connection_ != nullptr) connection_->Recycle(*std::move(event->result));
    }
  }

  // Stopping: end everything still here.
  std::deque<std::shared_ptr<engine::Request>> inbox;
  {
    absl::MutexLock lock(&mu_);
    ReturnPushWaitsToInbox();
    inbox.swap(inbox_);
    inbox_handoffs_ = 0;
    healthy_.store(false);
    live_connection_ = nullptr;
  }
  if (engine_ != nullptr) {
    for (std::shared_ptr<engine::Request>& request : engine_->TakeAll()) {
      request->Finish(loom::v1::FINISH_REASON_ABORT, "the coordinator is shutting down",
                      replica_id_);
    }
  }
  for (auto& request : inbox) {
    request->Finish(loom::v1::FINISH_REASON_ABORT, "the coordinator is shutting down",
                    replica_id_);
  }
  load_.store(0);
  load_tokens_.store(0);
  connection_.reset();  // cancels the streams and joins their readers
}

bool Replica::ConnectStream(const WorkerEndpoint& endpoint) {
  {
    absl::MutexLock lock(&mu_);
    stream_events_.clear();
  }
  // Results (complete once every rank answered) and the failure that ends the
  // connection reach the loop through stream_events_.
  const int stages = std::max(endpoint.pipeline_parallel_size, 1);
  const int first_sampling_rank =
      static_cast<int>(endpoint.addresses.size()) / stages * (stages - 1);
  absl::StatusOr<std::unique_ptr<ReplicaConnection>> connection = ReplicaConnection::Connect(
      endpoint.addresses, absl::Seconds(5),
      [this](ReplicaConnection::Event event) {
        absl::MutexLock lock(&mu_);
        stream_events_.push_back({std::move(event.result), std::move(event.failure)});
      },
      first_sampling_rank);
  if (!connection.ok()) {
    std::fprintf(stderr, "loom: replica %s: %s\n", replica_id_.c_str(),
                 std::string(connection.status().message()).c_str());
    return false;
  }
  connection_ = *std::move(connection);
  stream_first_step_id_ = next_step_id_;
  engine::SchedulerConfig config;
  config.block_size = endpoint.block_size;
  config.num_blocks = endpoint.num_kv_blocks;
  config.max_num_batched_tokens = options_.max_num_batched_tokens;
  config.max_num_seqs = options_.max_num_seqs;
  config.max_waiting = std::numeric_limits<int32_t>::max();  // bounded in Submit
  config.enable_prefix_caching = options_.enable_prefix_caching;
  config.speculation = options_.speculation;
  pipelined_ = stages > 1;
  // A prefill replica runs one plan at a time: its steps are long, and what it hands off
  // leaves with the plan right after the step that computed it (not after another prompt's).
  plans_in_flight_ = endpoint.role == ReplicaRole::kPrefill
                         ? stages
                         : std::max(options_.max_plans_in_flight, stages);
  config.speculation.pipelined = plans_in_flight_ > 1;
  // Pipeline stages before the last never sample: every plan names the tokens it
  // computes, so a sequence waits for its sample before its next plan.
  config.overlap_samples = !pipelined_;
  config.micro_batches = stages;
  config.sliding_window = options_.sliding_window;
  config.num_host_blocks = endpoint.num_host_kv_blocks;
  config.host_load_seconds_per_block = endpoint.kv_load_seconds_per_block;
  config.record_kv_events = kv_index_ != nullptr;
  engine::EngineCore::Hooks hooks;
  hooks.on_token = [this](engine::Request&, const loom::v1::SequenceOutput&, bool) {
    load_tokens_.fetch_add(1);
  };
  hooks.on_end = [this](engine::Request& request) {
    ReleaseHandOffTarget(request.seq_id());
    Unload(request);
  };
  hooks.on_handoff = [this](std::shared_ptr<engine::Request> request) {
    Unload(*request);
    prefilled_.push_back(std::move(request));
  };
  engine_ = std::make_unique<engine::EngineCore>(config, replica_id_, std::move(hooks));
  if (endpoint.cached_blocks != nullptr && !endpoint.cached_blocks->empty()) {
    const int64_t adopted = engine_->scheduler().AdoptPrefixCache(*endpoint.cached_blocks);
    std::fprintf(
        stderr, "loom: replica %s: adopted %lld of the %zu cached KV blocks the workers hold\n",
        replica_id_.c_str(), static_cast<long long>(adopted), endpoint.cached_blocks->size());
    PublishKvEvents();  // routing sees the adopted prefixes before the first step
  }
  ClaimCarriedSlots();
  block_size_.store(endpoint.block_size);
  host_tier_blocks_.store(endpoint.num_host_kv_blocks);
  in_flight_.clear();
  {
    absl::MutexLock lock(&mu_);
    lost_reason_.clear();
    live_connection_ = connection_.get();
    endpoint_ = endpoint;
    // Tensor-parallel sizes may differ (heads are mapped) where every rank reports its KV
    // heads; pipeline stages hold layer ranges, so their ranks must match one to one.
    const bool heads_known = !endpoint.kv_heads.empty() &&
                             std::all_of(endpoint.kv_heads.begin(), endpoint.kv_heads.end(),
                                         [](const KvHeadRange& heads) { return heads.count > 0; });
    kv_layout_ = absl::StrFormat(
        "%s%d-token blocks of %s KV",
        stages > 1 || !heads_known
            ? absl::StrFormat("%d ranks in %d stages, ", endpoint.addresses.size(), stages)
            : "",
        endpoint.block_size, endpoint.kv_dtype);
    pool_scope_.clear();
    if (!endpoint.kv_pool_scopes.empty() &&
        std::all_of(endpoint.kv_pool_scopes.begin(), endpoint.kv_pool_scopes.end(),
                    [&](const std::string& id) { return id == endpoint.kv_pool_scopes[0]; })) {
      pool_scope_ = endpoint.kv_pool_scopes[0];
    }
    stats_.set_max_plans_in_flight(plans_in_flight_);
    liveness_.Reset(static_cast<int>(endpoint.addresses.size()), absl::Now());
    healthy_.store(true);
    wants_registration_.store(false);
  }
  PublishStats();
  std::fprintf(
      stderr, "loom: replica %s: %s connected (%lld KV blocks of %d tokens%s)\n",
      replica_id_.c_str(),
      endpoint.addresses.size() == 1
          ? ("worker " + endpoint.address).c_str()
          : absl::StrFormat(
                "%d ranks%s (rank 0 at %s)", endpoint.addresses.size(),
                stages > 1 ? absl::StrFormat(" in %d pipeline stages", stages) : std::string(),
                endpoint.address)
                .c_str(),
      static_cast<long long>(endpoint.num_kv_blocks), endpoint.block_size,
      endpoint.num_host_kv_blocks > 0
          ? absl::StrFormat(", a host tier of %d blocks", endpoint.num_host_kv_blocks).c_str()
          : "");
  return true;
}

void Replica::AdmitInbox() {
  std::deque<std::shared_ptr<engine::Request>> inbox;
  std::vector<SubmitOptions> placements;
  {
    absl::MutexLock lock(&mu_);
    inbox.swap(inbox_);
    inbox_handoffs_ = 0;
    admitting_ = static_cast<int64_t>(inbox.size());
    for (const std::shared_ptr<engine::Request>& request : inbox) {
      auto hint = placements_.find(request.get());
      placements.push_back(hint == placements_.end() ? SubmitOptions{} : hint->second);
      if (hint != placements_.end()) placements_.erase(hint);
    }
  }
  TakeAnsweredPushWaits(inbox, placements);
  if (inbox.empty()) return;
  // A request back on the replica that just finished its sequence (a prefill replica takes
  // back a hand-off no decode replica took) waits for the plan that releases the old one.
  std::vector<std::pair<std::shared_ptr<engine::Request>, SubmitOptions>> deferred;
  for (size_t i = 0; i < inbox.size(); ++i) {
    const SubmitOptions& placement = placements[i];
    if (engine_->scheduler().releasing(inbox[i]->seq_id())) {
      deferred.emplace_back(std::move(inbox[i]), placement);
      continue;
    }
    if (placement.handed_off && placement.export_reply.has_value() &&
        placement.export_reply->pushed) {
      const auto hold = push_holds_.find(inbox[i]->seq_id());
      const bool held = hold != push_holds_.end() && hold->second.delivered;
      if (held || inbox[i]->cancelled() || placement.fetch_source == nullptr ||
          !placement.fetch_source->healthy()) {
        AdmitPushed(inbox[i]);
      } else {
        // Its hold went with a worker this replica lost (replica_carried_slots.cc): the
        // prefill replica still has the prompt's KV cached, pulled as any hand-off's.
        EndPushHold(inbox[i]->seq_id());  // one not delivered yet
        StartFetch(std::move(inbox[i]), placement.fetch_source, /*handed_off=*/true);
      }
      continue;
    }
    if (AwaitPushTarget(inbox[i], placement)) continue;
    // A hand-off that pulls (its push failed, or it was placed elsewhere first): no slots
    // wait for a push any more.
    if (placement.handed_off) EndPushHold(inbox[i]->seq_id());
    // A prefix another replica holds is fetched first (replica_kv_fetch.cc), when fetches
    // as measured so far beat recomputing it; a hand-off's KV always is.
    if (placement.fetch_source != nullptr && !inbox[i]->cancelled() &&
        (placement.handed_off || FetchPays(*inbox[i], *placement.fetch_source))) {
      const bool exported = placement.export_reply.has_value();
      const uint64_t fetch_id = StartFetch(std::move(inbox[i]), placement.fetch_source,
                                           placement.handed_off, /*ask=*/!exported);
      if (exported) {
        KvExport reply = *placement.export_reply;
        reply.fetch_id = fetch_id;
        DeliverExport(std::move(reply));
      }
      continue;
    }
    if (placement.export_reply.has_value() && placement.export_reply->export_id != 0) {
      placement.fetch_source->ReleaseExport(placement.export_reply->export_id);
    }
    if (placement.handed_off) inbox[i]->MarkHandoffDone();
    AdmitOne(inbox[i], placement.hand_off_to);
  }
  if (!deferred.empty()) {
    absl::MutexLock lock(&mu_);
    for (auto& [request, placement] : deferred) {
      if (placement.fetch_source != nullptr || placement.hand_off_to != nullptr) {
        placements_[request.get()] = placement;
      }
      inbox_.push_front(std::move(request));
    }
  }
  // The admitted requests now count in the scheduler's waiting queue.
  PublishStats();
}

bool Replica::CopiesRan(uint64_t last_copy_plan) const {
  if (last_copy_plan == 0) return true;
  const engine::HostKvTier* tier = engine_->scheduler().host_tier();
  // Still queued: the next plan carries them.
  if (tier == nullptr || tier->copy_plans_taken() < last_copy_plan) return false;
  return in_flight_.empty() || in_flight_.front().copy_plan > last_copy_plan;
}

void Replica::DropCancelled() {
  std::vector<uint64_t> cancelled;
  for (const auto& [seq_id, request] : engine_->requests()) {
    if (request->cancelled()) cancelled.push_back(seq_id);
  }
  for (uint64_t seq_id : cancelled) {
    EndRequest(seq_id, loom::v1::FINISH_REASON_ABORT, "cancelled");
  }
}

bool Replica::SendPlans() {
  bool sent = false;
  while (static_cast<int>(in_flight_.size()) < plans_in_flight_ &&
         engine_->scheduler().has_work()) {
    const absl::Time start = absl::Now();
    engine::SchedulerOutput out;
    InFlightPlan flight;
    if (!engine_->Plan(out, flight.record)) break;
    // Reused: a cleared plan keeps its sequence messages (Write serializes before it returns).
    loom::v1::StepPlan& plan = plan_scratch_;
    flight.step_id = next_step_id_++;
    const engine::HostKvTier* tier = engine_->scheduler().host_tier();
    flight.copy_plan = tier != nullptr ? tier->copy_plans_taken() : 0;
    engine::BuildStepPlan(out, flight.step_id, plan, /*with_input_tokens=*/pipelined_);
    AddKvPushes(plan, flight);
    flight.holds_closed = std::move(out.kv_push_holds_closed);
    num_kv_copies_queued_ = static_cast<int32_t>(out.kv_copies.size());
    schedule_seconds_ += SecondsSince(start);
    ++num_steps_;
    if (out.num_decode_tokens > 0 && out.num_prefill_tokens > 0) ++num_mixed_steps_;
    num_tokens_computed_ += flight.record.num_tokens;
    flight.sent = absl::Now();
    if (in_flight_.empty()) {
      // The worker is idle: it starts this plan now.
      absl::MutexLock lock(&mu_);
      liveness_.OnHeadStarted(flight.record.num_tokens, flight.sent);
    }
    // Written or not, it may have reached some rank: its closes count as in flight.
    const bool written = connection_->Write(plan);
    in_flight_.push_back(std::move(flight));
    if (!written) return false;
    sent = true;
  }
  if (sent) {
    ReleaseImportHolds();
    PublishKvEvents();
    PublishStats();
  }
  return true;
}

void Replica::ApplyResult(const loom::v1::StepResult& result) {
  if (in_flight_.empty() || in_flight_.front().step_id != result.step_id()) {
    LoseWorker(absl::StrFormat("the worker answered step %d out of order", result.step_id()));
    return;
  }
  InFlightPlan plan = std::move(in_flight_.front());
  in_flight_.pop_front();
  step_seconds_ += SecondsSince(plan.sent);
  {
    // The worker runs plans in order: the next one starts now, whenever it was sent.
    absl::MutexLock lock(&mu_);
    liveness_.OnStepDone(result.num_tokens(), result.timings().total_seconds());
    if (!in_flight_.empty()) {
      liveness_.OnHeadStarted(in_flight_.front().record.num_tokens, absl::Now());
    }
  }
  const auto code = static_cast<absl::StatusCode>(result.error_code());
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    // A collective or a pipeline link broke (a rank or stage died, or stalls): the group
    // cannot run another step. Its requests are retried or migrated as for a lost stream,
    // not ended as if the plan had been refused; the stream's own end may come later.
    LoseWorker(absl::StrFormat("step %d failed on the worker: %s", result.step_id(),
                               result.error_message()));
    return;
  }
  if (result.error_code() != 0) {
    std::fprintf(stderr, "loom: replica %s: step %llu failed on the worker: %s\n",
                 replica_id_.c_str(), static_cast<unsigned long long>(result.step_id()),
                 result.error_message().c_str());
  }
  ConfirmKvPushes(plan, result);
  engine_->Apply(plan.record, result);
  HandOffPrefilled();
  PublishKvEvents();
  PublishStats();
}

void Replica::EndRequest(uint64_t seq_id, loom::v1::FinishReason reason,
                         const std::string& message) {
  engine_->End(seq_id, reason, message);
}

void Replica::Unload(const engine::Request& request) {
  load_.fetch_sub(1);
  load_tokens_.fetch_sub(static_cast<int64_t>(request.params().prompt_ids.size()) +
                         request.num_outputs());
}

void Replica::PublishKvEvents() {
  if (kv_index_ == nullptr || engine_ == nullptr) return;
  const std::vector<engine::KvCacheEvent> events = engine_->scheduler().TakeKvEvents();
  kv_index_->Apply(replica_id_, events);
}

void Replica::LoseWorker(const std::string& reason, bool registered_again) {
  std::string why = reason;
  std::deque<std::shared_ptr<engine::Request>> inbox;
  absl::flat_hash_map<const engine::Request*, SubmitOptions> placements;
  {
    absl::MutexLock lock(&mu_);
    if (!lost_reason_.empty()) why = lost_reason_;
    healthy_.store(false);
    // Lost for silence or a stuck step, the worker may live on: it registers again (unless
    // a registration is here already).
    if (lost_alive_ && !registered_again && !pending_connect_.has_value()) {
      wants_registration_.store(true);
    }
    lost_alive_ = false;
    connection_epoch_.fetch_add(1);  // answers to asks made before now are stale
    live_connection_ = nullptr;
    ReturnPushWaitsToInbox();
    inbox.swap(inbox_);
    inbox_handoffs_ = 0;
    placements.swap(placements_);
    // Holds for hand-offs end with the pool they were in: a hand-off that still comes is
    // admitted (or refused) as any request.
    reservations_.clear();
    reserved_blocks_ = 0;
    held_for_waiting_ = 0;
  }
  // Hand-offs not admitted yet: the prefill replicas may let their exports go (outside this
  // replica's lock: ReleaseExport takes theirs). Prompts not admitted to prefill here: their
  // decode replicas' holds end (they are placed again).
  for (const auto& [request, placement] : placements) {
    if (placement.export_reply.has_value() && placement.export_reply->export_id != 0) {
      placement.fetch_source->ReleaseExport(placement.export_reply->export_id);
    }
    if (placement.hand_off_to != nullptr) {
      placement.hand_off_to->ReleaseReservation(request->seq_id());
    }
  }
  std::fprintf(stderr, "loom: replica %s: worker lost: %s\n", replica_id_.c_str(), why.c_str());
  CarryLostTransfers();  // the worker may live on, its tier's memory too
  connection_.reset();  // cancels every rank's stream and joins the readers
  in_flight_.clear();
  {
    absl::MutexLock lock(&mu_);
    stream_events_.clear();
  }

  std::vector<std::shared_ptr<engine::Request>> retry(inbox.begin(), inbox.end());
  // Its prefill-only requests are placed again (no output yet): their holds end.
  AbandonPushes();
  while (!hand_off_targets_.empty()) ReleaseHandOffTarget(hand_off_targets_.begin()->first);
  for (std::shared_ptr<engine::Request>& request : AbandonFetches()) {
    retry.push_back(std::move(request));
  }
  int migrated = 0;
  if (engine_ != nullptr) {
    for (std::shared_ptr<engine::Request>& request : engine_->TakeAll()) {
      if (request->cancelled()) {
        request->Finish(loom::v1::FINISH_REASON_ABORT, "cancelled", replica_id_);
      } else if (!request->produced_output() || request->handoff_undecoded()) {
        // Nothing streamed from here yet (a hand-off's first token came from its prefill
        // replica): placed again without counting a migration.
        retry.push_back(std::move(request));
      } else if (request->num_migrations() < options_.migration_limit) {
        // Its client keeps the stream: another replica recomputes prompt and outputs and
        // continues (a seeded sampler replays its draws, so the tokens are the same).
        request->CountMigration();
        ++migrated;
        retry.push_back(std::move(request));
      } else {
        request->Finish(loom::v1::FINISH_REASON_ERROR,
                        absl::StrFormat("replica %s lost its worker: %s", replica_id_, why),
                        replica_id_);
      }
    }
  }
  if (migrated > 0) {
    std::fprintf(stderr, "loom: replica %s: %d requests with output migrate to other replicas\n",
                 replica_id_.c_str(), migrated);
  }
  load_.store(0);
  load_tokens_.store(0);
  // The worker's KV pool is gone with it: nothing it cached can be reused.
  if (kv_index_ != nullptr) kv_index_->RemoveReplica(replica_id_);
  if (engine_ != nullptr) engine_->scheduler().TakeKvEvents();
  PublishStats();
  for (std::shared_ptr<engine::Request>& request : retry) retry_(std::move(request));
}

int64_t Replica::LocalPrefillLimitNow(const engine::StepCostModel& cost,
                                      int64_t num_running) const {
  if (options_.max_local_prefill_length > 0) return options_.max_local_prefill_length;
  return engine::LocalPrefillLimit(cost, num_running, MeasuredHandOffSeconds());
}

std::optional<double> Replica::MeasuredHandOffSeconds() const {
  if (num_handoffs_measured_ == 0) return std::nullopt;
  return handoff_seconds_ / static_cast<double>(num_handoffs_measured_);
}

double Replica::FirstTokenSeconds(int64_t tokens) const {
  absl::MutexLock lock(&mu_);
  return engine::FirstTokenSeconds(prefill_rate_, tokens);
}

double Replica::mean_handoff_seconds() const {
  absl::MutexLock lock(&mu_);
  return mean_handoff_seconds_;
}

void Replica::PublishStats() {
  absl::MutexLock lock(&mu_);
  admitting_ = 0;
  stats_.set_num_steps(num_steps_);
  stats_.set_num_mixed_steps(num_mixed_steps_);
  stats_.set_num_tokens_computed(num_tokens_computed_);
  stats_.set_schedule_seconds(schedule_seconds_);
  stats_.set_step_seconds(step_seconds_);
  if (engine_ != nullptr && healthy_.load()) {
    const engine::Scheduler& scheduler = engine_->scheduler();
    stats_.set_num_kv_blocks(scheduler.block_manager().num_blocks());
    stats_.set_num_free_blocks(scheduler.block_manager().num_free());
    stats_.set_num_running(scheduler.num_running());
    // Requests waiting for a prefix fetch wait too, before the scheduler has them.
    stats_.set_num_waiting(scheduler.num_waiting() + static_cast<int32_t>(pending_fetches_.size()));
    stats_.set_num_preemptions(scheduler.num_preemptions());
    stats_.set_num_window_freed_blocks(scheduler.num_window_freed_blocks());
    if (const engine::HostKvTier* tier = scheduler.host_tier(); tier != nullptr) {
      stats_.set_num_host_kv_blocks(tier->num_slots());
      stats_.set_num_host_kv_blocks_used(tier->num_used());
      stats_.set_num_host_kv_blocks_held(tier->num_held());
      stats_.set_num_kv_blocks_offloaded(tier->num_demoted());
      stats_.set_num_kv_blocks_reloaded(tier->num_promoted());
      stats_.set_num_host_hit_tokens(static_cast<uint64_t>(scheduler.num_host_tokens_admitted()));
      stats_.set_num_kv_copies_queued(num_kv_copies_queued_);
    }
    // Fetches into the host tier, or pool to pool without one.
    stats_.set_num_kv_fetches(num_kv_fetches_);
    stats_.set_num_kv_pool_fetches(num_kv_pool_fetches_);
    stats_.set_num_kv_fetch_failures(num_kv_fetch_failures_);
    stats_.set_num_kv_fetched_blocks(num_kv_fetched_blocks_);
    stats_.set_kv_fetch_seconds(kv_fetch_seconds_);
    stats_.set_num_handoffs_out(num_handoffs_out_);
    stats_.set_num_handoffs_pushed(num_handoffs_pushed_);
    stats_.set_num_handoffs_in(num_handoffs_in_);
    stats_.set_num_handoff_failures(num_handoff_failures_);
    held_for_waiting_ = scheduler.num_blocks_held_for_waiting();
    const int64_t limit =
        LocalPrefillLimitNow(scheduler.speculation_policy().cost_model(), scheduler.num_running());
    local_prefill_limit_.store(limit);
    const engine::SchedulerConfig& config = scheduler.config();
    // A decode replica prefills in chunks that at most double its decodes' step, and in
    // chunks of the limit without decodes running.
    const bool capped = role_.load() == ReplicaRole::kDecode;
    const int64_t chunk =
        capped ? engine::PrefillChunkBesideDecodes(scheduler.speculation_policy().cost_model(),
                                                   scheduler.num_decoding(),
                                                   std::min(limit, config.max_num_batched_tokens))
               : config.max_num_batched_tokens;
    prefill_chunk_.store(chunk);
    // What waits in the inbox is not the scheduler's yet (hand-offs bring their KV).
    int64_t queued = scheduler.num_prompt_tokens_pending();
    for (const std::shared_ptr<engine::Request>& request : inbox_) {
      const auto placed = placements_.find(request.get());
      if (placed == placements_.end() || !placed->second.handed_off) {
        queued += static_cast<int64_t>(request->params().prompt_ids.size());
      }
    }
    for (const PushWait& wait : awaiting_push_) {
      queued += static_cast<int64_t>(wait.request->params().prompt_ids.size());
    }
    prefill_rate_ = engine::MeasurePrefillRate(scheduler.speculation_policy().cost_model(),
                                               scheduler.num_decoding(), chunk, queued);
    mean_handoff_seconds_ = MeasuredHandOffSeconds().value_or(0.0);
    // A decode replica prefills what it takes itself (short prompts, and long ones when the
    // prefill replicas are busy or gone) in those chunks beside its decodes. Without decodes
    // in chunks of the limit: a hand-off arriving mid-step waits out the chunks of the plans
    // in flight.
    if (capped) {
      engine_->scheduler().set_max_prefill_tokens_beside_decodes(chunk, /*without_decodes=*/true);
    }
  } else {
    stats_.set_num_running(0);
    stats_.set_num_waiting(0);
    prefill_rate_ = engine::PrefillRate();
  }
}

}  // namespace loom::coordinator
