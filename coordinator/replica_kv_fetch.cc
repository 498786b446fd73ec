// Replica: cross-replica prefix fetch. When the cluster places a request on this replica
// while another one (the source) holds more of its prefix, this replica asks the source to
// hold that prefix in its host tier (ExportPrefix: blocks only in its pool are copied out by
// its next plan), reserves host-tier slots of its own, and has each of its ranks pull the
// blocks from the same rank of the source (Worker.FetchKvBlocks, worker/kv_transfer). Once
// they arrived they are host-tier content here (CommitImport) and the request is admitted:
// its prefix is reloaded like any host-tier hit. Any failure (the source gone, a timeout, a
// transfer error) admits the request as it is, to recompute; nothing stays held.
#include <algorithm>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/cluster_secret.h"
#include "coordinator/replica.h"
#include "engine/sequence.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/worker.grpc.pb.h"

namespace loom::coordinator {
namespace {

// The source ranks destination rank `rank` reads: the same rank when both replicas hold
// the same slices, else the fewest ranks covering its KV heads (tensor-parallel sizes
// differ). Empty when no set of them covers the heads.
std::vector<size_t> SourceRanks(const std::vector<KvHeadRange>& dest,
                                const std::vector<KvHeadRange>& source, size_t rank) {
  const bool same = dest.size() == source.size() &&
                    (dest[rank].count == 0 || (source[rank].begin == dest[rank].begin &&
                                               source[rank].count == dest[rank].count));
  if (same) return {rank};
  std::vector<size_t> ranks;
  if (dest[rank].count == 0) return ranks;
  const int32_t end = dest[rank].begin + dest[rank].count;
  for (int32_t head = dest[rank].begin; head < end;) {
    std::optional<size_t> best;
    for (size_t r = 0; r < source.size(); ++r) {
      const KvHeadRange& range = source[r];
      if (range.count > 0 && range.begin <= head && head < range.begin + range.count &&
          (!best || range.begin + range.count > source[*best].begin + source[*best].count)) {
        best = r;
      }
    }
    if (!best) return {};
    ranks.push_back(*best);
    head = source[*best].begin + source[*best].count;
  }
  return ranks;
}

// Channels to workers, kept for the next transfers (a new one costs a connection, several
// ms of a hand-off). One that failed to reach its worker is forgotten: a worker restarted
// at the same address is then reached at once, not after gRPC's backoff.
struct WorkerChannels {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> by_address ABSL_GUARDED_BY(mu);

  static WorkerChannels& Get() {
    static WorkerChannels* const channels = new WorkerChannels();
    return *channels;
  }
  std::shared_ptr<grpc::Channel> For(const std::string& address) {
    absl::MutexLock lock(&mu);
    std::shared_ptr<grpc::Channel>& channel = by_address[address];
    if (channel == nullptr) {
      channel = common::CreateClusterChannel(address);
    }
    return channel;
  }
  void Forget(const std::string& address) {
    absl::MutexLock lock(&mu);
    by_address.erase(address);
  }
};

}  // namespace

void Replica::FetchCalls::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* context : contexts_) context->TryCancel();
}

bool Replica::FetchCalls::Add(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  contexts_.push_back(context);
  return true;
}

void Replica::FetchCalls::Remove(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  std::erase(contexts_, context);
}

