#include "coordinator/cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "coordinator/kv_cache_report.h"

namespace loom::coordinator {

absl::Duration HeartbeatInterval(const ClusterOptions& options) {
  const absl::Duration interval =
      std::min({absl::Milliseconds(options.heartbeat_interval_ms), options.heartbeat_timeout / 4,
                options.replica.liveness.no_progress_timeout / 4});
  return std::max(interval, absl::Milliseconds(10));
}

namespace {

// Pipeline stages must hold the model's layers in order: every rank of stage s the same
// range, stage 0 from layer 0, each next stage from where the previous one ends (workers
// given different --pipeline-layer-partition lists would otherwise compute some layers
// twice and others never).
absl::Status CheckStageLayers(const std::vector<std::optional<loom::v1::RegisterRequest>>& ranks,
                              int stages) {
  if (stages <= 1) return absl::OkStatus();
  const size_t per_stage = ranks.size() / static_cast<size_t>(stages);
  int32_t next = 0;
  for (int s = 0; s < stages; ++s) {
    const loom::v1::RegisterRequest& lead = *ranks[s * per_stage];
    for (size_t k = 0; k < per_stage; ++k) {
      const loom::v1::RegisterRequest& rank = *ranks[s * per_stage + k];
      if (rank.pipeline_first_layer() != lead.pipeline_first_layer() ||
          rank.pipeline_num_layers() != lead.pipeline_num_layers()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the ranks of pipeline stage %d hold different layers ([%d, +%d) and [%d, +%d))", s,
            lead.pipeline_first_layer(), lead.pipeline_num_layers(), rank.pipeline_first_layer(),
            rank.pipeline_num_layers()));
      }
    }
    if (lead.pipeline_first_layer() != next || lead.pipeline_num_layers() < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pipeline stage %d holds layers [%d, %d) but should start at layer %d (give every "
          "stage the same --pipeline-layer-partition)",
          s, lead.pipeline_first_layer(), lead.pipeline_first_layer() + lead.pipeline_num_layers(),
          next));
    }
    next += lead.pipeline_num_layers();
  }
  return absl::OkStatus();
}

// The options with the replicas' heartbeat interval filled in.
ClusterOptions WithHeartbeatInterval(ClusterOptions options) {
  options.replica.liveness.heartbeat_interval = HeartbeatInterval(options);
  return options;
}

// A registration's own fields, before any replica is touched: FailedPrecondition for
// another protocol or model, InvalidArgument for values no worker sends.
absl::Status CheckRegisterRequest(const loom::v1::RegisterRequest& request,
                                  const std::string& model_fingerprint) {
  if (request.protocol_version() != loom::v1::PROTOCOL_VERSION_CURRENT) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the worker speaks protocol version %d, this coordinator speaks version %d",
        request.protocol_version(), static_cast<int>(loom::v1::PROTOCOL_VERSION_CURRENT)));
  }
  if (request.model().fingerprint() != model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the worker serves model '%s' (fingerprint %s); this coordinator serves fingerprint %s",
        request.model().path(), request.model().fingerprint(), model_fingerprint));
  }
  if (request.world_size() < 1 || request.rank() < 0 ||
      request.rank() >= request.world_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d is outside a replica of world size %d", request.rank(), request.world_size()));
  }
  if (request.pipeline_parallel_size() < 0 || request.pipeline_first_layer() < 0 ||
      request.pipeline_num_layers() < 0 || request.kv_head_begin() < 0 ||
      request.num_kv_heads() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "registration: negative pipeline or KV head fields (%d stages, layers [%d, +%d), KV "
        "heads [%d, +%d))",
        request.pipeline_parallel_size(), request.pipeline_first_layer(),
        request.pipeline_num_layers(), request.kv_head_begin(), request.num_kv_heads()));
  }
  // The element types workers write (worker/step_backend_factory.h's KvPoolDtypeName);
  // empty: an older worker's F16.
  static constexpr const char* kKvDtypes[] = {"", "f16", "bf16", "f32", "int8", "fp8_e4m3"};
  if (std::find(std::begin(kKvDtypes), std::end(kKvDtypes), request.kv_dtype()) ==
      std::end(kKvDtypes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "registration: unknown KV cache dtype '%s' (f16, bf16, f32, int8, fp8_e4m3)",
        request.kv_dtype().substr(0, 64)));
  }
  const int stages = std::max(request.pipeline_parallel_size(), 1);
  if (request.world_size() % stages != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a replica of %d ranks cannot form %d pipeline stages of equal size",
                        request.world_size(), stages));
  }
  if (request.worker_address().empty() || request.num_kv_blocks() <= 0 ||
      request.block_size() <= 0 || request.replica_id().empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "registration needs a worker address, a replica id and a KV pool; got address '%s', "
        "replica '%s', %d blocks of %d tokens",
        request.worker_address(), request.replica_id(), request.num_kv_blocks(),
        request.block_size()));
  }
  const absl::StatusOr<ReplicaRole> role = ParseReplicaRole(request.role());
  if (!role.ok()) return role.status();
  if (request.num_host_kv_blocks() < 0 ||
      request.num_host_kv_blocks() > std::numeric_limits<int32_t>::max() ||
      !(request.kv_load_seconds_per_block() >= 0) ||
      !std::isfinite(request.kv_load_seconds_per_block())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "registration: a host KV tier of %d blocks loading in %g s per block is not valid",
        request.num_host_kv_blocks(), request.kv_load_seconds_per_block()));
  }
  return absl::OkStatus();
}

}  // namespace

