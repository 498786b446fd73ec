#include "worker/kv_transfer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/cluster_secret.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "worker/shared_kv_mappings.h"

namespace loom::worker {
const std::string& BootId() {
  static const std::string* id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    auto* text = new std::string;
    std::getline(in, *text);
    return text;
  }();
  return *id;
}

std::unique_ptr<grpc::ClientContext> NewReadContext(const grpc::ServerContext* caller) {
  if (caller == nullptr) return std::make_unique<grpc::ClientContext>();
  return grpc::ClientContext::FromServerContext(*caller);
}

std::chrono::system_clock::time_point TransferDeadline(
    const loom::v1::FetchKvBlocksRequest& request) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(request.timeout_ms() > 0 ? request.timeout_ms() : 30000);
}

absl::Status CallerCancelled() {
  return absl::CancelledError("the fetch was cancelled by its caller");
}

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::Status WaitForStep(uint64_t step_id, const std::function<KvStepState(uint64_t)>& step_state,
                         std::chrono::system_clock::time_point deadline,
                         const std::function<absl::Status()>& while_waiting) {
  while (step_id > 0) {
    const KvStepState state = step_state(step_id);
    if (state == KvStepState::kRan) break;
    if (state == KvStepState::kGone) {
      return absl::FailedPreconditionError(
          absl::StrFormat("step %d, which writes the blocks, will not run here (its copies "
                          "failed, or it was planned before this worker's step stream began)",
                          step_id));
    }
    LOOM_RETURN_IF_ERROR(while_waiting());
    if (std::chrono::system_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrFormat("step %d, which writes the blocks, did not run in time", step_id));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

grpc::Status WaitForKvStep(grpc::ServerContext* context, uint64_t step_id,
                           const std::function<KvStepState(uint64_t)>& step_state) {
  return common::ToGrpcStatus(WaitForStep(step_id, step_state, context->deadline(), [context] {
    return context->IsCancelled() ? absl::CancelledError("the reader went away") : absl::OkStatus();
  }));
}

grpc::Status ServeKvBlocks(grpc::ServerContext* context, const KvHostTier* tier,
                           const loom::v1::ReadKvBlocksRequest& request,
                           grpc::ServerWriter<loom::v1::KvBlockChunk>* writer,
                           const std::function<KvStepState(uint64_t)>& step_state) {
  if (tier == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this worker has no host tier (--kv-offload-memory)");
  }
  if (request.slot_bytes() != tier->slot_bytes()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrFormat("the reader's KV blocks are %d bytes, this worker's %d (another model, "
                        "tensor-parallel slice or KV dtype)",
                        request.slot_bytes(), tier->slot_bytes()));
  }
  if (grpc::Status ran = WaitForKvStep(context, request.after_step_id(), step_state); !ran.ok()) {
    return ran;
  }
  loom::v1::KvBlockChunk chunk;
  if (request.offer_shared_memory() && tier->shared_fd() >= 0) {
    // The same machine, perhaps: the reader maps the tier and copies the slots itself (the
    // coordinator holds them until the reader is done).
    for (const int32_t slot : request.host_slots()) {
      if (absl::Status held = tier->ReadSlot(slot, 0, {}); !held.ok()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(held.message()));
      }
    }
    loom::v1::SharedKvMemory* shared = chunk.mutable_shared();
    shared->set_boot_id(BootId());
    shared->set_pid(static_cast<int32_t>(getpid()));
    shared->set_fd(tier->shared_fd());
    shared->set_size(tier->mapped_bytes());
    writer->Write(chunk);
    return grpc::Status::OK;
  }
  std::string& data = *chunk.mutable_data();
  for (int i = 0; i < request.host_slots_size(); ++i) {
    const int32_t slot = request.host_slots(i);
    for (int64_t offset = 0; offset < tier->slot_bytes(); offset += kKvChunkBytes) {
      const int64_t size = std::min(kKvChunkBytes, tier->slot_bytes() - offset);
      data.resize(static_cast<size_t>(size));
      absl::Status read = tier->ReadSlot(
          slot, offset, absl::MakeSpan(reinterpret_cast<uint8_t*>(data.data()), data.size()));
      if (!read.ok()) {
        return common::ToGrpcStatus(read);
      }
      chunk.set_index(i);
      chunk.set_offset(offset);
      chunk.set_checksum(offset + size == tier->slot_bytes() ? tier->TransferChecksum(slot) : 0);
      if (!writer->Write(chunk)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
      }
    }
  }
  return grpc::Status::OK;
}