namespace {

// Where a pool-to-pool transfer writes: blocks of the destination's pools, once the
// destination ran `step_id` (0: none to wait for), under its step stream `stream_id`.
struct PoolDestination {
  bool pool = false;  // else the destination's host-tier slots
  uint64_t step_id = 0;
  uint64_t stream_id = 0;
};

// Each rank of the destination pulls its KV heads from the source ranks holding them:
// `dest` are host-tier slots, or pool blocks (`pool.pool`).
absl::Status FetchOnEveryRank(const std::vector<std::string>& destinations,
                              const std::vector<KvHeadRange>& dest_heads,
                              const Replica::ExportReply& reply, const std::vector<int32_t>& dest,
                              const PoolDestination& pool, uint64_t hold_id, absl::Duration timeout,
                              Replica::FetchCalls& calls) {
  std::vector<loom::v1::FetchKvBlocksRequest> requests(destinations.size());
  for (size_t r = 0; r < destinations.size(); ++r) {
    const std::vector<size_t> sources = SourceRanks(dest_heads, reply.kv_heads, r);
    if (sources.empty()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("no rank of the source holds the KV heads of rank %d", r));
    }
    loom::v1::FetchKvBlocksRequest& request = requests[r];
    const std::vector<int32_t>& from = pool.pool ? reply.pool_blocks : reply.slots;
    for (size_t s : sources) {
      loom::v1::KvBlockSource* source = request.add_sources();
      source->set_address(reply.addresses[s]);
      (pool.pool ? source->mutable_pool_blocks() : source->mutable_slots())
          ->Add(from.begin(), from.begin() + static_cast<ptrdiff_t>(dest.size()));
      source->set_kv_head_begin(reply.kv_heads[s].begin);
      source->set_num_kv_heads(reply.kv_heads[s].count);
      if (pool.pool) source->set_stream_id(reply.stream_id);
    }
    if (pool.pool) {
      request.mutable_dest_blocks()->Add(dest.begin(), dest.end());
      request.set_dest_step_id(pool.step_id);
      request.set_dest_stream_id(pool.stream_id);
    } else {
      request.mutable_dest_slots()->Add(dest.begin(), dest.end());
    }
    request.set_after_step_id(reply.after_step_id);
    request.set_hold_id(hold_id);
    request.set_timeout_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(timeout)));
  }
  std::vector<std::future<absl::Status>> ranks;
  for (size_t r = 0; r < destinations.size(); ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r]() -> absl::Status {
      auto stub = loom::v1::Worker::NewStub(WorkerChannels::Get().For(destinations[r]));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           absl::ToChronoMilliseconds(timeout + absl::Seconds(5)));
      if (!calls.Add(&context)) return absl::CancelledError("the fetch was cancelled");
      loom::v1::FetchKvBlocksResponse response;
      const grpc::Status status = stub->FetchKvBlocks(&context, requests[r], &response);
      calls.Remove(&context);
      if (status.ok()) return absl::OkStatus();
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        WorkerChannels::Get().Forget(destinations[r]);
      }
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrFormat("rank %d: %s", r, status.error_message()));
    }));
  }
  absl::Status result;
  for (std::future<absl::Status>& rank : ranks) {
    const absl::Status status = rank.get();
    if (result.ok()) result = status;
  }
  return result;
}

}  // namespace

std::string Replica::kv_layout() const {
  absl::MutexLock lock(&mu_);
  return kv_layout_;
}

bool Replica::ReadsPoolOf(const Replica& source) const {
  if (&source == this) return false;
  std::string scope, layout;
  std::vector<KvHeadRange> heads;
  {
    absl::MutexLock lock(&source.mu_);
    scope = source.pool_scope_;
    layout = source.kv_layout_;
    heads = source.endpoint_.kv_heads;
  }
  absl::MutexLock lock(&mu_);
  if (scope.empty() || scope != pool_scope_ || layout != kv_layout_) return false;
  if (const auto refused = pools_refused_until_.find(source.replica_id());
      refused != pools_refused_until_.end() && absl::Now() < refused->second) {
    return false;
  }
  // Every rank here reads its KV heads from the source ranks holding them: the same rank, or
  // (other tensor-parallel sizes: the layout then says every rank's heads are known) several.
  for (size_t r = 0; r < endpoint_.kv_heads.size(); ++r) {
    if (SourceRanks(endpoint_.kv_heads, heads, r).empty()) return false;
  }
  return !endpoint_.kv_heads.empty();
}

