#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/worker.grpc.pb.h"
#include "model/device.h"
#include "worker/kv_pool_fence.h"
#include "worker/kv_slot_layout.h"
#include "worker/kv_transfer.h"

namespace loom::worker {

/// Pool-to-pool KV transfers between workers of one machine: a worker copies blocks straight
/// out of another worker's device pool into its own, with no host tier on either side, one
/// copy per block and part (host memory through the source pool's memory file on the CPU;
/// device to device through CUDA IPC on GPUs, over NVLink or within one GPU). The coordinator
/// holds the source blocks in the source replica's block table and the destination blocks,
/// unreferenced by any sequence, in the destination's, for the transfer's duration; the
/// workers fence the copy against step-stream changes on either side (KvPoolFence), since
/// those hand the blocks to other sequences.
///
/// Between replicas of different tensor-parallel sizes a destination rank reads the heads it
/// holds from every source rank holding some of them (model::PeerHeads: each token row's
/// heads). Between machines, or between pools of different layouts (KV dtypes, block sizes,
/// pipeline stages), blocks go through the host tiers instead (worker/kv_transfer).

/// Within what other workers can read this process's pool: this machine's boot id and the
/// process's PID namespace ("<boot id>/pid:[<inode>]"), computed once.
const std::string& KvPoolScope();

/// The ReadKvBlocks side for `request.pool_blocks`: waits until `step_state(after_step_id)` is
/// kRan, then answers one chunk with `pool` (where and how to map it, and `fence`'s
/// generation, read while `current_stream(request.stream_id)` holds: the stream whose table
/// holds the blocks). FAILED_PRECONDITION when this worker's pool cannot be shared (no pool,
/// a CPU pool outside shared memory), the reader did not offer to map it, or that stream is
/// not the current one; INVALID_ARGUMENT for a block outside the pool.
grpc::Status ServeKvPoolBlocks(grpc::ServerContext* context, const model::KvCache* pool,
                               const KvPoolFence& fence,
                               const std::function<bool(uint64_t)>& current_stream,
                               const loom::v1::ReadKvBlocksRequest& request,
                               grpc::ServerWriter<loom::v1::KvBlockChunk>* writer,
                               const std::function<KvStepState(uint64_t)>& step_state);

/// What FetchKvPoolBlocks writes into and checks against: this worker's pool, its fence, its
/// KV heads where known (`heads`: its kv_head_begin and num_kv_heads; unknown: one source,
/// whose parts' sizes alone must match), whether the
/// step stream with a given id is this worker's current one, where a step stands, and who
/// to tell which blocks were written (the KV ledger forgets what they held).
struct KvPoolDestination {
  const model::KvCache* pool = nullptr;
  KvPoolFence* fence = nullptr;
  KvSlotLayout heads;
  std::function<bool(uint64_t)> current_stream;
  std::function<KvStepState(uint64_t)> step_state;
  std::function<void(absl::Span<const int32_t>)> written;
};

/// The FetchKvBlocks side for `request.dest_blocks`: asks each source (ReadKvBlocks) for its
/// pool, maps it (its memory file, or its CUDA IPC allocations), waits until this worker ran
/// `request.dest_step_id`, and copies block `sources(s).pool_blocks(i)` into `dest_blocks(i)`
/// (whole where the source holds this worker's heads, else the heads both hold: together the
/// sources must give each of this worker's heads once) in batches, each under `dest.fence`
/// while `request.dest_stream_id` is the current stream (ABORTED once it is not). Then every
/// source's generation must be the one it answered with, else ABORTED: the blocks read may
/// have been rewritten (its stream changed), and the destination blocks hold nothing usable
/// (the coordinator frees them). FAILED_PRECONDITION for a source on another machine, of
/// another layout, whose heads do not fit, or whose pool cannot be shared; INVALID_ARGUMENT
/// for a malformed request. `caller` (optional) is the FetchKvBlocks call: cancelling it stops
/// the copy at the next batch.
absl::StatusOr<loom::v1::FetchKvBlocksResponse> FetchKvPoolBlocks(
    const KvPoolDestination& dest, const loom::v1::FetchKvBlocksRequest& request,
    const grpc::ServerContext* caller = nullptr);

}  // namespace loom::worker
