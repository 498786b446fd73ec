// Replica: KV pushes in disaggregated serving. At placement the decode replica holds host
// slots for the prompt's blocks, a partial last one included (AskPushTarget) and, once no plan it
// sent before may still copy into or out of them (a slot taken from the tier's LRU may be an
// offload's target or a reload's source in one), names them to the prefill replica
// (DeliverPushTarget). From then on every plan of the prefill replica carries the blocks
// that are whole once it ran (StepPlan.kv_pushes; blocks of earlier chunks in the next
// plan), and its workers write them straight into the decode workers' tiers, each layer as
// the forward pass computes it (worker/kv_push): into the tier's memory where they can map
// it (one machine), else over TCP (worker/kv_push_stream). When the prompt's last plan comes back
// every block has arrived: the hand-off carries no transfer, the decode replica commits the
// slots as host-tier content (the next plan tells its workers: kv_pushed_slots) and admits
// the request, which reloads them (the partial block into its own table: it starts at
// its first output). A push that fails (a worker's error, slots not delivered
// in time, the decode replica gone) falls back to the pull (replica_kv_fetch.cc). Slots go
// back to the decode replica's tier only once no plan of the prefill replica that pushes
// into them is in flight (a request cancelled mid-prompt: EndPush, SettlePushHold): else a
// layer still on its way could land in a slot the tier gave to an offload meanwhile.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "coordinator/replica.h"
#include "engine/sequence.h"