void Replica::AskExport(Replica* requester, uint64_t fetch_id,
                        std::shared_ptr<engine::Request> request) {
  absl::MutexLock lock(&mu_);
  export_asks_.push_back({requester, fetch_id, std::move(request)});
  wake_ = true;
}

void Replica::DeliverExport(ExportReply reply) {
  absl::MutexLock lock(&mu_);
  export_replies_.push_back(std::move(reply));
  wake_ = true;
}

void Replica::ReleaseExport(uint64_t export_id) {
  absl::MutexLock lock(&mu_);
  export_releases_.push_back(export_id);
  wake_ = true;
}

bool Replica::FetchPays(const engine::Request& request, const Replica& source) const {
  const engine::Scheduler& scheduler = engine_->scheduler();
  if (scheduler.host_tier() == nullptr && !ReadsPoolOf(source)) return false;
  // The fetches so far, per block they brought (0 before the first: fetch), against the
  // step cost model's time to recompute the prompt's blocks.
  const double seconds_per_block =
      num_kv_fetched_blocks_ > 0 ? kv_fetch_seconds_ / static_cast<double>(num_kv_fetched_blocks_)
                                 : 0.0;
  const int32_t block_size = std::max(block_size_.load(), 1);
  const int64_t blocks =
      (static_cast<int64_t>(request.params().prompt_ids.size()) - 1) / block_size;
  return engine::TransferPays(seconds_per_block, blocks, block_size,
                              scheduler.speculation_policy().cost_model());
}

uint64_t Replica::StartFetch(std::shared_ptr<engine::Request> request, Replica* source,
                             bool handed_off, bool ask) {
  const uint64_t fetch_id = next_fetch_id_++;
  PendingFetch& pending = pending_fetches_[fetch_id];
  pending.request = request;
  pending.source = source;
  pending.handed_off = handed_off;
  pending.started = absl::Now();
  pending.deadline = pending.started + options_.kv_transfer_timeout;
  if (ask) source->AskExport(this, fetch_id, std::move(request));
  return fetch_id;
}

bool Replica::PullsHandOffsFromPool(const Replica& prefill) const {
  bool device_pools = false;
  {
    absl::MutexLock lock(&mu_);
    device_pools = endpoint_.backend == "cuda";
  }
  return (device_pools || !options_.kv_push) && ReadsPoolOf(prefill);
}

KvExport Replica::Export(const engine::Request& request, uint64_t fetch_id, const Replica* reader) {
  engine::Scheduler& scheduler = engine_->scheduler();
  KvExport reply;
  reply.fetch_id = fetch_id;
  reply.source = this;
  const std::vector<engine::BlockHash>& hashes = request.prompt_block_hashes();
  // The requester computes at least the last known token (a hand-off's first output
  // follows its prompt: every full prompt block is usable).
  const int64_t known =
      static_cast<int64_t>(request.params().prompt_ids.size()) + request.num_outputs();
  const size_t usable = std::min(
      hashes.size(),
      static_cast<size_t>(std::max<int64_t>(0, (known - 1) / std::max(block_size_.load(), 1))));
  auto where = [&] {
    absl::MutexLock lock(&mu_);
    reply.addresses = endpoint_.addresses;
    reply.kv_heads = endpoint_.kv_heads;
    reply.kv_layout = kv_layout_;
  };
  // The reader copies straight out of this replica's pools: the blocks are only held.
  if (reader != nullptr && reader->ReadsPoolOf(*this)) {
    std::vector<int32_t> blocks =
        scheduler.HoldPoolPrefix(absl::MakeConstSpan(hashes).first(usable),
                                 request.params().prompt_ids, request.params().cache_salt);
    if (!blocks.empty()) {
      reply.export_id = next_export_id_++;
      where();
      reply.pool_blocks = blocks;
      reply.stream_id = connection_ != nullptr ? connection_->stream_id() : 0;
      reply.after_step_id = next_step_id_ - 1;  // the plans that computed them were sent
      pool_exports_[reply.export_id] = std::move(blocks);
      return reply;
    }
  }
  engine::Scheduler::HeldSlots held =
      scheduler.ExportPrefix(absl::MakeConstSpan(hashes).first(usable), request.params().prompt_ids,
                             request.params().cache_salt);
  if (held.slots.empty()) {
    reply.reason = "the source holds none of the prefix any more";
    return reply;
  }
  reply.export_id = next_export_id_++;
  where();
  reply.slots = held.slots;
  // The plan that carries the copies is the next one; else what is queued already ran or
  // runs in the plans sent so far.
  reply.after_step_id = scheduler.host_tier()->has_copies() ? next_step_id_ : next_step_id_ - 1;
  exports_[reply.export_id] = std::move(held);
  return reply;
}