Cluster::Cluster(ClusterOptions options, std::string model_fingerprint)
    : options_(WithHeartbeatInterval(options)),
      model_fingerprint_(std::move(model_fingerprint)),
      router_(options.router, kv_index_) {
  monitor_ = std::thread([this] { Monitor(); });
}

Cluster::~Cluster() { Stop(); }

absl::StatusOr<loom::v1::RegisterResponse> Cluster::Register(
    const loom::v1::RegisterRequest& request) {
  if (absl::Status checked = CheckRegisterRequest(request, model_fingerprint_); !checked.ok()) {
    return checked;
  }
  const int stages = std::max(request.pipeline_parallel_size(), 1);
  const ReplicaRole role = *ParseReplicaRole(request.role());  // checked above
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
    // A replica's ranks register one by one; it connects once all of them did. A rank
    // registering again (a restart) starts a new group: its peers must restart too (their
    // collectives with the old rank fail, and so does the replica until then).
    PendingRanks& pending = pending_ranks_[request.replica_id()];
    const auto& earlier = pending.ranks.size() > static_cast<size_t>(request.rank())
                              ? pending.ranks[request.rank()]
                              : std::optional<loom::v1::RegisterRequest>();
    const bool restarted =
        earlier.has_value() && earlier->worker_address() != request.worker_address();
    if (pending.world_size != request.world_size() || restarted) {
      pending = PendingRanks{};
      pending.world_size = request.world_size();
      pending.ranks.resize(request.world_size());
    }
    pending.ranks[request.rank()] = request;
    const bool complete = std::all_of(pending.ranks.begin(), pending.ranks.end(),
                                      [](const auto& rank) { return rank.has_value(); });
    if (complete) {
      WorkerEndpoint endpoint;
      endpoint.address = pending.ranks[0]->worker_address();
      endpoint.block_size = pending.ranks[0]->block_size();
      endpoint.backend = pending.ranks[0]->backend();
      endpoint.num_kv_blocks = pending.ranks[0]->num_kv_blocks();
      endpoint.num_host_kv_blocks = pending.ranks[0]->num_host_kv_blocks();
      endpoint.pipeline_parallel_size = stages;
      endpoint.role = role;
      endpoint.kv_dtype = request.kv_dtype();
      // The ranks must agree; the refusal is written before the pending ranks it names go.
      absl::Status disagree;
      for (const auto& rank : pending.ranks) {
        if (ParseReplicaRole(rank->role()).value_or(ReplicaRole::kMixed) != role) {
          disagree = absl::FailedPreconditionError(
              absl::StrFormat("the ranks of replica %s disagree on their role ('%s' and '%s')",
                              request.replica_id(), request.role(), rank->role()));
          break;
        }
        if (std::max(rank->pipeline_parallel_size(), 1) != stages) {
          disagree = absl::FailedPreconditionError(absl::StrFormat(
              "the ranks of replica %s disagree on the pipeline parallel size (%d and %d)",
              request.replica_id(), stages, rank->pipeline_parallel_size()));
          break;
        }
        if (rank->kv_dtype() != endpoint.kv_dtype) {
          disagree = absl::FailedPreconditionError(absl::StrFormat(
              "the ranks of replica %s disagree on the KV cache dtype ('%s' and '%s')",
              request.replica_id(), endpoint.kv_dtype, rank->kv_dtype()));
          break;
        }
        if (rank->block_size() != endpoint.block_size) {
          disagree = absl::FailedPreconditionError(absl::StrFormat(
              "the ranks of replica %s disagree on the KV block size (%d and %d tokens)",
              request.replica_id(), endpoint.block_size, rank->block_size()));
          break;
        }
        endpoint.addresses.push_back(rank->worker_address());
        endpoint.kv_heads.push_back({rank->kv_head_begin(), rank->num_kv_heads()});
        endpoint.host_kv_shared.push_back(rank->host_kv_shared());
        endpoint.kv_pool_scopes.push_back(rank->kv_pool_scope());
        // The replica's pool is what every rank can hold.
        endpoint.num_kv_blocks = std::min(endpoint.num_kv_blocks, rank->num_kv_blocks());
        endpoint.num_host_kv_blocks =
            std::max<int64_t>(0, std::min(endpoint.num_host_kv_blocks, rank->num_host_kv_blocks()));
        endpoint.kv_load_seconds_per_block =
            std::max(endpoint.kv_load_seconds_per_block, rank->kv_load_seconds_per_block());
      }
      if (!disagree.ok()) {
        pending_ranks_.erase(request.replica_id());
        return disagree;
      }
      if (absl::Status tiled = CheckStageLayers(pending.ranks, stages); !tiled.ok()) {
        pending_ranks_.erase(request.replica_id());
        return absl::FailedPreconditionError(
            absl::StrFormat("replica %s: %s", request.replica_id(), tiled.message()));
      }
      // Only for a replica that connects: the blocks its ranks still hold.
      std::vector<const loom::v1::RegisterRequest*> reports;
      for (const auto& rank : pending.ranks) reports.push_back(&*rank);
      endpoint.cached_blocks = std::make_shared<const std::vector<engine::AdoptedBlock>>(
          AdoptableBlocks(reports, model_fingerprint_, endpoint.block_size));
      pending_ranks_.erase(request.replica_id());
      // A replica scaled in and out again (the same pod name) serves again.
      draining_replicas_.erase(request.replica_id());
      kv_dtypes_[request.replica_id()] = request.kv_dtype();
      std::unique_ptr<Replica>& replica = replicas_[request.replica_id()];
      if (replica == nullptr) {
        replica = std::make_unique<Replica>(
            request.replica_id(), options_.replica,
            [this](std::shared_ptr<engine::Request> r) { Retry(std::move(r)); }, &kv_index_,
            [this](std::shared_ptr<engine::Request> r, Replica* source, Replica* target,
                   KvExport exported) {
              HandOff(std::move(r), source, target, std::move(exported));
            });
      }
      replica->Connect(endpoint);
    } else if (auto it = replicas_.find(request.replica_id()); it != replicas_.end()) {
      // A rank of a running replica came back alone: the old group is broken.
      it->second->MarkLost(absl::StrFormat("rank %d registered again", request.rank()));
    }
  }
  std::fprintf(
      stderr, "loom: worker %s registered for replica %s (%s backend%s)\n",
      request.worker_address().c_str(), request.replica_id().c_str(), request.backend().c_str(),
      role == ReplicaRole::kMixed ? "" : absl::StrFormat(", %s", ReplicaRoleName(role)).c_str());
  loom::v1::RegisterResponse response;
  response.set_worker_id(absl::StrFormat("%s/%d", request.replica_id(), request.rank()));
  const absl::Duration interval = options_.replica.liveness.heartbeat_interval;
  response.set_heartbeat_interval_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(interval)));
  return response;
}