namespace loom::coordinator {
namespace {

// How long a prompt placed on a prefill replica waits for its decode replica to name the
// slots its KV goes to (or to decline) before its first plan. The decode replica answers
// from its loop at once (it wakes mid-step) unless its slots are still in a plan's copies:
// past this the prompt starts anyway, its later chunks are pushed and the rest pulled.
constexpr absl::Duration kPushTargetWait = absl::Milliseconds(20);

}  // namespace

void Replica::AskPushTarget(const std::shared_ptr<engine::Request>& request, Replica* prefill,
                            uint64_t prefill_epoch) {
  absl::MutexLock lock(&mu_);
  push_asks_.push_back({request, prefill, prefill_epoch});
  wake_ = true;
}

void Replica::DeliverPushTarget(KvPushTarget target) {
  absl::MutexLock lock(&mu_);
  push_deliveries_.push_back(std::move(target));
  wake_ = true;
}

void Replica::ReleasePushHold(uint64_t seq_id, uint64_t hold_id, bool writer_lost) {
  absl::MutexLock lock(&mu_);
  push_releases_.push_back({seq_id, hold_id, writer_lost});
  wake_ = true;
}

bool Replica::EndPushHold(uint64_t seq_id) {
  auto hold = push_holds_.find(seq_id);
  if (hold == push_holds_.end()) return false;
  engine::Scheduler& scheduler = engine_->scheduler();
  if (hold->second.delivered && !hold->second.settled) {
    // A write may still come (the prefill worker lost its coordinator; a stream whose
    // writer gave up still delivering): the workers refuse it from the next plan on.
    scheduler.ReleaseClosedImport(hold->second.slots, hold->second.id);
  } else {
    scheduler.ReleaseSlots(hold->second.slots, /*import=*/true);
  }
  push_holds_.erase(hold);
  return true;
}

void Replica::SettlePushHold(uint64_t seq_id, uint64_t hold_id) {
  absl::MutexLock lock(&mu_);
  push_settles_.emplace_back(seq_id, hold_id);
  wake_ = true;
}

void Replica::VoidPushTarget(uint64_t seq_id, uint64_t hold_id) {
  absl::MutexLock lock(&mu_);
  push_voids_.emplace_back(seq_id, hold_id);
  wake_ = true;
}

void Replica::HandleKvPushes() {
  std::vector<PushAsk> asks;
  std::vector<KvPushTarget> deliveries;
  std::vector<PushRelease> releases;
  std::vector<std::pair<uint64_t, uint64_t>> settles;
  std::vector<std::pair<uint64_t, uint64_t>> voids;
  WorkerEndpoint endpoint;
  std::string layout;
  {
    absl::MutexLock lock(&mu_);
    if (push_asks_.empty() && push_deliveries_.empty() && push_releases_.empty() &&
        push_settles_.empty() && push_voids_.empty() && push_holds_.empty() &&
        push_targets_.empty() && carried_slots_.empty()) {
      return;
    }
    asks.swap(push_asks_);
    voids.swap(push_voids_);
    deliveries.swap(push_deliveries_);
    releases.swap(push_releases_);
    settles.swap(push_settles_);
    endpoint = endpoint_;
    layout = kv_layout_;
  }
  engine::Scheduler& scheduler = engine_->scheduler();
  bool slots_changed = !asks.empty();  // the status counts the tier's held slots
  auto release = [&](uint64_t seq_id) { slots_changed |= EndPushHold(seq_id); };
  // Messages about a hold that a later one replaced (the request placed again) are void.
  auto current = [&](uint64_t seq_id, uint64_t hold_id) {
    auto hold = push_holds_.find(seq_id);
    return hold != push_holds_.end() && (hold_id == 0 || hold->second.id == hold_id);
  };
  const absl::Time now = absl::Now();
  for (const auto& [seq_id, hold_id] : settles) {
    if (current(seq_id, hold_id)) {
      push_holds_[seq_id].settled = true;
    } else {
      slots_changed |= ReleaseCarriedPush(hold_id, /*writer_lost=*/false, now);
    }
  }
  auto set_aside = [&](uint64_t seq_id) { SetPushHoldAside(seq_id, now); };
  for (const PushRelease& released : releases) {
    if (!current(released.seq_id, released.hold_id)) {
      slots_changed |= ReleaseCarriedPush(released.hold_id, released.writer_lost, now);
      continue;
    }
    const PushHold& hold = push_holds_[released.seq_id];
    if (released.writer_lost && hold.delivered && !hold.settled) {
      set_aside(released.seq_id);
    } else {
      release(released.seq_id);
    }
  }
  slots_changed |= ReleaseDueCarriedSlots(now);
  // Asks answered without slots: their prompts need not wait for any (AwaitPushTarget).
  std::vector<PushAsk> declined;
  // Decode side: slots for the asks, where the layout is one a push can fill (no pipeline
  // stages). A prefill worker maps a rank's tier where it can (one machine), else writes
  // it over TCP (WriteKvBlocks at the rank's address).
  const bool pushable = options_.kv_push && scheduler.host_tier() != nullptr &&
                        endpoint.pipeline_parallel_size <= 1 && !endpoint.addresses.empty() &&
                        endpoint.host_kv_shared.size() == endpoint.addresses.size();
  for (PushAsk& ask : asks) {
    const std::shared_ptr<engine::Request>& request = ask.request;
    Replica* prefill = ask.prefill;
    // Placed again: a new hold replaces the old (set aside if its writer was lost).
    if (auto old = push_holds_.find(request->seq_id());
        old != push_holds_.end() && old->second.delivered && !old->second.settled &&
        !old->second.prefill->healthy()) {
      set_aside(request->seq_id());
    } else {
      release(request->seq_id());
    }
    // The prompt's blocks, its partial last one too: the hand-off then computes no prompt
    // token here.
    const int64_t block_size = std::max(block_size_.load(), 1);
    const int64_t prompt = static_cast<int64_t>(request->params().prompt_ids.size());
    const int64_t blocks = (prompt + block_size - 1) / block_size;
    if (!pushable || blocks == 0 || request->finished() || prefill->kv_layout() != layout) {
      declined.push_back(std::move(ask));
      continue;
    }
    PushHold hold;
    hold.slots = scheduler.ReserveImport(blocks);
    if (static_cast<int64_t>(hold.slots.slots.size()) < blocks) {
      scheduler.ReleaseSlots(hold.slots, /*import=*/true);
      declined.push_back(std::move(ask));  // the tier is busy: the hand-off pulls
      continue;
    }
    hold.request = request;
    hold.prefill = prefill;
    hold.id = next_hold_id_++;
    hold.prefill_epoch = ask.prefill_epoch;
    push_holds_[request->seq_id()] = std::move(hold);
  }
  // Holds whose slots no plan in flight touches any more go to their prefill replicas;
  // holds whose request is gone end, unless a plan of the prefill replica may still write
  // into their slots: those wait for its release (a slot back in the tier can be the
  // target of this replica's next offload), or end with its worker.
  std::vector<uint64_t> ended;
  std::vector<uint64_t> lost;
  for (auto& [seq_id, hold] : push_holds_) {
    const std::shared_ptr<engine::Request> request = hold.request.lock();
    if (request == nullptr || request->finished()) {
      if (!hold.delivered || hold.settled) {
        ended.push_back(seq_id);
      } else if (!hold.prefill->healthy()) {
        lost.push_back(seq_id);
      }
      continue;
    }
    if (hold.delivered || !CopiesRan(hold.slots.last_copy_plan)) continue;
    hold.delivered = true;
    hold.prefill->DeliverPushTarget(PushTargetOf(seq_id, hold, request, endpoint));
  }
  for (uint64_t seq_id : ended) release(seq_id);
  for (uint64_t seq_id : lost) set_aside(seq_id);
  if (slots_changed) PublishStats();
  for (PushAsk& ask : declined) {
    KvPushTarget answer;  // no slots: a push that failed from the start
    answer.seq_id = ask.request->seq_id();
    answer.request = ask.request;
    answer.decode = this;
    answer.prefill_epoch = ask.prefill_epoch;
    ask.prefill->DeliverPushTarget(std::move(answer));
  }
  TakePushTargets(deliveries);
  // Prefill side: targets in a decode worker's tier that its replica lost.
  for (const auto& [seq_id, hold_id] : voids) {
    auto state = push_targets_.find(seq_id);
    if (state != push_targets_.end() && state->second.target.hold_id == hold_id) EndPush(seq_id);
  }
}

KvPushTarget Replica::PushTargetOf(uint64_t seq_id, const PushHold& hold,
                                   const std::shared_ptr<engine::Request>& request,
                                   const WorkerEndpoint& endpoint) {
  KvPushTarget target;
  target.seq_id = seq_id;
  target.request = request;
  target.decode = this;
  target.slots = hold.slots.slots;
  target.hold_id = hold.id;
  target.prefill_epoch = hold.prefill_epoch;
  for (size_t r = 0; r < endpoint.addresses.size(); ++r) {
    loom::v1::KvPushDest& dest = target.dests.emplace_back();
    if (!endpoint.host_kv_shared[r].boot_id().empty()) {
      *dest.mutable_shared() = endpoint.host_kv_shared[r];
    }
    dest.set_address(endpoint.addresses[r]);
    dest.set_kv_head_begin(endpoint.kv_heads[r].begin);
    dest.set_num_kv_heads(endpoint.kv_heads[r].count);
    dest.set_hold_id(hold.id);
  }
  return target;
}

void Replica::TakePushTargets(std::vector<KvPushTarget>& deliveries) {
  // The targets (a request may still wait in the inbox); those whose request ended or left
  // let their slots go.
  for (KvPushTarget& target : deliveries) {
    auto existing = push_targets_.find(target.seq_id);
    const bool stale = target.prefill_epoch != connection_epoch_.load();
    if (stale || (existing != push_targets_.end() && existing->second.in_flight > 0)) {
      // Asked before this replica lost its worker (the request was placed again since:
      // its new ask is answered on its own), or plans pushing to an earlier target are
      // out (that push goes on): this one goes back.
      if (target.hold_id != 0) target.decode->ReleasePushHold(target.seq_id, target.hold_id);
      continue;
    }
    if (existing != push_targets_.end()) EndPush(target.seq_id);  // replaced: let it go
    PushState& state = push_targets_[target.seq_id];
    state = PushState{};
    state.failed = target.slots.empty();
    state.target = std::move(target);
  }
  std::vector<uint64_t> gone;
  for (const auto& [seq_id, state] : push_targets_) {
    const std::shared_ptr<engine::Request> request = state.target.request.lock();
    if (request == nullptr || request->finished() || request->handed_off()) gone.push_back(seq_id);
  }
  for (uint64_t seq_id : gone) EndPush(seq_id);
}

void Replica::EndPush(uint64_t seq_id) {
  auto state = push_targets_.find(seq_id);
  if (state == push_targets_.end()) return;
  if (state->second.in_flight > 0) {
    // A plan in flight may still write into the slots: they stay held until it came back
    // (ConfirmKvPushes), and nothing more is pushed meanwhile.
    state->second.failed = true;
    state->second.ended = true;
    return;
  }
  const KvPushTarget& target = state->second.target;
  if (target.hold_id != 0) target.decode->ReleasePushHold(state->first, target.hold_id);
  push_targets_.erase(state);
}

bool Replica::AwaitPushTarget(std::shared_ptr<engine::Request>& request,
                              const SubmitOptions& placement) {
  if (!placement.await_push_target || request->cancelled() ||
      push_targets_.contains(request->seq_id())) {
    return false;
  }
  SubmitOptions waiting = placement;
  waiting.await_push_target = false;  // admitted as any prompt once answered
  awaiting_push_.push_back({std::move(request), std::move(waiting), absl::Now() + kPushTargetWait});
  awaiting_push_count_.store(static_cast<int64_t>(awaiting_push_.size()));
  return true;
}

void Replica::TakeAnsweredPushWaits(std::deque<std::shared_ptr<engine::Request>>& inbox,
                                    std::vector<SubmitOptions>& placements) {
  if (awaiting_push_.empty()) return;
  const absl::Time now = absl::Now();
  std::vector<PushWait> still;
  for (PushWait& wait : awaiting_push_) {
    if (push_targets_.contains(wait.request->seq_id()) || wait.request->cancelled() ||
        now >= wait.deadline) {
      inbox.push_back(std::move(wait.request));
      placements.push_back(std::move(wait.placement));
    } else {
      still.push_back(std::move(wait));
    }
  }
  awaiting_push_.swap(still);
  awaiting_push_count_.store(static_cast<int64_t>(awaiting_push_.size()));
}

absl::Time Replica::NextPushWaitDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const PushWait& wait : awaiting_push_) next = std::min(next, wait.deadline);
  return next;
}