void Replica::AdmitOne(const std::shared_ptr<engine::Request>& request, Replica* hand_off_to) {
  // A hand-off this (decode) replica reserved blocks for: the scheduler holds them for it.
  const int64_t held = ReleaseReservation(request->seq_id());
  absl::Status added;
  if (request->cancelled()) {
    request->Finish(loom::v1::FINISH_REASON_ABORT, "cancelled", replica_id_);
    added = absl::CancelledError();
  } else {
    added =
        engine_->Admit(request, /*score_prompt_from=*/0, /*prefill_only=*/hand_off_to != nullptr);
    if (!added.ok()) {
      request->Finish(loom::v1::FINISH_REASON_ERROR, std::string(added.message()), replica_id_);
    }
  }
  if (!added.ok()) {
    Unload(*request);
    // Its decode replica's hold ends with it.
    if (hand_off_to != nullptr) hand_off_to->ReleaseReservation(request->seq_id());
    return;
  }
  if (held > 0) engine_->scheduler().HoldBlocksFor(request->seq_id(), held);
  if (hand_off_to != nullptr) hand_off_targets_[request->seq_id()] = hand_off_to;
}

void Replica::EndFetch(uint64_t fetch_id, const absl::Status& status) {
  auto it = pending_fetches_.find(fetch_id);
  if (it == pending_fetches_.end()) return;
  PendingFetch pending = std::move(it->second);
  pending_fetches_.erase(it);
  engine::Scheduler& scheduler = engine_->scheduler();
  const engine::Request& request = *pending.request;
  int64_t stored = 0;
  const bool pool = !pending.pool_import.empty();
  if (status.ok()) {
    const std::vector<engine::BlockHash>& hashes = request.prompt_block_hashes();
    const size_t count =
        std::min(pool ? pending.pool_import.size() : pending.import.slots.size(), hashes.size());
    const auto chain = absl::MakeConstSpan(hashes).first(count);
    // Held until the request is admitted into the pool: a burst of imports must not evict
    // what an earlier one brought before its request reloads (or takes) it.
    if (pool) {
      std::vector<int32_t> kept;
      stored = scheduler.CommitPoolImport(pending.pool_import, chain, request.params().prompt_ids,
                                          request.params().cache_salt, &kept);
      if (!kept.empty()) pool_import_holds_[request.seq_id()] = std::move(kept);
      ++num_kv_pool_fetches_;
    } else {
      engine::Scheduler::HeldSlots kept;
      stored = scheduler.CommitImport(pending.import, chain, request.params().prompt_ids,
                                      request.params().cache_salt, &kept);
      if (!kept.slots.empty()) import_holds_[request.seq_id()] = std::move(kept);
    }
    ++num_kv_fetches_;
    num_kv_fetched_blocks_ += static_cast<uint64_t>(stored);
    kv_fetch_seconds_ += absl::ToDoubleSeconds(absl::Now() - pending.started);
    if (pending.handed_off && stored > 0) {
      ++num_handoffs_measured_;
      handoff_seconds_ += absl::ToDoubleSeconds(absl::Now() - pending.started);
    }
    if (pending.handed_off && stored == 0 && count > 0 && !pool) {
      ++num_handoff_failures_;
      std::fprintf(stderr,
                   "loom: replica %s: the KV hand-off from prefill replica %s arrived after this "
                   "replica's host tier was reset, recomputing the prompt here\n",
                   replica_id_.c_str(), pending.source->replica_id().c_str());
    }
  } else {
    // A pull that ended here may still write on a worker (the call gave up: cancelled,
    // past its deadline, the worker unreachable): its hold closes there before any plan
    // reuses the slots (or blocks).
    if (pool) {
      if (pending.fetching) {
        scheduler.ReleaseClosedPoolImport(pending.pool_import, pending.hold_id);
      } else {
        scheduler.ReleasePoolBlocks(pending.pool_import);
      }
    } else if (pending.fetching) {
      scheduler.ReleaseClosedImport(pending.import, pending.hold_id);
    } else {
      scheduler.ReleaseSlots(pending.import, /*import=*/true);
    }
  }
  // The source's pools could not be opened or read here: take the host tiers (or pushes) from
  // it for a while rather than fail, and recompute, every transfer.
  if (pool && status.code() == absl::StatusCode::kFailedPrecondition) {
    std::fprintf(stderr,
                 "loom: replica %s: reading replica %s's KV pool failed (%s): its KV goes through "
                 "the host tiers for the next %d s\n",
                 replica_id_.c_str(), pending.source->replica_id().c_str(),
                 std::string(status.message()).c_str(),
                 static_cast<int>(absl::ToInt64Seconds(kPoolReadRetry)));
    absl::MutexLock lock(&mu_);
    pools_refused_until_[pending.source->replica_id()] = absl::Now() + kPoolReadRetry;
  }
  if (!status.ok() && !request.cancelled()) {  // a cancelled one: AdmitOne ends it as aborted
    ++num_kv_fetch_failures_;
    if (pending.handed_off) ++num_handoff_failures_;
    std::fprintf(stderr,
                 pending.handed_off
                     ? "loom: replica %s: the KV hand-off from prefill replica %s failed, "
                       "recomputing the prompt here: %s\n"
                     : "loom: replica %s: fetching a prefix from replica %s failed, recomputing "
                       "it: %s\n",
                 replica_id_.c_str(), pending.source->replica_id().c_str(),
                 std::string(status.message()).c_str());
  }
  if (pending.handed_off) {
    ++num_handoffs_in_;
    pending.request->MarkHandoffDone();
  }
  if (pending.export_id != 0) pending.source->ReleaseExport(pending.export_id);
  AdmitOne(pending.request);
}