absl::Status Cluster::Heartbeat(const loom::v1::HeartbeatRequest& request) {
  const std::string& id = request.worker_id();
  const size_t slash = id.rfind('/');
  absl::MutexLock lock(&mu_);
  auto it = slash == std::string::npos ? replicas_.end() : replicas_.find(id.substr(0, slash));
  // A rank whose peers have not all registered yet is known, just not serving.
  if (it == replicas_.end() && slash != std::string::npos &&
      pending_ranks_.contains(id.substr(0, slash))) {
    return absl::OkStatus();
  }
  if (it == replicas_.end()) {
    return absl::NotFoundError(absl::StrFormat("unknown worker id '%s': register again", id));
  }
  int rank = 0;
  if (!absl::SimpleAtoi(id.substr(slash + 1), &rank)) rank = -1;  // counts as alive only
  // Lost for silence or a stuck step, yet alive: its step stream is gone, so it registers
  // again. Not a rank that did so already and waits for its peers, nor one shutting down.
  auto pending = pending_ranks_.find(it->first);
  const bool waiting = pending != pending_ranks_.end() && rank >= 0 &&
                       static_cast<size_t>(rank) < pending->second.ranks.size() &&
                       pending->second.ranks[static_cast<size_t>(rank)].has_value();
  if (it->second->wants_registration() && !waiting && !draining_replicas_.contains(it->first)) {
    return absl::NotFoundError(absl::StrFormat(
        "replica %s lost worker '%s' and needs it registered again", it->first, id));
  }
  it->second->Heartbeat(rank, request.progress());
  return absl::OkStatus();
}

