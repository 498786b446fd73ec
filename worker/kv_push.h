#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/worker.pb.h"
#include "worker/kv_host_tier.h"
#include "worker/kv_push_stream.h"
#include "worker/kv_slot_layout.h"
#include "worker/shared_kv_mappings.h"
#include "worker/step_backend.h"

namespace loom::worker {

/// Frees KvPusher's staging buffer, unregistering it from `pool` first (null: never
/// registered).
struct KvStagingDeleter {
  const model::KvCache* pool = nullptr;
  void operator()(uint8_t* bytes) const;
};

/// Disaggregated serving, the prefill side of a KV push (StepPlan.kv_pushes): the blocks a
/// plan names go straight into slots of the decode replica's host tiers, each layer right
/// after the forward pass wrote it (the backend's half-layer observer), so the hand-off's
/// KV has arrived when the step that samples the first token ends. A backend without the
/// observer (CUDA: a captured graph cannot stop between layers) has its blocks copied
/// whole once the forward pass succeeded, before the step's result goes back: the same
/// guarantee, without the overlap; straight into a mapped decode tier that holds this
/// worker's heads (the mapping pinned for the pool once), else in batches through a bounded
/// staging buffer (pinned where the pool is device memory). A decode tier that is a memory file of this machine
/// (RegisterRequest.host_kv_shared) is mapped writable here and written directly; one that
/// cannot be mapped (another machine or container) is written over TCP, one WriteKvBlocks
/// stream per decode rank and step (worker/kv_push_stream), whose bytes travel while the
/// forward pass goes on and which End waits for. Each decode rank gets the heads it holds
/// of this worker's (tensor-parallel sizes may differ), K, V and 8-bit scales alike, in the
/// slot layout a pull would write.
///
/// A push that cannot run (a destination not mappable from here, a failed forward pass)
/// never fails the step: StepResult.kv_push_error says why and the coordinator falls back
/// to the pull (worker/kv_transfer). Owned by the step executor; not thread-safe.
class KvPusher {
 public:
  static constexpr int64_t kDefaultStagingBytes = int64_t{16} << 20;

  /// `tier`: this worker's host tier (its layout() names the heads and sizes the slots;
  /// its stats count the bytes pushed); null or without a known layout, every push is
  /// refused.
  /// `staging_bytes`: what the staging buffer of whole-block copies holds at most (one
  /// block at least).
  KvPusher(StepBackend& backend, KvHostTier* tier, int64_t staging_bytes = kDefaultStagingBytes)
      : backend_(backend), tier_(tier), max_staging_bytes_(staging_bytes) {}
  ~KvPusher();

  /// Starts `plan`'s pushes (nothing without any): checks and maps them, and installs the
  /// per-layer copy. A failure drops them all and is kept for End.
  /// `abandoned` (optional): asked before each layer goes out; true once the coordinator
  /// gave the step up (its stream to this worker was cancelled: it lost this worker and
  /// gives the slots back), and nothing more is written.
  void Begin(const loom::v1::StepPlan& plan, std::function<bool()> abandoned = nullptr);
  /// Ends the plan's pushes, whether its forward pass ran or failed (`result.error_code`
  /// set): copies the blocks of a backend without the observer if it ran, and sets
  /// `result.kv_push_error` unless every layer of every block went out.
  void End(loom::v1::StepResult& result);

 private:
  struct Destination {
    std::shared_ptr<const SharedKvMapping> mapping;  // or, not mappable:
    std::shared_ptr<KvPushStream> stream;            // its WriteKvBlocks stream
    KvSlotLayout layout;         // the decode rank's slots
    std::vector<int64_t> heads;  // of this worker's heads, those the rank holds
    uint64_t hold_id = 0;        // the decode replica's hold on the slots (streams name it)
  };
  struct Push {
    std::vector<int32_t> blocks;      // this worker's pool blocks
    std::vector<int32_t> dest_slots;  // one per block
    std::vector<Destination> dests;
  };
  absl::Status Prepare(const loom::v1::StepPlan& plan);
  // Where `dest` writes to `to`: its tier mapped, else a stream to its address.
  absl::Status Connect(const loom::v1::KvPushDest& to, Destination& dest);
  // Layer `layer` of every block of every push into its destinations.
  void CopyLayer(int64_t layer);
  // Every layer of every block of every push, once the forward pass ran (no observer).
  absl::Status CopyBlocks();
  // CopyBlocks' way for a push whose one destination is a mapped tier holding this worker's
  // heads: the pool's SaveBlocks straight into its slots (one copy, DMA where the mapping could
  // be registered with the pool), instead of through the staging buffer. False when the push
  // is not such.
  absl::StatusOr<bool> CopyBlocksDirect(const Push& push);
  // `bytes`, layer `layer` of push.blocks[i] as a slot lays it out, into its destinations.
  absl::Status Deliver(const Push& push, size_t i, int64_t layer, const uint8_t* bytes);
  // Waits for every stream to have delivered its bytes (the first failure).
  absl::Status FinishStreams();
  // A staging buffer of at least `bytes` (page-aligned, registered with the pool).
  absl::StatusOr<uint8_t*> Staging(int64_t bytes);

  StepBackend& backend_;
  KvHostTier* tier_;  // counts the bytes pushed (to_peer)
  int64_t max_staging_bytes_;
  std::vector<Push> pushes_;
  std::vector<uint8_t> source_bytes_;  // one block's layer, as a slot lays it out
  std::vector<uint8_t> stream_bytes_;  // the heads of it a stream's rank holds
  std::map<std::string, std::shared_ptr<KvPushStream>> streams_;  // this step's, by address
  std::unique_ptr<uint8_t, KvStagingDeleter> staging_;  // whole blocks (CopyBlocks)
  // Decode tiers mapped here that CopyBlocksDirect registered with the pool (pinned for DMA),
  // held until this pusher goes (then unregistered), and those the pool refused.
  std::map<const SharedKvMapping*, std::shared_ptr<const SharedKvMapping>> registered_;
  std::set<const SharedKvMapping*> unregistrable_;
  int64_t staging_bytes_ = 0;
  int64_t half_layers_ = 0;    // observer calls in this step
  int64_t layers_copied_ = 0;  // layers every push has written
  int64_t bytes_pushed_ = 0;   // into every destination, this step
  absl::Status failure_;
  std::function<bool()> abandoned_;  // Begin's
  bool observing_ = false;
  bool after_pass_ = false;  // the backend has no observer: CopyBlocks at End
};

/// Begins a plan's pushes (when `run`: the plan validated) and ends them into `result` on
/// every way out of the step.
class KvPushScope {
 public:
  KvPushScope(KvPusher& pusher, const loom::v1::StepPlan& plan, loom::v1::StepResult& result,
              bool run, std::function<bool()> abandoned = nullptr)
      : pusher_(pusher), result_(result) {
    if (run) pusher_.Begin(plan, std::move(abandoned));
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