void Replica::HandleKvFetches() {
  std::deque<ExportAsk> asks;
  std::deque<ExportReply> replies;
  std::deque<FetchResult> results;
  std::vector<uint64_t> releases;
  std::vector<std::string> addresses;
  std::vector<KvHeadRange> kv_heads;
  std::string kv_layout;
  {
    absl::MutexLock lock(&mu_);
    asks.swap(export_asks_);
    results.swap(fetch_results_);
    releases.swap(export_releases_);
    addresses = endpoint_.addresses;
    kv_heads = endpoint_.kv_heads;
    kv_layout = kv_layout_;
  }
  engine::Scheduler& scheduler = engine_->scheduler();
  for (uint64_t export_id : releases) {
    if (auto held = pool_exports_.find(export_id); held != pool_exports_.end()) {
      scheduler.ReleasePoolBlocks(held->second);
      pool_exports_.erase(held);
      continue;
    }
    auto it = exports_.find(export_id);
    if (it == exports_.end()) {
      ReleaseCarriedExport(export_id);  // exported for the worker before this one
      continue;
    }
    scheduler.ReleaseSlots(it->second, /*import=*/false);
    exports_.erase(it);
  }
  // The source side: hold the prefix; blocks only in the pool go out with the next plan.
  for (ExportAsk& ask : asks) {
    ask.requester->DeliverExport(Export(*ask.request, ask.fetch_id, ask.requester));
  }
  {
    absl::MutexLock lock(&mu_);
    replies.swap(export_replies_);
  }
  // The destination side: reserve slots and let the workers pull the blocks. A slot taken
  // from the tier's LRU may still be the target of an offload or the source of a reload in
  // a plan not yet run (or queued for the next one): written by the fetch before that copy
  // ran, its bytes would be overwritten or read as the old block's (wrong tokens under a
  // small tier). Free and never-used slots are in none.
  auto reserve = [&](PendingFetch& pending, KvExport& reply) {
    if (!reply.pool_blocks.empty()) {
      // Blocks no sequence holds: the workers copy into them once the plans sent so far
      // (which may still write them, freed by sequences that ended) ran (dest_step_id).
      pending.pool_import =
          scheduler.ReservePoolImport(static_cast<int64_t>(reply.pool_blocks.size()));
      if (pending.pool_import.empty()) return false;
      pending.num_blocks = static_cast<int64_t>(pending.pool_import.size());
    } else {
      pending.import = scheduler.ReserveImport(static_cast<int64_t>(reply.slots.size()));
      if (pending.import.slots.empty()) return false;
      pending.num_blocks = static_cast<int64_t>(pending.import.slots.size());
    }
    pending.hold_id = next_hold_id_++;
    pending.reserved_reply = std::move(reply);
    return true;
  };
  for (ExportReply& reply : replies) {
    auto it = pending_fetches_.find(reply.fetch_id);
    if (it == pending_fetches_.end() || it->second.fetching ||
        it->second.reserved_reply.has_value() || it->second.awaiting_slots.has_value()) {
      // Given up on already (admitted to recompute): let the source go.
      if (reply.export_id != 0 && reply.source != nullptr)
        reply.source->ReleaseExport(reply.export_id);
      continue;
    }
    PendingFetch& pending = it->second;
    pending.export_id = reply.export_id;
    if (!reply.reason.empty() || reply.kv_layout != kv_layout) {
      EndFetch(reply.fetch_id,
               absl::FailedPreconditionError(
                   reply.reason.empty()
                       ? absl::StrFormat("the replicas' KV layouts differ (%s here, %s there)",
                                         kv_layout, reply.kv_layout)
                       : reply.reason));
      continue;
    }
    if (!reply.pool_blocks.empty() && (reply.source == nullptr || !ReadsPoolOf(*reply.source))) {
      EndFetch(reply.fetch_id, absl::FailedPreconditionError(
                                   "the source's pool cannot be read from this replica's workers"));
      continue;
    }
    if (reply.pool_blocks.empty() && scheduler.host_tier() == nullptr) {
      EndFetch(reply.fetch_id, absl::FailedPreconditionError("this replica has no host tier"));
      continue;
    }
    // Every slot held: wait for one to free (a burst of hand-offs outruns the reloads).
    if (!reserve(pending, reply)) pending.awaiting_slots = std::move(reply);
  }
  for (auto& [fetch_id, pending] : pending_fetches_) {
    if (pending.awaiting_slots.has_value() && reserve(pending, *pending.awaiting_slots)) {
      pending.awaiting_slots.reset();
    }
  }
  // Pulls whose slots no earlier plan touches any more: the workers write them now.
  for (auto& [fetch_id, pending] : pending_fetches_) {
    if (pending.reserved_reply.has_value() && CopiesRan(pending.import.last_copy_plan)) {
      StartPull(fetch_id, pending, addresses, kv_heads);
    }
  }
  for (const FetchResult& result : results) EndFetch(result.fetch_id, result.status);
  // Fetches past their deadline admit their requests to recompute. One still pulling keeps
  // its slots reserved until its result comes back (bounded by the transfer's deadline).
  const absl::Time now = absl::Now();
  std::vector<std::pair<uint64_t, bool>> late;  // (fetch, waiting for slots)
  for (const auto& [fetch_id, pending] : pending_fetches_) {
    // A client that went away does not wait for the source either; a pull under way is
    // cancelled (its result, CANCELLED, frees the slots).
    if (pending.fetching && pending.request->cancelled()) pending.calls->Cancel();
    if (!pending.fetching && (now > pending.deadline || pending.request->cancelled())) {
      late.emplace_back(fetch_id, pending.awaiting_slots.has_value());
    }
  }
  for (const auto& [fetch_id, awaiting_slots] : late) {
    EndFetch(fetch_id,
             absl::DeadlineExceededError(awaiting_slots ? "no host-tier slot came free in time"
                                                        : "the source did not answer in time"));
  }
  // Requests admitted here (their fetches ended) count in the scheduler's queue now; pool
  // blocks held for readers are free again.
  if (!replies.empty() || !results.empty() || !late.empty() || !releases.empty()) PublishStats();
}