absl::Status Cluster::Submit(std::shared_ptr<engine::Request> request) {
  if (draining_.load()) {
    return absl::UnavailableError("the coordinator is shutting down (draining)");
  }
  std::vector<Replica*> candidates = Candidates();
  if (candidates.empty()) return absl::UnavailableError("no replica is available to serve");
  // Every replica of a coordinator serves one model; their block sizes are the workers'
  // choice and normally equal. The prompt is hashed once, for the first candidate's size;
  // a replica with another size gets no prefix credit from the router.
  const int32_t block_size = std::max(candidates.front()->block_size(), 1);
  const std::vector<engine::BlockHash>& hashes =
      request->PromptBlockHashes(model_fingerprint_, block_size);
  const std::vector<Replica*> prefill = SplitPrefill(candidates);
  if (!prefill.empty()) {
    if (std::optional<absl::Status> placed =
            PlaceDisaggregated(request, candidates, prefill, hashes, block_size)) {
      return *placed;
    }
  }
  const absl::Span<const engine::BlockHash> matchable =
      candidates.size() > 1 ? absl::MakeConstSpan(hashes) : absl::Span<const engine::BlockHash>();
  RouteDecision decision = Rank(candidates, PromptTokens(*request), matchable, block_size);
  PreferFirst(candidates, request->preferred_replica(), decision.order);
  absl::Status last;
  for (size_t index : decision.order) {
    Replica::SubmitOptions options;
    options.fetch_source = FetchSource(candidates, index, matchable);
    last = candidates[index]->Submit(request, options);
    if (last.ok() || last.code() == absl::StatusCode::kInvalidArgument) return last;
  }
  return last;
}

