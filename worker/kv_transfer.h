#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/worker.grpc.pb.h"
#include "worker/kv_host_tier.h"

namespace loom::worker {

/// The KV transfer between workers: a worker serves blocks of its host tier to another
/// that fetches them into its own, by mapping the tier's memory when both run on one
/// machine, else over TCP (gRPC). The coordinator pins the slots on both sides for the
/// transfer and reloads the fetched blocks into the destination's pool with an ordinary
/// host-to-device copy (docs/ARCHITECTURE.md, "The host KV tier"). Between replicas of one
/// layout a rank reads the same rank's slots whole; between tensor-parallel sizes it reads
/// the ranks holding its KV heads and maps them (KvSlotLayout).
///
/// Chunks of at most kKvChunkBytes stream under gRPC's flow control, so neither side holds
/// more than a few chunks (and, mapping heads, one source slot) beyond the tiers
/// themselves. Debug builds checksum each slot.

inline constexpr int64_t kKvChunkBytes = 256 * 1024;

/// This machine's boot id (/proc/sys/kernel/random/boot_id): two processes that read the
/// same one share /proc and memory, so one can map the other's tier.
const std::string& BootId();

/// A context for one read from a source worker: a child of the FetchKvBlocks call being
/// served (`caller`, when there is one), so cancelling that call cancels the read.
std::unique_ptr<grpc::ClientContext> NewReadContext(const grpc::ServerContext* caller);
/// A fetch's deadline: its timeout_ms from now (0: 30 s).
std::chrono::system_clock::time_point TransferDeadline(
    const loom::v1::FetchKvBlocksRequest& request);
/// What a fetch whose caller cancelled it returns.
absl::Status CallerCancelled();

/// Where a step stands on this worker, for a reader waiting for the copies it carries.
enum class KvStepState {
  kPending,  // not run yet
  kRan,      // its copies ran
  kGone,     // its copies never will: they failed, or it was a plan of an earlier step
             // stream (the coordinator lost this worker since; the slots may hold other data)
};

/// Waits until `step_state(step_id)` is kRan (0: at once), polled every millisecond until
/// `deadline`: FAILED_PRECONDITION for a step that is kGone, `while_waiting()`'s error as soon
/// as it has one (a caller gone, a stream changed), DEADLINE_EXCEEDED past the deadline.
absl::Status WaitForStep(uint64_t step_id, const std::function<KvStepState(uint64_t)>& step_state,
                         std::chrono::system_clock::time_point deadline,
                         const std::function<absl::Status()>& while_waiting);

/// WaitForStep for a ReadKvBlocks call, until its deadline:
/// FAILED_PRECONDITION for a step that is kGone, CANCELLED / DEADLINE_EXCEEDED for the call.
grpc::Status WaitForKvStep(grpc::ServerContext* context, uint64_t step_id,
                           const std::function<KvStepState(uint64_t)>& step_state);

/// The ReadKvBlocks side: waits until `step_state(after_step_id)` is kRan (the plan that
/// offloaded the blocks ran; polled until the call's deadline), then writes every slot in
/// chunks. FAILED_PRECONDITION for a step that is kGone, or a reader whose slot size
/// differs (another model, TP slice or KV dtype), INVALID_ARGUMENT for a slot that holds no
/// block.
grpc::Status ServeKvBlocks(grpc::ServerContext* context, const KvHostTier* tier,
                           const loom::v1::ReadKvBlocksRequest& request,
                           grpc::ServerWriter<loom::v1::KvBlockChunk>* writer,
                           const std::function<KvStepState(uint64_t)>& step_state);

/// The FetchKvBlocks side: reads the slots of `request.sources` into `tier`'s dest_slots
/// (one source's slots whole, or the heads each source holds mapped into them). Every slot must
/// arrive whole (and match its checksum where one is sent); on any failure the destination slots
/// hold no block and the error names the cause (UNAVAILABLE / DEADLINE_EXCEEDED when the source is
/// gone or slow). `caller` (optional) is the FetchKvBlocks call being served: the reads from
/// the sources are its children, so a caller that cancels (its request went away) or
/// passes its deadline cancels them (CANCELLED), also while a source still waits for its
/// step, and a mapped copy stops at the next slot.
absl::StatusOr<loom::v1::FetchKvBlocksResponse> FetchKvBlocks(
    KvHostTier* tier, const loom::v1::FetchKvBlocksRequest& request,
    const grpc::ServerContext* caller = nullptr);

}  // namespace loom::worker
