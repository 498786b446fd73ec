#include "worker/kv_pool_transfer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/cluster_secret.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "worker/shared_kv_mappings.h"

namespace loom::worker {
namespace {

// Blocks per batch: one fence section (a step-stream change waits for at most one), and the
// caller's cancellation is seen between batches.
constexpr size_t kBatchBlocks = 64;

loom::v1::SharedKvPool ToProto(const model::KvPoolShare& share) {
  loom::v1::SharedKvPool pool;
  pool.set_boot_id(BootId());
  pool.set_pid(static_cast<int32_t>(getpid()));
  pool.set_fd(share.fd);
  pool.set_file_bytes(share.file_bytes);
  for (const std::string& handle : share.cuda_ipc_handles) pool.add_cuda_ipc_handles(handle);
  pool.set_cuda_device_uuid(share.cuda_device_uuid);
  for (const model::KvPoolPart& part : share.parts) {
    loom::v1::KvPoolPart* out = pool.add_parts();
    out->set_allocation(part.allocation);
    out->set_offset(part.offset);
    out->set_block_bytes(part.block_bytes);
  }
  pool.set_num_blocks(share.num_blocks);
  return pool;
}

model::KvPoolShare FromProto(const loom::v1::SharedKvPool& pool) {
  model::KvPoolShare share;
  share.kind = pool.cuda_ipc_handles_size() > 0 ? model::KvPoolShare::Kind::kCudaIpc
                                                : model::KvPoolShare::Kind::kHostFile;
  share.fd = pool.fd();
  share.file_bytes = pool.file_bytes();
  share.cuda_ipc_handles.assign(pool.cuda_ipc_handles().begin(), pool.cuda_ipc_handles().end());
  share.cuda_device_uuid = pool.cuda_device_uuid();
  for (const loom::v1::KvPoolPart& part : pool.parts()) {
    share.parts.push_back({part.allocation(), part.offset(), part.block_bytes()});
  }
  share.num_blocks = pool.num_blocks();
  return share;
}

// A CPU pool's memory file, mapped read-only here (kept mapped between fetches).
absl::StatusOr<model::PeerKvPool> MapHostFile(const loom::v1::SharedKvPool& pool) {
  LOOM_ASSIGN_OR_RETURN(std::shared_ptr<const SharedKvMapping> mapping,
                        SharedKvMappings::Get().Map(pool.pid(), pool.fd(), pool.file_bytes()));
  model::PeerKvPool peer;
  peer.num_blocks = pool.num_blocks();
  for (const loom::v1::KvPoolPart& part : pool.parts()) {
    if (part.allocation() != 0 || part.offset() < 0 || part.block_bytes() <= 0 ||
        part.offset() + pool.num_blocks() * part.block_bytes() > pool.file_bytes()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the source's pool part at %d (%d bytes a block, %d blocks) lies outside its %d-byte "
          "memory file",
          part.offset(), part.block_bytes(), pool.num_blocks(), pool.file_bytes()));
    }
    peer.bases.push_back(mapping->data() + part.offset());
    peer.block_bytes.push_back(part.block_bytes());
  }
  peer.keep = std::move(mapping);
  return peer;
}

// Other processes' CUDA pools opened here, kept between fetches (opening one costs driver
// calls, and a handle opened twice in one process may be refused). At most a few sources.
class OpenedPools {
 public:
  static OpenedPools& Get() {
    static OpenedPools* const pools = new OpenedPools();
    return *pools;
  }
  absl::StatusOr<model::PeerKvPool> Open(const model::KvCache& pool,
                                         const loom::v1::SharedKvPool& shared) {
    const std::string key = absl::StrFormat("%d/%s", shared.pid(), shared.cuda_ipc_handles(0));
    absl::MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == key) {
        std::rotate(it, it + 1, entries_.end());
        return entries_.back().second;
      }
    }
    LOOM_ASSIGN_OR_RETURN(model::PeerKvPool peer, pool.OpenPeer(FromProto(shared)));
    if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
    entries_.emplace_back(key, peer);
    return peer;
  }

 private:
  static constexpr size_t kMaxEntries = 8;
  absl::Mutex mu_;
  std::vector<std::pair<std::string, model::PeerKvPool>> entries_ ABSL_GUARDED_BY(mu_);
};

