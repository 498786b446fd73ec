// Cluster: disaggregated prefill and decode. A request whose prompt would stall the
// decodes of the replica chosen for it is prefilled on a prefill replica instead, which
// computes the prompt and the first token (streamed to the client at once) and then hands
// the request to that decode replica, which holds room for it from placement on (its
// reservation: other admissions leave those KV blocks free). The decode replica fetches the
// prompt's KV from the prefill replica's host tier through the KV transfer between workers
// (replica_kv_fetch.cc, worker/kv_transfer) and decodes the rest; a transfer that fails
// or times out recomputes the prompt there. The same request object moves between the
// replicas' loops, so its client stream, stop checks and timeline continue.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "coordinator/cluster.h"

namespace loom::coordinator {

std::vector<Replica*> Cluster::SplitPrefill(std::vector<Replica*>& candidates) {
  std::vector<Replica*> prefill;
  std::vector<Replica*> serving;
  for (Replica* replica : candidates) {
    (replica->role() == ReplicaRole::kPrefill ? prefill : serving).push_back(replica);
  }
  // Prefill replicas alone serve everything, as mixed ones.
  if (serving.empty()) return {};
  candidates = std::move(serving);
  return prefill;
}

std::optional<absl::Status> Cluster::PlaceDisaggregated(
    const std::shared_ptr<engine::Request>& request, absl::Span<Replica* const> serving,
    absl::Span<Replica* const> prefill, absl::Span<const engine::BlockHash> hashes,
    int32_t block_size) {
  const engine::RequestParams& params = request->params();
  // Embeddings and prompt scores come from the prompt's pass itself; a request that already
  // streamed output (placed again after a failure) continues where it is placed.
  if (params.embed || params.prompt_logprobs >= 0 || request->produced_output()) {
    return std::nullopt;
  }
  // The decode replica first: where the request would run if it stayed, by the router.
  const RouteDecision decode = Rank(serving, PromptTokens(*request), hashes, block_size);
  Replica* target = serving[decode.order.front()];
  const int64_t prompt = static_cast<int64_t>(params.prompt_ids.size());
  const int64_t cached = std::min(
      kv_index_.MatchPrefix(hashes, {target->replica_id()}).front() * block_size, prompt - 1);
  if (prompt - cached <= target->local_prefill_limit()) return std::nullopt;
  // Its blocks are reserved there now (the prompt and its first token), or on the next in
  // the router's order that has them free; when none has, the hand-off waits for room where
  // the router placed it.
  Replica* reserved = nullptr;
  if (params.max_tokens > 1) {
    for (size_t index : decode.order) {
      Replica* candidate = serving[index];
      const int32_t size = std::max(candidate->block_size(), 1);
      if (candidate->ReserveForHandOff(request, (prompt + size) / size).ok()) {
        reserved = target = candidate;
        break;
      }
    }
  }
  const RouteDecision order = Rank(prefill, PromptTokens(*request), hashes, block_size);
  const std::string target_layout = target->kv_layout();
  // Prefilled here, in chunks beside the decodes (each at most doubling their step), the
  // first token would come after this long. A fixed threshold (--max-local-prefill-length)
  // is the operator's: no comparison then. Nor for a prompt longer than one full step
  // (--max-num-batched-tokens): kept here, it would double the decodes' inter-token latency
  // for hundreds of steps on a CPU (a 2k-token prompt: ~200 chunks beside 10 decodes),
  // which a decode replica exists to prevent; it waits for the prefill pool, unless
  // --max-prefill-queue-size passes the pool over (below).
  const bool comparable =
      target->prefill_limit_measured() && prompt - cached <= target->max_num_batched_tokens();
  const double local_seconds = comparable ? target->FirstTokenSeconds(prompt - cached) : 0;
  const double handoff_seconds = target->mean_handoff_seconds();
  int kept_local = 0;
  for (size_t index : order.order) {
    // Its KV could not reach the decode replica (block size, KV dtype or pipeline stages
    // differ): it would be computed twice.
    if (const std::string layout = prefill[index]->kv_layout(); layout != target_layout) {
      absl::MutexLock lock(&mu_);
      if (unmatched_layouts_.insert(prefill[index]->replica_id() + ">" + target->replica_id())
              .second) {
        std::fprintf(stderr,
                     "loom: prefill replica %s (%s) cannot hand KV to decode replica %s (%s): "
                     "long prompts placed on %s are prefilled there (start both pools with "
                     "the same --kv-dtype and block size)\n",
                     prefill[index]->replica_id().c_str(), layout.c_str(),
                     target->replica_id().c_str(), target_layout.c_str(),
                     target->replica_id().c_str());
      }
      continue;
    }
    // A prefill replica whose queue is long would delay the first token more than a local
    // prefill stalls the decodes (Dynamo's conditional disaggregation); and with that limit
    // set, a prompt does not wait there behind more prompt tokens than its own (a short
    // prompt queued behind a long one would wait out the long one's whole prefill).
    if (options_.max_prefill_queue_size > 0 &&
        (prefill[index]->load() >= options_.max_prefill_queue_size ||
         prefill[index]->load_tokens() > prompt - cached)) {
      continue;
    }
    // Sent away, it must not wait longer for its first token than it would here: behind
    // a backlog of long prompts a saturated prefill pool would delay it without bound,
    // while a decode replica with room prefills it in bounded chunks (placement by
    // expected first-token time, as DistServe's and Splitwise's schedulers do). Unmeasured
    // either side: send it.
    const int64_t prefill_cached =
        std::min(kv_index_.MatchPrefix(hashes, {prefill[index]->replica_id()}).front() * block_size,
                 prompt - 1);
    const double remote_seconds = prefill[index]->FirstTokenSeconds(prompt - prefill_cached);
    if (local_seconds > 0 && remote_seconds > 0 &&
        local_seconds <= remote_seconds + handoff_seconds) {
      ++kept_local;
      continue;
    }
    Replica::SubmitOptions options;
    // A request of one token has nothing to decode: the prefill replica answers it.
    if (params.max_tokens > 1) {
      options.hand_off_to = target;
      // Pushed into the decode replica's tier as it is computed, unless that replica's
      // workers copy it straight out of the prefill replica's pools afterwards.
      options.await_push_target = reserved != nullptr && reserved->kv_push_enabled() &&
                                  !reserved->PullsHandOffsFromPool(*prefill[index]);
    }
    // Read first: a worker lost right after the submission makes the answer stale.
    const uint64_t prefill_epoch = prefill[index]->connection_epoch();
    const absl::Status placed = prefill[index]->Submit(request, options);
    if (placed.ok()) {
      // Slots for the prefill workers to push the prompt's KV into as they compute it.
      if (options.await_push_target) {
        reserved->AskPushTarget(request, prefill[index], prefill_epoch);
      }
      return placed;
    }
    if (placed.code() == absl::StatusCode::kInvalidArgument) break;
  }
  // Every prefill replica is full, gone or slower: run it locally.
  if (reserved != nullptr) reserved->ReleaseReservation(request->seq_id());
  if (kept_local > 0) target->CountKeptLocal();
  return std::nullopt;
}

void Cluster::HandOff(std::shared_ptr<engine::Request> request, Replica* source, Replica* target,
                      KvExport exported) {
  Replica::SubmitOptions options;
  options.fetch_source = source;
  options.handed_off = true;
  options.export_reply = std::move(exported);
  absl::Status placed = absl::UnavailableError("no decode replica was chosen");
  if (target != nullptr) placed = target->Submit(request, options);
  if (placed.ok()) return;
  if (target != nullptr) target->ReleaseReservation(request->seq_id());
  if (options.export_reply->pushed) {
    // Pushed into the refusing replica's tier: another one pulls from the prefill replica
    // (its cache holds the prompt; this runs on its loop).
    target->ReleasePushHold(request->seq_id(), /*hold_id=*/0);  // its current one
    options.export_reply = source->ExportForHandOff(*request);
  } else if (!options.export_reply->pool_blocks.empty()) {
    // Held in the prefill replica's pool for the refusing replica: the others may not read
    // that pool, so the blocks go through its host tier instead.
    source->ReleaseExport(options.export_reply->export_id);
    options.export_reply = source->ExportForHandOff(*request);
  }
  const uint64_t export_id = options.export_reply->export_id;
  // The decode replica chosen at placement is gone, draining or full: the router's best of
  // the others that decode, and last the prefill replica itself (its cache holds the
  // prompt's blocks).
  const std::string first_refusal(placed.message());
  std::vector<Replica*> candidates = Candidates(target);
  std::erase_if(candidates,
                [](Replica* replica) { return replica->role() == ReplicaRole::kPrefill; });
  const int32_t block_size = std::max(request->hashed_block_size(), 1);
  const RouteDecision decision =
      Rank(candidates, PromptTokens(*request), request->prompt_block_hashes(), block_size);
  for (size_t index : decision.order) {
    placed = candidates[index]->Submit(request, options);
    if (placed.ok()) break;
  }
  if (!placed.ok()) {
    request->MarkHandoffDone();  // nothing to transfer
    if (export_id != 0) source->ReleaseExport(export_id);
    placed = source->Submit(request);
  }
  if (!placed.ok()) {
    request->Finish(
        loom::v1::FINISH_REASON_ERROR,
        absl::StrFormat("no replica could take it after its prefill: %s", placed.message()),
        source->replica_id());
    return;
  }
  std::fprintf(stderr,
               "loom: request %s: its decode replica %s refused the hand-off (%s); placed "
               "elsewhere\n",
               request->request_id().c_str(),
               target != nullptr ? target->replica_id().c_str() : "(none)", first_refusal.c_str());
}

}  // namespace loom::coordinator