namespace {

// What one source brings: its slots whole (the reader's heads), or the heads it provides
// of the reader's, mapped from its layout.
struct SourcePlan {
  const loom::v1::KvBlockSource* source = nullptr;
  bool whole = true;
  KvSlotLayout layout;         // the source's (mapped)
  std::vector<int64_t> heads;  // mapped: the reader's heads taken from this source
  int64_t slot_bytes = 0;      // of the source's slots
};

// Each source's part: one source with the reader's heads (or unstated ones) is copied
// whole; otherwise every head of the reader's comes from the first source that holds it.
absl::StatusOr<std::vector<SourcePlan>> PlanSources(const KvHostTier& tier,
                                                    const loom::v1::FetchKvBlocksRequest& request) {
  const KvSlotLayout& mine = tier.layout();
  std::vector<SourcePlan> plans(static_cast<size_t>(request.sources_size()));
  for (int s = 0; s < request.sources_size(); ++s) {
    const loom::v1::KvBlockSource& source = request.sources(s);
    if (source.slots_size() != request.dest_slots_size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a fetch needs one destination slot per source slot, got %d and %d from %s",
          source.slots_size(), request.dest_slots_size(), source.address()));
    }
    plans[s].source = &source;
    plans[s].slot_bytes = tier.slot_bytes();
  }
  const loom::v1::KvBlockSource& first = request.sources(0);
  if (request.sources_size() == 1 &&
      (first.num_kv_heads() == 0 || (first.kv_head_begin() == mine.kv_head_begin &&
                                     first.num_kv_heads() == mine.num_kv_heads))) {
    return plans;
  }
  if (!mine.known()) {
    return absl::FailedPreconditionError(
        "this worker's KV slot layout is unknown, so it cannot map KV heads from other "
        "tensor-parallel slices");
  }
  for (SourcePlan& plan : plans) {
    if (plan.source->num_kv_heads() <= 0 || plan.source->kv_head_begin() < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "source %s names no KV heads; with several sources or another slice each must",
          plan.source->address()));
    }
    plan.whole = false;
    plan.layout = mine.WithHeads(plan.source->kv_head_begin(), plan.source->num_kv_heads());
    plan.slot_bytes = plan.layout.slot_bytes();
  }
  for (int64_t head = mine.kv_head_begin; head < mine.kv_head_begin + mine.num_kv_heads; ++head) {
    auto holder = std::find_if(plans.begin(), plans.end(),
                               [head](const SourcePlan& plan) { return plan.layout.holds(head); });
    if (holder == plans.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("no source holds KV head %d of this worker's [%d, %d)", head,
                          mine.kv_head_begin, mine.kv_head_begin + mine.num_kv_heads));
    }
    holder->heads.push_back(head);
  }
  return plans;
}

// What a fetch writes is written only while its caller waits and its hold is open (a
// coordinator that gave up may have given the slots to other content), checked under the
// tier's lock with each write.
KvWriteGuard FetchGuard(const loom::v1::FetchKvBlocksRequest& request,
                        const grpc::ServerContext* caller) {
  KvWriteGuard guard;
  guard.hold_id = request.hold_id();
  if (caller != nullptr) guard.wanted = [caller] { return !caller->IsCancelled(); };
  return guard;
}

// One complete source slot arrived (`checksum`: the sender's, 0 when not computed).
absl::Status Deliver(KvHostTier* tier, const SourcePlan& plan, int32_t dest_slot,
                     absl::Span<const uint8_t> bytes, uint64_t checksum,
                     const KvWriteGuard& guard) {
  if (plan.whole) {
    LOOM_RETURN_IF_ERROR(tier->WriteSlot(dest_slot, 0, bytes, guard));
    return tier->MarkWritten(dest_slot, checksum, guard);
  }
  if (checksum != 0 && KvSlotChecksum(bytes) != checksum) {
    return absl::DataLossError(absl::StrFormat(
        "a block for host slot %d: its checksum does not match the sender's", dest_slot));
  }
  return tier->WriteSlotWith(
      dest_slot,
      [&](absl::Span<uint8_t> to) {
        CopyKvHeads(plan.layout, bytes, tier->layout(), to, plan.heads);
      },
      guard);
}

// Opens a ReadKvBlocks stream for the source's slots, with the transfer's deadline.
std::unique_ptr<grpc::ClientReader<loom::v1::KvBlockChunk>> StartRead(
    loom::v1::Worker::Stub& stub, grpc::ClientContext& context, const SourcePlan& plan,
    const loom::v1::FetchKvBlocksRequest& request, bool offer_shared_memory) {
  context.set_deadline(TransferDeadline(request));
  loom::v1::ReadKvBlocksRequest read;
  read.mutable_host_slots()->CopyFrom(plan.source->slots());
  read.set_after_step_id(request.after_step_id());
  read.set_slot_bytes(plan.slot_bytes);
  read.set_offer_shared_memory(offer_shared_memory);
  return stub.ReadKvBlocks(&context, read);
}