void Replica::ReturnPushWaitsToInbox() {
  for (PushWait& wait : awaiting_push_) {
    placements_[wait.request.get()] = std::move(wait.placement);
    inbox_.push_front(std::move(wait.request));
  }
  awaiting_push_.clear();
  awaiting_push_count_.store(0);
}

void Replica::AddKvPushes(loom::v1::StepPlan& plan, InFlightPlan& flight) {
  for (const int32_t slot : pushed_slots_to_adopt_) plan.add_kv_pushed_slots(slot);
  pushed_slots_to_adopt_.clear();
  engine::Scheduler& scheduler = engine_->scheduler();
  const int64_t block_size = std::max(block_size_.load(), 1);
  for (auto& [seq_id, state] : push_targets_) {
    const engine::Sequence* seq = scheduler.Find(seq_id);
    if (state.failed || seq == nullptr) continue;
    // Whole blocks; once the prompt's last chunk is planned, its partial last block too.
    const int64_t prompt = static_cast<int64_t>(seq->prompt_ids.size());
    const int64_t covered = seq->num_computed >= prompt ? (prompt + block_size - 1) / block_size
                                                        : seq->num_computed / block_size;
    const int64_t whole =
        std::min<int64_t>(covered, static_cast<int64_t>(state.target.slots.size()));
    if (whole <= state.planned) continue;
    loom::v1::KvPush* push = plan.add_kv_pushes();
    for (int64_t b = state.planned; b < whole; ++b) {
      const int32_t block = b < static_cast<int64_t>(seq->blocks.size()) ? seq->blocks[b] : -1;
      if (block < 0) {  // freed behind a sliding window: nothing to push
        state.failed = true;
        break;
      }
      push->add_device_blocks(block);
      push->add_dest_slots(state.target.slots[static_cast<size_t>(b)]);
    }
    if (state.failed) {
      plan.mutable_kv_pushes()->RemoveLast();
      continue;
    }
    for (const loom::v1::KvPushDest& dest : state.target.dests) *push->add_dests() = dest;
    flight.pushes.emplace_back(seq_id, whole);
    state.planned = whole;
    ++state.in_flight;
  }
}

