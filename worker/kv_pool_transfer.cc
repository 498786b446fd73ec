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

// The heads each source gives this worker, in the request's order: whole blocks where one
// source holds this worker's heads (or, one source, neither side says: the parts' sizes alone
// must match), else each source's heads that this worker holds and no source before it (in
// head order) gave: tensor-parallel slices may share a KV head (3 heads over 2 ranks), which
// then comes from the first. Together exactly this worker's heads, each once.
absl::StatusOr<std::vector<model::PeerHeads>> HeadsOfSources(
    const KvPoolDestination& dest, const loom::v1::FetchKvBlocksRequest& request) {
  const KvSlotLayout& mine = dest.heads;
  const int n = request.sources_size();
  auto heads_of = [](const loom::v1::KvBlockSource& s) { return s.num_kv_heads(); };
  if (n == 1 && (heads_of(request.sources(0)) <= 0 || !mine.known() ||
                 (request.sources(0).kv_head_begin() == mine.kv_head_begin &&
                  heads_of(request.sources(0)) == mine.num_kv_heads))) {
    return std::vector<model::PeerHeads>{model::PeerHeads{}};
  }
  if (!mine.known() || std::any_of(request.sources().begin(), request.sources().end(),
                                   [&](const auto& s) { return heads_of(s) <= 0; })) {
    return absl::FailedPreconditionError(
        "a pool-to-pool transfer between tensor-parallel sizes needs every side's KV heads");
  }
  const int64_t my_end = mine.kv_head_begin + mine.num_kv_heads;
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  auto first_of = [&](int i) {
    return std::max<int64_t>(request.sources(i).kv_head_begin(), mine.kv_head_begin);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return first_of(a) < first_of(b); });
  std::vector<model::PeerHeads> heads(n);
  int64_t next = mine.kv_head_begin;  // the first of this worker's heads no source gave yet
  for (const int i : order) {
    const loom::v1::KvBlockSource& source = request.sources(i);
    const int64_t begin = source.kv_head_begin(), end = begin + heads_of(source);
    const int64_t last = std::min(end, my_end);
    if (first_of(i) > next || last <= next) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the %d sources' KV heads do not make up this worker's [%d, %d) exactly once (%s "
          "holds [%d, %d), the heads before %d are given)",
          n, mine.kv_head_begin, my_end, source.address(), begin, end, next));
    }
    heads[i] = model::PeerHeads{heads_of(source), mine.num_kv_heads, next - begin,
                                next - mine.kv_head_begin, last - next};
    next = last;
  }
  if (next != my_end) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the %d sources' KV heads do not make up this worker's [%d, %d) exactly "
                        "once (the heads from %d are missing)",
                        n, mine.kv_head_begin, my_end, next));
  }
  return heads;
}

absl::Status CheckRequest(const KvPoolDestination& dest,
                          const loom::v1::FetchKvBlocksRequest& request) {
  if (request.sources_size() == 0 || request.dest_blocks_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a pool-to-pool transfer of %d blocks from %d sources",
                        request.dest_blocks_size(), request.sources_size()));
  }
  for (const loom::v1::KvBlockSource& source : request.sources()) {
    if (source.pool_blocks_size() != request.dest_blocks_size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%d source blocks for %d destination blocks", source.pool_blocks_size(),
                          request.dest_blocks_size()));
    }
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

// One source of a transfer, ready to copy from: its pool as it answered (after its step ran),
// the page holding its stream generation, its pool mapped or opened here, and the heads it
// gives this worker.
struct Source {
  const loom::v1::KvBlockSource* source = nullptr;
  loom::v1::SharedKvPool shared;
  std::shared_ptr<const SharedKvMapping> generation;
  model::PeerKvPool peer;
  model::PeerHeads heads;
};

absl::StatusOr<Source> OpenSource(const KvPoolDestination& dest,
                                  const loom::v1::FetchKvBlocksRequest& request,
                                  const loom::v1::KvBlockSource& source,
                                  const model::PeerHeads& heads,
                                  const grpc::ServerContext* caller) {
  Source out;
  out.source = &source;
  out.heads = heads;
  LOOM_ASSIGN_OR_RETURN(out.shared, AskForPool(source, request, caller));
  if (out.shared.boot_id().empty() || out.shared.boot_id() != BootId()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s runs on another machine: pool-to-pool transfers need shared memory", source.address()));
  }
  LOOM_ASSIGN_OR_RETURN(
      out.generation,
      SharedKvMappings::Get().Map(out.shared.pid(), out.shared.generation_fd(), sizeof(uint64_t)));
  absl::StatusOr<model::PeerKvPool> peer = out.shared.cuda_ipc_handles_size() > 0
                                               ? OpenedPools::Get().Open(*dest.pool, out.shared)
                                               : MapHostFile(out.shared);
  if (!peer.ok()) {
    return absl::Status(
        peer.status().code(),
        absl::StrFormat("the pool of %s: %s", source.address(), peer.status().message()));
  }
  out.peer = *std::move(peer);
  return out;
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
  LOOM_ASSIGN_OR_RETURN(const std::vector<model::PeerHeads> heads, HeadsOfSources(dest, request));
  const auto start = std::chrono::steady_clock::now();
  // Every source's pool asked for, mapped or opened, before anything is copied: one source,
  // or (tensor-parallel sizes differ) each source rank holding some of this worker's heads.
  std::vector<Source> sources;
  for (int s = 0; s < request.sources_size(); ++s) {
    LOOM_ASSIGN_OR_RETURN(Source opened,
                          OpenSource(dest, request, request.sources(s), heads[s], caller));
    sources.push_back(std::move(opened));
  }
  LOOM_RETURN_IF_ERROR(WaitForOwnStep(dest, request, caller));
  const std::function<bool()> current = [&] {
    return dest.current_stream(request.dest_stream_id());
  };
  const auto dst = absl::MakeConstSpan(request.dest_blocks());
  int64_t bytes = 0;
  for (size_t s = 0; s < sources.size(); ++s) {
    const Source& source = sources[s];
    const auto src = absl::MakeConstSpan(source.source->pool_blocks());
    for (size_t begin = 0; begin < src.size(); begin += kBatchBlocks) {
      if (caller != nullptr && caller->IsCancelled()) return CallerCancelled();
      const size_t count = std::min(kBatchBlocks, src.size() - begin);
      LOOM_RETURN_IF_ERROR(dest.fence->Write(request.hold_id(), current, [&] {
        // Told first: a block half-written by a failed copy holds nothing it held before.
        if (dest.written && s == 0) dest.written(dst.subspan(begin, count));
        return dest.pool->CopyBlocksFromPeer(source.peer, src.subspan(begin, count),
                                             dst.subspan(begin, count), source.heads);
      }));
    }
    int64_t block_bytes = 0;
    for (const int64_t part : source.peer.block_bytes) block_bytes += part;
    if (!source.heads.whole())
      block_bytes = block_bytes / source.heads.src_heads * source.heads.count;
    bytes += block_bytes * static_cast<int64_t>(src.size());
  }
  // The copies are done (each waited for); their reads come before these generations'.
  std::atomic_thread_fence(std::memory_order_acquire);
  for (const Source& source : sources) {
    if (ReadPoolGeneration(source.generation->data()) != source.shared.generation()) {
      return absl::AbortedError(absl::StrFormat(
          "the step stream of %s changed during the copy: its blocks may have been rewritten",
          source.source->address()));
    }
  }
  loom::v1::FetchKvBlocksResponse response;
  response.set_bytes(bytes);
  response.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return response;
}

}  // namespace loom::worker