// Copies the source's slots out of its mapped tier; Unavailable when the map cannot be
// opened (another machine or container, other permissions): then TCP.
absl::Status CopyShared(KvHostTier* tier, const loom::v1::SharedKvMemory& shared,
                        const SourcePlan& plan, const loom::v1::FetchKvBlocksRequest& request,
                        const grpc::ServerContext* caller) {
  if (shared.boot_id().empty() || shared.boot_id() != BootId()) {
    return absl::UnavailableError("the source runs on another machine");
  }
  // Kept mapped between fetches: a fresh mapping faults in every page it reads.
  LOOM_ASSIGN_OR_RETURN(const std::shared_ptr<const SharedKvMapping> mapping,
                        SharedKvMappings::Get().Map(shared.pid(), shared.fd(), shared.size()));
  const uint8_t* source = mapping->data();
  absl::Status status;
  for (int i = 0; status.ok() && i < plan.source->slots_size(); ++i) {
    if (caller != nullptr && caller->IsCancelled()) return CallerCancelled();
    const int64_t offset = static_cast<int64_t>(plan.source->slots(i)) * plan.slot_bytes;
    if (offset < 0 || offset + plan.slot_bytes > shared.size()) {
      status = absl::InvalidArgumentError(
          absl::StrFormat("source slot %d is outside the source's tier", plan.source->slots(i)));
      break;
    }
    status = Deliver(tier, plan, request.dest_slots(i),
                     absl::MakeConstSpan(source + offset, static_cast<size_t>(plan.slot_bytes)),
                     /*checksum=*/0, FetchGuard(request, caller));
  }
  return status;
}

// The same machine: maps the source's tier instead of streaming its bytes. nullopt when
// the bytes must be streamed instead (the source has no shared tier, or it cannot be
// mapped from here).
std::optional<absl::Status> FetchShared(loom::v1::Worker::Stub& stub, KvHostTier* tier,
                                        const SourcePlan& plan,
                                        const loom::v1::FetchKvBlocksRequest& request,
                                        const grpc::ServerContext* caller) {
  const std::unique_ptr<grpc::ClientContext> context_owner = NewReadContext(caller);
  grpc::ClientContext& context = *context_owner;
  std::unique_ptr<grpc::ClientReader<loom::v1::KvBlockChunk>> reader =
      StartRead(stub, context, plan, request, /*offer_shared_memory=*/true);
  loom::v1::KvBlockChunk first;
  if (!reader->Read(&first)) {
    const grpc::Status finished = reader->Finish();
    if (finished.ok()) return std::nullopt;
    return common::FromGrpcStatus(finished, "reading KV blocks from " + plan.source->address());
  }
  if (!first.has_shared()) {
    // A source without a shared tier started streaming bytes: ask again for the stream.
    context.TryCancel();
    reader->Finish().ok();
    return std::nullopt;
  }
  const grpc::Status finished = reader->Finish();
  const absl::Status copied = finished.ok()
                                  ? CopyShared(tier, first.shared(), plan, request, caller)
                                  : common::FromGrpcStatus(finished, "reading KV blocks");
  // Not mappable from here: stream the bytes (the step wait has passed already).
  if (copied.code() == absl::StatusCode::kUnavailable && finished.ok()) return std::nullopt;
  return copied;
}