// Asks the source for its pool (after its step ran): the one chunk of its answer.
absl::StatusOr<loom::v1::SharedKvPool> AskForPool(const loom::v1::KvBlockSource& source,
                                                  const loom::v1::FetchKvBlocksRequest& request,
                                                  const grpc::ServerContext* caller) {
  auto stub = loom::v1::Worker::NewStub(common::CreateClusterChannel(source.address()));
  std::unique_ptr<grpc::ClientContext> context = NewReadContext(caller);
  context->set_deadline(TransferDeadline(request));
  loom::v1::ReadKvBlocksRequest read;
  read.mutable_pool_blocks()->CopyFrom(source.pool_blocks());
  read.set_stream_id(source.stream_id());
  read.set_after_step_id(request.after_step_id());
  read.set_offer_shared_memory(true);
  std::unique_ptr<grpc::ClientReader<loom::v1::KvBlockChunk>> reader =
      stub->ReadKvBlocks(context.get(), read);
  loom::v1::KvBlockChunk chunk;
  const bool answered = reader->Read(&chunk);
  const grpc::Status finished = reader->Finish();
  if (!finished.ok())
    return common::FromGrpcStatus(finished, "asking " + source.address() + " for its pool");
  if (!answered || !chunk.has_pool()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s answered without its pool (an older worker)", source.address()));
  }
  return chunk.pool();
}

absl::Status CheckRequest(const KvPoolDestination& dest,
                          const loom::v1::FetchKvBlocksRequest& request) {
  if (request.sources_size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a pool-to-pool transfer reads one source, got %d (pools of other tensor-parallel "
        "slices go through the host tiers)",
        request.sources_size()));
  }
  const loom::v1::KvBlockSource& source = request.sources(0);
  if (source.pool_blocks_size() != request.dest_blocks_size() || request.dest_blocks_size() == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%d source blocks for %d destination blocks",
                                                      source.pool_blocks_size(),
                                                      request.dest_blocks_size()));
  }
  if (source.num_kv_heads() > 0 && dest.heads.known() &&
      (source.kv_head_begin() != dest.heads.kv_head_begin ||
       source.num_kv_heads() != dest.heads.num_kv_heads)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the source holds KV heads [%d, %d), this worker [%d, %d): pool-to-pool transfers copy "
        "whole blocks of the same heads",
        source.kv_head_begin(), source.kv_head_begin() + source.num_kv_heads(),
        dest.heads.kv_head_begin, dest.heads.kv_head_begin + dest.heads.num_kv_heads));
  }
  absl::flat_hash_set<int32_t> distinct;
  for (const int32_t block : request.dest_blocks()) {
    if (block < 0 || block >= dest.pool->num_blocks() || !distinct.insert(block).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "destination block %d is out of [0, %d) or named twice", block, dest.pool->num_blocks()));
    }
  }
  return absl::OkStatus();
}

// Plans sent before the destination blocks were taken may still write them: they run first.
absl::Status WaitForOwnStep(const KvPoolDestination& dest,
                            const loom::v1::FetchKvBlocksRequest& request,
                            const grpc::ServerContext* caller) {
  return WaitForStep(request.dest_step_id(), dest.step_state, TransferDeadline(request), [&] {
    if (!dest.current_stream(request.dest_stream_id())) {
      return absl::AbortedError("this worker's step stream changed since the transfer was planned");
    }
    if (caller != nullptr && caller->IsCancelled()) return CallerCancelled();
    return absl::OkStatus();
  });
}

}  // namespace

const std::string& KvPoolScope() {
  static const std::string* scope = [] {
    char link[256] = {};
    const ssize_t size = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
    return new std::string(BootId() + "/" + (size > 0 ? std::string(link, size) : "pid:[?]"));
  }();
  return *scope;
}