void Replica::ConfirmKvPushes(const InFlightPlan& flight, const loom::v1::StepResult& result) {
  for (const auto& [seq_id, whole] : flight.pushes) {
    auto state = push_targets_.find(seq_id);
    if (state == push_targets_.end()) continue;
    --state->second.in_flight;
    if (state->second.ended) {
      if (state->second.in_flight <= 0) EndPush(seq_id);
      continue;
    }
    if (result.error_code() != 0 || !result.kv_push_error().empty()) {
      if (!state->second.failed && !result.kv_push_error().empty()) {
        std::fprintf(stderr,
                     "loom: replica %s: pushing KV to decode replica %s failed, it pulls "
                     "instead: %s\n",
                     replica_id_.c_str(), state->second.target.decode->replica_id().c_str(),
                     result.kv_push_error().c_str());
      }
      state->second.failed = true;
      continue;
    }
    state->second.confirmed = std::max(state->second.confirmed, whole);
  }
}

bool Replica::TakePushedHandOff(const engine::Request& request, Replica* decode) {
  auto state = push_targets_.find(request.seq_id());
  if (state == push_targets_.end()) return false;
  const PushState& push = state->second;
  const bool pushed = !push.failed && push.target.decode == decode &&
                      push.confirmed == static_cast<int64_t>(push.target.slots.size());
  if (pushed) {
    push.target.decode->SettlePushHold(request.seq_id(), push.target.hold_id);  // for the hand-off
    push_targets_.erase(state);
  } else {
    EndPush(request.seq_id());
  }
  return pushed;
}