void Replica::StartPull(uint64_t fetch_id, PendingFetch& pending,
                        const std::vector<std::string>& addresses,
                        const std::vector<KvHeadRange>& kv_heads) {
  pending.fetching = true;
  const bool pool = !pending.pool_import.empty();
  const std::vector<int32_t> dest = pool ? pending.pool_import : pending.import.slots;
  PoolDestination pool_dest;
  if (pool) {
    pool_dest.pool = true;
    pool_dest.step_id = next_step_id_ > stream_first_step_id_ ? next_step_id_ - 1 : 0;
    pool_dest.stream_id = connection_ != nullptr ? connection_->stream_id() : 0;
  }
  {
    absl::MutexLock lock(&mu_);
    ++fetch_threads_;
  }
  // Bounded by the transfer's deadline; Stop waits for it.
  std::thread([this, fetch_id, addresses, kv_heads, reply = *std::move(pending.reserved_reply),
               dest, pool_dest, hold_id = pending.hold_id, calls = pending.calls] {
    const absl::Status status = FetchOnEveryRank(addresses, kv_heads, reply, dest, pool_dest,
                                                 hold_id, options_.kv_transfer_timeout, *calls);
    absl::MutexLock lock(&mu_);
    fetch_results_.push_back({fetch_id, status});
    --fetch_threads_;
    wake_ = true;
  }).detach();
  pending.reserved_reply.reset();
}