// Streams the source's slots over TCP: chunks of a slot in order, slot after slot.
absl::Status FetchStreamed(loom::v1::Worker::Stub& stub, KvHostTier* tier, const SourcePlan& plan,
                           const loom::v1::FetchKvBlocksRequest& request,
                           const grpc::ServerContext* caller) {
  const std::unique_ptr<grpc::ClientContext> context_owner = NewReadContext(caller);
  grpc::ClientContext& context = *context_owner;
  std::unique_ptr<grpc::ClientReader<loom::v1::KvBlockChunk>> reader =
      StartRead(stub, context, plan, request, /*offer_shared_memory=*/false);
  std::vector<int64_t> received(static_cast<size_t>(request.dest_slots_size()), 0);
  std::vector<uint8_t> slot_bytes;  // mapped: the source slot being received
  if (!plan.whole) slot_bytes.resize(static_cast<size_t>(plan.slot_bytes));
  const KvWriteGuard guard = FetchGuard(request, caller);
  absl::Status failure;
  loom::v1::KvBlockChunk chunk;
  while (failure.ok() && reader->Read(&chunk)) {
    const size_t index = static_cast<size_t>(chunk.index());
    if (chunk.index() < 0 || chunk.index() >= request.dest_slots_size() ||
        chunk.offset() != received[index] ||
        received[index] + static_cast<int64_t>(chunk.data().size()) > plan.slot_bytes) {
      failure = absl::DataLossError(absl::StrFormat(
          "the source sent chunk %d at offset %d out of order", chunk.index(), chunk.offset()));
      break;
    }
    const int32_t slot = request.dest_slots(chunk.index());
    const auto data = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(chunk.data().data()),
                                          chunk.data().size());
    if (plan.whole) {
      failure = tier->WriteSlot(slot, chunk.offset(), data, guard);
    } else {
      std::copy(data.begin(), data.end(), slot_bytes.begin() + chunk.offset());
    }
    received[index] += static_cast<int64_t>(data.size());
    if (failure.ok() && received[index] == plan.slot_bytes) {
      failure = plan.whole ? tier->MarkWritten(slot, chunk.checksum(), guard)
                           : Deliver(tier, plan, slot, slot_bytes, chunk.checksum(), guard);
    }
  }
  if (!failure.ok()) context.TryCancel();
  const grpc::Status finished = reader->Finish();
  if (failure.ok() && !finished.ok()) {
    failure = common::FromGrpcStatus(finished, "reading KV blocks from " + plan.source->address());
  }
  for (size_t i = 0; failure.ok() && i < received.size(); ++i) {
    if (received[i] != plan.slot_bytes) {
      failure =
          absl::DataLossError(absl::StrFormat("the source sent %d of slot %d's %d bytes",
                                              received[i], plan.source->slots(i), plan.slot_bytes));
    }
  }
  return failure;
}

}  // namespace

absl::StatusOr<loom::v1::FetchKvBlocksResponse> FetchKvBlocks(
    KvHostTier* tier, const loom::v1::FetchKvBlocksRequest& request,
    const grpc::ServerContext* caller) {
  if (tier == nullptr) {
    return absl::FailedPreconditionError("this worker has no host tier (--kv-offload-memory)");
  }
  if (request.sources_size() == 0 || request.dest_slots_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a fetch needs a source and destination slots, got %d sources and %d "
                        "slots",
                        request.sources_size(), request.dest_slots_size()));
  }
  absl::flat_hash_set<int32_t> distinct;
  for (const int32_t slot : request.dest_slots()) {
    if (slot < 0 || slot >= tier->num_slots() || !distinct.insert(slot).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "destination host slot %d is out of [0, %d) or named twice", slot, tier->num_slots()));
    }
  }
  LOOM_ASSIGN_OR_RETURN(const std::vector<SourcePlan> plans, PlanSources(*tier, request));
  const auto start = std::chrono::steady_clock::now();
  absl::Status failure;
  int64_t bytes = 0, shared_bytes = 0;
  for (const SourcePlan& plan : plans) {
    if (plan.heads.empty() && !plan.whole) continue;  // another source brings its heads
    auto channel = common::CreateClusterChannel(plan.source->address());
    auto stub = loom::v1::Worker::NewStub(channel);
    std::optional<absl::Status> mapped;
    if (!request.no_shared_memory()) mapped = FetchShared(*stub, tier, plan, request, caller);
    failure = mapped.has_value() ? *mapped : FetchStreamed(*stub, tier, plan, request, caller);
    // A read cut by the caller's cancellation reports it as such.
    if (!failure.ok() && caller != nullptr && caller->IsCancelled()) failure = CallerCancelled();
    if (!failure.ok()) break;
    const int64_t moved = static_cast<int64_t>(request.dest_slots_size()) * plan.slot_bytes;
    bytes += moved;
    if (mapped.has_value()) shared_bytes += moved;
  }
  // Mapped heads: the slots are whole once every source wrote its part.
  const KvWriteGuard guard = FetchGuard(request, caller);
  for (int i = 0; failure.ok() && i < request.dest_slots_size() && !plans.front().whole; ++i) {
    failure = tier->MarkWritten(request.dest_slots(i), 0, guard);
  }
  if (!failure.ok()) {
    // Nothing half-written may be read back as a block (unless the slots are no longer
    // this fetch's: the guard leaves other content alone).
    for (const int32_t slot : request.dest_slots()) {
      tier->WriteSlot(slot, 0, {}, guard).IgnoreError();
    }
    return failure;
  }
  loom::v1::FetchKvBlocksResponse response;
  response.set_bytes(bytes);
  response.set_seconds(SecondsSince(start));
  if (shared_bytes > 0) tier->RecordRemote(0, shared_bytes, 0, /*shared=*/true);
  tier->RecordRemote(0, bytes - shared_bytes, response.seconds());
  return response;
}

}  // namespace loom::worker