grpc::Status ServeKvPoolBlocks(grpc::ServerContext* context, const model::KvCache* pool,
                               const KvPoolFence& fence,
                               const std::function<bool(uint64_t)>& current_stream,
                               const loom::v1::ReadKvBlocksRequest& request,
                               grpc::ServerWriter<loom::v1::KvBlockChunk>* writer,
                               const std::function<KvStepState(uint64_t)>& step_state) {
  if (pool == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this worker has no KV pool");
  }
  if (!request.offer_shared_memory()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "a pool's blocks are read through shared memory only (use the host tiers "
                        "across machines)");
  }
  absl::StatusOr<model::KvPoolShare> share = pool->Share();
  if (!share.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        std::string(share.status().message()));
  }
  if (grpc::Status ran = WaitForKvStep(context, request.after_step_id(), step_state); !ran.ok()) {
    return ran;
  }
  for (const int32_t block : request.pool_blocks()) {
    if (block < 0 || block >= share->num_blocks) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("block %d is outside this worker's pool (%d blocks)",
                                          block, share->num_blocks));
    }
  }
  // Read after the step ran, under the stream that holds the blocks: a change since then
  // moves it, and the reader discards what it copied.
  const std::optional<uint64_t> generation =
      fence.GenerationIf([&] { return current_stream(request.stream_id()); });
  if (!generation.has_value()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the step stream that held the blocks is not this worker's any more (its "
                        "coordinator lost it): they may be other sequences' now");
  }
  loom::v1::KvBlockChunk chunk;
  loom::v1::SharedKvPool* shared = chunk.mutable_pool();
  *shared = ToProto(*share);
  shared->set_generation_fd(fence.fd());
  shared->set_generation(*generation);
  writer->Write(chunk);
  return grpc::Status::OK;
}

absl::StatusOr<loom::v1::FetchKvBlocksResponse> FetchKvPoolBlocks(
    const KvPoolDestination& dest, const loom::v1::FetchKvBlocksRequest& request,
    const grpc::ServerContext* caller) {
  if (dest.pool == nullptr || dest.fence == nullptr) {
    return absl::FailedPreconditionError("this worker has no KV pool to fetch into");
  }
  LOOM_RETURN_IF_ERROR(CheckRequest(dest, request));
  const auto start = std::chrono::steady_clock::now();
  const loom::v1::KvBlockSource& source = request.sources(0);
  LOOM_ASSIGN_OR_RETURN(const loom::v1::SharedKvPool shared, AskForPool(source, request, caller));
  if (shared.boot_id().empty() || shared.boot_id() != BootId()) {
    return absl::FailedPreconditionError(
        "the source runs on another machine: pool-to-pool transfers need shared memory");
  }
  LOOM_ASSIGN_OR_RETURN(
      const std::shared_ptr<const SharedKvMapping> generation,
      SharedKvMappings::Get().Map(shared.pid(), shared.generation_fd(), sizeof(uint64_t)));
  absl::StatusOr<model::PeerKvPool> peer = shared.cuda_ipc_handles_size() > 0
                                               ? OpenedPools::Get().Open(*dest.pool, shared)
                                               : MapHostFile(shared);
  if (!peer.ok()) {
    return absl::Status(
        peer.status().code(),
        absl::StrFormat("the pool of %s: %s", source.address(), peer.status().message()));
  }
  LOOM_RETURN_IF_ERROR(WaitForOwnStep(dest, request, caller));
  const std::function<bool()> current = [&] {
    return dest.current_stream(request.dest_stream_id());
  };
  const auto src = absl::MakeConstSpan(source.pool_blocks());
  const auto dst = absl::MakeConstSpan(request.dest_blocks());
  for (size_t begin = 0; begin < src.size(); begin += kBatchBlocks) {
    if (caller != nullptr && caller->IsCancelled()) return CallerCancelled();
    const size_t count = std::min(kBatchBlocks, src.size() - begin);
    LOOM_RETURN_IF_ERROR(dest.fence->Write(request.hold_id(), current, [&] {
      // Told first: a block half-written by a failed copy holds nothing it held before.
      if (dest.written) dest.written(dst.subspan(begin, count));
      return dest.pool->CopyBlocksFromPeer(*peer, src.subspan(begin, count),
                                           dst.subspan(begin, count));
    }));
  }
  // The copies are done (each waited for); their reads come before this generation's.
  std::atomic_thread_fence(std::memory_order_acquire);
  if (ReadPoolGeneration(generation->data()) != shared.generation()) {
    return absl::AbortedError(absl::StrFormat(
        "the step stream of %s changed during the copy: its blocks may have been rewritten",
        source.address()));
  }
  int64_t block_bytes = 0;
  for (const int64_t bytes : peer->block_bytes) block_bytes += bytes;
  loom::v1::FetchKvBlocksResponse response;
  response.set_bytes(block_bytes * static_cast<int64_t>(src.size()));
  response.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return response;
}

}  // namespace loom::worker
