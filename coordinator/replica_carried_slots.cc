// Replica: slots of its host tier that transfers may still touch after their holder let
// them go. A push whose prefill worker was lost keeps its slots kLostWriterGrace more
// (SetPushHoldAside: that worker may still be writing through shared memory), unless its
// writer says it is done. And a worker counted as lost may live on (a step counted as stuck, a
// heartbeat gap, a re-registration) with its tier's memory, and come back as this replica's next
// worker: a prefill worker may still be writing a prompt's layers into that memory (through shared
// memory nothing can refuse), another replica's worker reading an export out of it, and
// writes named by hold ids (pushes over TCP, this worker's own pulls) may still arrive. The
// next engine's table starts empty and would hand those slots to new content. So the loss
// carries them: delivered push holds not settled (their prefill replicas stop pushing,
// VoidPushTarget, and release them as before), holds set aside for a lost writer
// (kLostWriterGrace), exports (released by their readers), and every hold id a write may
// still come for. The next table reserves the slots (Scheduler::ReserveSlots) until each
// release, and its first plan closes the ids before any slot is written
// (Scheduler::CloseEarlierHolds).
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "coordinator/replica.h"

namespace loom::coordinator {

Replica::CarriedSlots& Replica::CarryPushHold(uint64_t seq_id, const PushHold& hold) {
  CarriedSlots& carried = carried_slots_.emplace_back();
  carried.slots = hold.slots.slots;
  carried.hold_id = hold.id;
  carried.seq_id = seq_id;
  carried.prefill = hold.prefill;
  return carried;
}

void Replica::SetPushHoldAside(uint64_t seq_id, absl::Time now) {
  auto hold = push_holds_.find(seq_id);
  if (hold == push_holds_.end()) return;
  CarriedSlots& carried = CarryPushHold(seq_id, hold->second);
  carried.release_at = now + kLostWriterGrace;
  carried.held = hold->second.slots;  // held in this table already
  push_holds_.erase(hold);
}

void Replica::CarryLostTransfers() {
  // Carried already (a lost writer's push set aside, or from an earlier loss): that table
  // is gone, the next one holds them again.
  for (CarriedSlots& carried : carried_slots_) carried.held.reset();
  for (const auto& [seq_id, hold] : push_holds_) {
    // Undelivered: no writer knows the slots. Settled: its writer is done.
    if (!hold.delivered || hold.settled) continue;
    CarryPushHold(seq_id, hold);
    hold.prefill->VoidPushTarget(seq_id, hold.id);
  }
  for (const auto& [export_id, held] : exports_) {
    CarriedSlots& carried = carried_slots_.emplace_back();
    carried.slots = held.slots;
    carried.export_id = export_id;
  }
  for (const auto& [fetch_id, pending] : pending_fetches_) {
    if (pending.fetching && pending.hold_id != 0) carried_close_ids_.push_back(pending.hold_id);
  }
  // Holds released in the lost table whose close no plan that came back delivered.
  for (const InFlightPlan& plan : in_flight_) {
    carried_close_ids_.insert(carried_close_ids_.end(), plan.holds_closed.begin(),
                              plan.holds_closed.end());
  }
  const engine::HostKvTier* tier = engine_ != nullptr ? engine_->scheduler().host_tier() : nullptr;
  if (tier != nullptr) {
    carried_close_ids_.insert(carried_close_ids_.end(), tier->closed_holds().begin(),
                              tier->closed_holds().end());
  }
}

void Replica::ClaimCarriedSlots() {
  engine::Scheduler& scheduler = engine_->scheduler();
  std::vector<uint64_t> close;
  close.swap(carried_close_ids_);
  for (CarriedSlots& carried : carried_slots_) {
    carried.held = scheduler.ReserveSlots(carried.slots);
    if (carried.hold_id != 0) close.push_back(carried.hold_id);  // TCP pieces refused
  }
  scheduler.CloseEarlierHolds(close);
}

void Replica::ReleaseCarried(CarriedSlots& carried) {
  if (!carried.held.has_value() || engine_ == nullptr) return;
  engine::Scheduler& scheduler = engine_->scheduler();
  if (carried.hold_id != 0) {
    scheduler.ReleaseClosedImport(*carried.held, carried.hold_id);  // a push's own slots
  } else {
    scheduler.ReleaseSlots(*carried.held, /*import=*/false);  // another export may hold one
  }
  carried.held.reset();
}

bool Replica::ReleaseCarriedPush(uint64_t hold_id, bool writer_lost, absl::Time now) {
  if (hold_id == 0) return false;
  auto carried = absl::c_find_if(carried_slots_,
                                 [hold_id](const CarriedSlots& c) { return c.hold_id == hold_id; });
  if (carried == carried_slots_.end()) return false;
  if (writer_lost) {
    carried->release_at = std::min(carried->release_at, now + kLostWriterGrace);
    return false;
  }
  ReleaseCarried(*carried);
  carried_slots_.erase(carried);
  return true;
}

bool Replica::ReleaseCarriedExport(uint64_t export_id) {
  auto carried = absl::c_find_if(
      carried_slots_, [export_id](const CarriedSlots& c) { return c.export_id == export_id; });
  if (carried == carried_slots_.end()) return false;
  ReleaseCarried(*carried);
  carried_slots_.erase(carried);
  return true;
}

bool Replica::ReleaseDueCarriedSlots(absl::Time now) {
  bool released = false;
  for (auto carried = carried_slots_.begin(); carried != carried_slots_.end();) {
    // A writer whose own worker is lost too sends its release with writer_lost; in case it
    // had none to send, its grace starts here.
    if (carried->prefill != nullptr && carried->release_at == absl::InfiniteFuture() &&
        !carried->prefill->healthy()) {
      carried->release_at = now + kLostWriterGrace;
    }
    if (now < carried->release_at) {
      ++carried;
      continue;
    }
    ReleaseCarried(*carried);
    carried = carried_slots_.erase(carried);
    released = true;
  }
  return released;
}

}  // namespace loom::coordinator
