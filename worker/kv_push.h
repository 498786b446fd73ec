#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loom/v1/worker.pb.h"
#include "worker/kv_host_tier.h"
#include "worker/kv_slot_layout.h"
#include "worker/shared_kv_mappings.h"
#include "worker/step_backend.h"

namespace loom::worker {

/// Disaggregated serving, the prefill side of a KV push (StepPlan.kv_pushes): the blocks a
/// plan names go straight into slots of the decode replica's host tiers, each layer right
/// after the forward pass wrote it (the backend's half-layer observer), so the hand-off's
/// KV has arrived when the step that samples the first token ends. The decode tiers are
/// memory files of this machine (RegisterRequest.host_kv_shared), mapped writable here;
/// each decode rank gets the heads it holds of this worker's (tensor-parallel sizes may
/// differ), K, V and 8-bit scales alike, in the slot layout a pull would write.
///
/// A push that cannot run (a destination not mappable from here, a backend without the
/// observer: CUDA) never fails the step: StepResult.kv_push_error says why and the
/// coordinator falls back to the pull (worker/kv_transfer). Owned by the step executor;
/// not thread-safe.
class KvPusher {
 public:
  /// `tier`: this worker's host tier (its layout() names the heads and sizes the slots);
  /// null or without a known layout, every push is refused.
  KvPusher(StepBackend& backend, const KvHostTier* tier) : backend_(backend), tier_(tier) {}
  ~KvPusher();

  /// Starts `plan`'s pushes (nothing without any): checks and maps them, and installs the
  /// per-layer copy. A failure drops them all and is kept for End.
  void Begin(const loom::v1::StepPlan& plan);
  /// Ends the plan's pushes, whether its forward pass ran or failed: sets
  /// `result.kv_push_error` unless every layer of every block went out.
  void End(loom::v1::StepResult& result);

 private:
  struct Destination {
    std::shared_ptr<const SharedKvMapping> mapping;
    KvSlotLayout layout;         // the decode rank's slots
    std::vector<int64_t> heads;  // of this worker's heads, those the rank holds
  };
  struct Push {
    std::vector<int32_t> blocks;      // this worker's pool blocks
    std::vector<int32_t> dest_slots;  // one per block
    std::vector<Destination> dests;
  };
  absl::Status Prepare(const loom::v1::StepPlan& plan);
  // Layer `layer` of every block of every push into its destinations.
  void CopyLayer(int64_t layer);

  StepBackend& backend_;
  const KvHostTier* tier_;
  std::vector<Push> pushes_;
  std::vector<uint8_t> source_bytes_;  // one block's layer, as a slot lays it out
  int64_t half_layers_ = 0;            // observer calls in this step
  int64_t layers_copied_ = 0;          // layers every push has written
  absl::Status failure_;
  bool observing_ = false;
};

/// Begins a plan's pushes (when `run`: the plan validated) and ends them into `result` on
/// every way out of the step.
class KvPushScope {
 public:
  KvPushScope(KvPusher& pusher, const loom::v1::StepPlan& plan, loom::v1::StepResult& result,
              bool run)
      : pusher_(pusher), result_(result) {
    if (run) pusher_.Begin(plan);
  }
  ~KvPushScope() { pusher_.End(result_); }
  KvPushScope(const KvPushScope&) = delete;
  KvPushScope& operator=(const KvPushScope&) = delete;

 private:
  KvPusher& pusher_;
  loom::v1::StepResult& result_;
};

/// The decode side: the slots StepPlan.kv_pushed_slots names (pushes wrote them whole)
/// hold blocks from now on. InvalidArgument for a slot outside the tier.
absl::Status AdoptPushedSlots(KvHostTier* tier, const loom::v1::StepPlan& plan);

}  // namespace loom::worker