void Replica::AdmitPushed(const std::shared_ptr<engine::Request>& request) {
  auto hold = push_holds_.find(request->seq_id());
  ++num_handoffs_in_;
  request->MarkHandoffDone();
  if ((hold == push_holds_.end() || !hold->second.delivered) && request->cancelled()) {
    AdmitOne(request);  // cancelled on its way here (its hold ended with it): ends it
    return;
  }
  if (hold == push_holds_.end() || !hold->second.delivered) {
    // Cannot happen while the prefill replica only says "pushed" for delivered slots; a
    // hand-off without its KV recomputes the prompt here.
    ++num_handoff_failures_;
    std::fprintf(stderr,
                 "loom: replica %s: a pushed hand-off (request %s) found no slots held here, "
                 "recomputing the prompt\n",
                 replica_id_.c_str(), request->request_id().c_str());
    AdmitOne(request);
    return;
  }
  engine::Scheduler& scheduler = engine_->scheduler();
  const engine::Scheduler::HeldSlots slots = std::move(hold->second.slots);
  push_holds_.erase(hold);
  const std::vector<engine::BlockHash>& hashes = request->prompt_block_hashes();
  // The full blocks become host-tier content; a partial last block, which no hash names,
  // goes to the sequence itself (SetHostTail, below).
  const size_t whole =
      request->params().prompt_ids.size() / static_cast<size_t>(std::max(block_size_.load(), 1));
  engine::Scheduler::HeldSlots full = slots;
  full.slots.resize(std::min(full.slots.size(), whole));
  const size_t count = std::min(full.slots.size(), hashes.size());
  engine::Scheduler::HeldSlots kept;
  const int64_t stored =
      scheduler.CommitImport(full, absl::MakeConstSpan(hashes).first(count),
                             request->params().prompt_ids, request->params().cache_salt, &kept);
  // Whatever the pushes wrote holds a block on the workers now (slots the tier held
  // already are free again in its table: marking them costs nothing).
  pushed_slots_to_adopt_.insert(pushed_slots_to_adopt_.end(), slots.slots.begin(),
                                slots.slots.end());
  if (!kept.slots.empty()) import_holds_[request->seq_id()] = std::move(kept);
  ++num_handoffs_pushed_;
  if (stored > 0 || whole == 0) {
    ++num_handoffs_measured_;  // arrived with the first token: no wait of its own
  } else if (count > 0) {
    ++num_handoff_failures_;
    std::fprintf(stderr,
                 "loom: replica %s: the KV pushed for request %s arrived after this replica's "
                 "host tier was reset, recomputing the prompt here\n",
                 replica_id_.c_str(), request->request_id().c_str());
  }
  AdmitOne(request);
  if (slots.slots.size() > whole) {
    scheduler.SetHostTail(request->seq_id(), slots.slots[whole], slots.generation);
  }
}

void Replica::AbandonPushes() {
  for (auto& [seq_id, state] : push_targets_) {
    const KvPushTarget& target = state.target;
    if (target.hold_id != 0) {
      // A target no plan pushed to yet has no writer to wait out.
      target.decode->ReleasePushHold(seq_id, target.hold_id, /*writer_lost=*/state.planned > 0);
    }
  }
  push_targets_.clear();
  push_holds_.clear();  // the engine, and its tier's table, are gone with the worker
  pushed_slots_to_adopt_.clear();
}

}  // namespace loom::coordinator