absl::Status Cluster::CheckBatchFits(int64_t parts, std::string_view what) const {
  // Every registered replica, healthy or not: one restarting or draining makes a batch
  // wait (429, retried), not a 400 the client would not retry.
  int64_t room = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, replica] : replicas_) room += replica->max_waiting();
  }
  if (room == 0 || parts <= room) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the request's %d %s exceed the %d requests the server queues at once (--max-waiting over "
      "its replicas); send them in smaller batches",
      parts, std::string(what), room));
}

void Cluster::PreferFirst(absl::Span<Replica* const> candidates, const std::string& replica_id,
                          std::vector<size_t>& order) {
  if (replica_id.empty()) return;
  auto it = std::find_if(order.begin(), order.end(), [&](size_t index) {
    return candidates[index]->replica_id() == replica_id;
  });
  if (it != order.end()) std::rotate(order.begin(), it, it + 1);
}

absl::StatusOr<Cluster::Placement> Cluster::Pick(absl::Span<const int32_t> prompt_ids,
                                                 std::string_view cache_salt) {
  if (draining_.load()) {
    return absl::UnavailableError("the coordinator is shutting down (draining)");
  }
  std::vector<Replica*> candidates = Candidates();
  if (candidates.empty()) return absl::UnavailableError("no replica is available to serve");
  SplitPrefill(candidates);  // a prompt starts on a serving replica; prefill ones assist
  const int64_t room = options_.replica.max_num_seqs + options_.replica.max_waiting;
  std::erase_if(candidates, [room](Replica* replica) { return replica->load() >= room; });
  if (candidates.empty()) {
    return absl::ResourceExhaustedError("every replica's waiting queue is full");
  }
  const int32_t block_size = std::max(candidates.front()->block_size(), 1);
  const std::vector<engine::BlockHash> hashes = engine::HashFullBlocks(
      engine::PrefixHashSeed(model_fingerprint_, cache_salt), prompt_ids, block_size);
  const RouteDecision decision =
      Rank(candidates, static_cast<int64_t>(prompt_ids.size()), hashes, block_size);
  const size_t best = decision.order.front();
  return Placement{candidates[best]->replica_id(),
                   best < decision.cached_tokens.size() ? decision.cached_tokens[best] : 0};
}

std::vector<Replica*> Cluster::Candidates(const Replica* excluded) const {
  std::vector<Replica*> candidates;
  absl::MutexLock lock(&mu_);
  for (auto& [id, replica] : replicas_) {
    if (replica->healthy() && !draining_replicas_.contains(id) && replica.get() != excluded) {
      candidates.push_back(replica.get());
    }
  }
  return candidates;
}

RouteDecision Cluster::Rank(absl::Span<Replica* const> candidates, int64_t prompt_tokens,
                            absl::Span<const engine::BlockHash> hashes, int32_t block_size) {
  std::vector<RouteCandidate> route_candidates;
  route_candidates.reserve(candidates.size());
  for (Replica* replica : candidates) {
    route_candidates.push_back({replica->replica_id(), replica->load_tokens()});
  }
  return router_.Route(hashes, prompt_tokens, block_size, route_candidates);
}

Replica* Cluster::FetchSource(absl::Span<Replica* const> candidates, size_t chosen,
                              absl::Span<const engine::BlockHash> hashes) const {
  if (options_.kv_fetch_min_blocks <= 0 || hashes.empty()) return nullptr;
  // The index, whatever the routing policy: which replica holds the most of the prefix.
  std::vector<std::string> ids;
  for (Replica* replica : candidates) ids.push_back(replica->replica_id());
  const std::vector<int64_t> held = kv_index_.MatchPrefix(hashes, ids);
  size_t best = chosen;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (held[i] > held[best]) best = i;
  }
  if (best == chosen || held[best] - held[chosen] < options_.kv_fetch_min_blocks) return nullptr;
  // Pool to pool (one machine, the same layout and heads), else through both host tiers.
  if (!candidates[chosen]->ReadsPoolOf(*candidates[best]) &&
      (candidates[chosen]->host_tier_blocks() == 0 || candidates[best]->host_tier_blocks() == 0 ||
       candidates[best]->kv_layout() != candidates[chosen]->kv_layout())) {
    return nullptr;
  }
  {
    absl::MutexLock lock(&mu_);
    auto a = kv_dtypes_.find(candidates[chosen]->replica_id());
    auto b = kv_dtypes_.find(candidates[best]->replica_id());
    if (a == kv_dtypes_.end() || b == kv_dtypes_.end() || a->second != b->second) return nullptr;
  }
  return candidates[best];
}