void Replica::ReleaseImportHolds() {
  engine::Scheduler& scheduler = engine_->scheduler();
  // Once its request was admitted (it holds the blocks itself then) or ended.
  const auto waiting = [&scheduler](const auto& hold) {
    const engine::Sequence* seq = scheduler.Find(hold.first);
    return seq != nullptr && seq->status == engine::SequenceStatus::kWaiting;
  };
  absl::erase_if(import_holds_, [&](const auto& hold) {
    if (waiting(hold)) return false;
    scheduler.ReleaseSlots(hold.second, /*import=*/false);
    return true;
  });
  absl::erase_if(pool_import_holds_, [&](const auto& hold) {
    if (waiting(hold)) return false;
    scheduler.ReleasePoolBlocks(hold.second);
    return true;
  });
}

std::vector<std::shared_ptr<engine::Request>> Replica::AbandonFetches() {
  // The engine is gone with the worker: the requests waiting for a prefix go elsewhere,
  // and the sources may let their slots go.
  std::vector<std::shared_ptr<engine::Request>> requests;
  for (auto& [fetch_id, pending] : pending_fetches_) {
    pending.calls->Cancel();
    if (pending.export_id != 0) pending.source->ReleaseExport(pending.export_id);
    requests.push_back(std::move(pending.request));
  }
  pending_fetches_.clear();
  exports_.clear();
  import_holds_.clear();
  pool_exports_.clear();  // their blocks went with the engine
  pool_import_holds_.clear();
  return requests;
}

}  // namespace loom::coordinator
