// Replica: disaggregated hand-offs. A decode replica holds blocks for the prompts placed on
// a prefill replica for it (ReserveForHandOff; the scheduler keeps them free from other
// admissions) until the hand-off is admitted or released; a prefill replica hands each
// request to its decode replica after the first token, its KV pushed already
// (replica_kv_push.cc) or exported for the decode replica to pull (replica_kv_fetch.cc).
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "coordinator/replica.h"

namespace loom::coordinator {

absl::Status Replica::ReserveForHandOff(const std::shared_ptr<engine::Request>& request,
                                        int64_t blocks) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || !healthy_.load()) {
    return absl::UnavailableError(absl::StrFormat("replica %s has no live worker", replica_id_));
  }
  auto [it, added] = reservations_.try_emplace(request->seq_id());
  const int64_t before = it->second.blocks;
  const int64_t unheld = stats_.num_free_blocks() - (reserved_blocks_ - before) - held_for_waiting_;
  if (blocks > unheld) {
    if (added) reservations_.erase(it);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "replica %s has %d free KV blocks not held for other hand-offs; this one needs %d",
        replica_id_, std::max<int64_t>(unheld, 0), blocks));
  }
  it->second = {request, blocks};
  reserved_blocks_ += blocks - before;
  return absl::OkStatus();
}

int64_t Replica::ReleaseReservation(uint64_t seq_id) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(seq_id);
  if (it == reservations_.end()) return 0;
  const int64_t blocks = it->second.blocks;
  reserved_blocks_ -= blocks;
  reservations_.erase(it);
  return blocks;
}

void Replica::SyncReservations() {
  int64_t arrivals = 0;
  {
    absl::MutexLock lock(&mu_);
    // A request dropped everywhere (its client gone, every replica done with it) that no
    // path released: its hold must not outlive it.
    absl::erase_if(reservations_, [this](const auto& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!entry.second.request.expired()) return false;
      reserved_blocks_ -= entry.second.blocks;
      return true;
    });
    arrivals = reserved_blocks_;
  }
  engine_->scheduler().set_blocks_held_for_arrivals(arrivals);
}

void Replica::ReleaseHandOffTarget(uint64_t seq_id) {
  auto target = hand_off_targets_.find(seq_id);
  if (target == hand_off_targets_.end()) return;
  target->second->ReleaseReservation(seq_id);
  hand_off_targets_.erase(target);
}

void Replica::HandOffPrefilled() {
  if (prefilled_.empty()) return;
  std::vector<std::shared_ptr<engine::Request>> prefilled;
  prefilled.swap(prefilled_);
  for (std::shared_ptr<engine::Request>& request : prefilled) {
    auto target = hand_off_targets_.find(request->seq_id());
    Replica* decode = target == hand_off_targets_.end() ? nullptr : target->second;
    if (target != hand_off_targets_.end()) hand_off_targets_.erase(target);
    ++num_handoffs_out_;
    request->MarkHandedOff();
    if (hand_off_ == nullptr) {
      request->Finish(loom::v1::FINISH_REASON_ERROR, "no decode replica to hand it to",
                      replica_id_);
      continue;
    }
    // Pushed into the decode replica's tier as it was computed; else its full prompt blocks
    // are registered in the prefix cache by now (the sequence was released): held for the
    // decode replica to pull, their copies to the host tier in the very next plan.
    KvExport exported;
    if (TakePushedHandOff(*request, decode)) {
      exported.pushed = true;
      exported.source = this;
    } else {
      exported = Export(*request, /*fetch_id=*/0, decode);
    }
    hand_off_(std::move(request), this, decode, std::move(exported));
  }
}

}  // namespace loom::coordinator