void Cluster::Retry(std::shared_ptr<engine::Request> request) {
  absl::Status placed = Submit(request);
  if (!placed.ok()) {
    // Nothing was generated for it: a client may retry (on the coordinator that leads now).
    request->Finish(loom::v1::FINISH_REASON_ERROR,
                    absl::StrFormat("its replica failed and it could not be placed again: %s",
                                    placed.message()),
                    "", /*retryable=*/placed.code() == absl::StatusCode::kUnavailable);
  }
}

absl::StatusOr<int64_t> Cluster::DrainReplica(const std::string& worker_id,
                                              absl::Duration timeout) {
  const size_t slash = worker_id.rfind('/');
  const std::string replica_id =
      slash == std::string::npos ? std::string() : worker_id.substr(0, slash);
  const Replica* replica = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = replicas_.find(replica_id);
    if (it == replicas_.end()) {
      return absl::NotFoundError(absl::StrFormat("unknown worker id '%s'", worker_id));
    }
    // Set before the first wait: Submit reads it under mu_, so nothing is placed after.
    if (draining_replicas_.insert(replica_id).second) {
      std::fprintf(stderr, "loom: draining replica %s (worker %s is shutting down)\n",
                   replica_id.c_str(), worker_id.c_str());
    }
    replica = it->second.get();  // replicas are never removed
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (replica->load() > 0 && absl::Now() < deadline) {
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(20))) break;
  }
  const int64_t left = replica->load();
  std::fprintf(stderr, "loom: replica %s %s\n", replica_id.c_str(),
               left == 0 ? "drained" : absl::StrFormat("still holds %d requests", left).c_str());
  return left;
}

bool Cluster::WaitIdle(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int64_t load = 0;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, replica] : replicas_) load += replica->load();
    }
    if (load == 0) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

int Cluster::num_healthy() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(replicas_.begin(), replicas_.end(),
                                        [](const auto& r) { return r.second->healthy(); }));
}

loom::v1::ClusterState Cluster::Status() const {
  loom::v1::ClusterState status;
  status.set_draining(draining_.load());
  absl::MutexLock lock(&mu_);
  for (const auto& [id, replica] : replicas_) {
    loom::v1::ReplicaStatus* added = status.add_replicas();
    *added = replica->Status();
    added->set_draining(draining_replicas_.contains(id));
    added->set_block_size(replica->block_size());
    if (auto dtype = kv_dtypes_.find(id); dtype != kv_dtypes_.end()) {
      added->set_kv_dtype(dtype->second);
    }
    if (added->healthy()) status.set_num_healthy_replicas(status.num_healthy_replicas() + 1);
    status.set_num_waiting(status.num_waiting() + added->num_waiting());
    status.set_num_running(status.num_running() + added->num_running());
  }
  return status;
}

void Cluster::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  draining_.store(true);
  if (monitor_.joinable()) monitor_.join();
  // Replicas are never removed, so iterating without the lock is safe once stopping_ is
  // set (Register refuses); Stop() joins each loop outside the lock.
  std::vector<Replica*> replicas;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, replica] : replicas_) replicas.push_back(replica.get());
  }
  for (Replica* replica : replicas) replica->Stop();
}

void Cluster::Monitor() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(100))) return;
      for (auto& [id, replica] : replicas_) replica->CheckHeartbeat(options_.heartbeat_timeout);
    }
  }
}

}  // namespace loom::coordinator
