#include "worker/kv_transfer.h"

#include <fcntl.h>
#include <sys/mman.h>
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

namespace loom::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// This machine's boot id: two processes that read the same one share /proc and memory.
const std::string& BootId() {
  static const std::string* id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    auto* text = new std::string;
    std::getline(in, *text);
    return text;
  }();
  return *id;
}

// Copies the source slots out of the serving worker's mapped tier; an error when the map
// cannot be opened (another machine or container, other permissions): then TCP.
absl::Status CopyShared(KvHostTier* tier, const loom::v1::SharedKvMemory& shared,
                        const loom::v1::FetchKvBlocksRequest& request) {
  if (shared.boot_id().empty() || shared.boot_id() != BootId()) {
    return absl::UnavailableError("the source runs on another machine");
  }
  const std::string path = absl::StrFormat("/proc/%d/fd/%d", shared.pid(), shared.fd());
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrFormat("cannot open %s", path));
  void* mapped = mmap(nullptr, static_cast<size_t>(shared.size()), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (mapped == MAP_FAILED) return absl::UnavailableError(absl::StrFormat("cannot map %s", path));
  const auto* source = static_cast<const uint8_t*>(mapped);
  absl::Status status;
  for (int i = 0; status.ok() && i < request.source_slots_size(); ++i) {
    const int64_t offset = static_cast<int64_t>(request.source_slots(i)) * tier->slot_bytes();
    if (offset < 0 || offset + tier->slot_bytes() > shared.size()) {
      status = absl::InvalidArgumentError(
          absl::StrFormat("source slot %d is outside the source's tier", request.source_slots(i)));
      break;
    }
    status = tier->WriteSlot(
        request.dest_slots(i), 0,
        absl::MakeConstSpan(source + offset, static_cast<size_t>(tier->slot_bytes())));
    if (status.ok()) status = tier->MarkWritten(request.dest_slots(i), 0);
  }
  munmap(mapped, static_cast<size_t>(shared.size()));
  return status;
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrFormat("%s: %s", what, status.error_message()));
}

}  // namespace

grpc::Status ServeKvBlocks(grpc::ServerContext* context, const KvHostTier* tier,
                           const loom::v1::ReadKvBlocksRequest& request,
                           grpc::ServerWriter<loom::v1::KvBlockChunk>* writer,
                           const std::function<bool(uint64_t)>& executed) {
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
  while (request.after_step_id() > 0 && !executed(request.after_step_id())) {
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    }
    if (std::chrono::system_clock::now() > context->deadline()) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrFormat("step %d, which offloads the blocks, did not run in time",
                                          request.after_step_id()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
        return grpc::Status(static_cast<grpc::StatusCode>(read.code()),
                            std::string(read.message()));
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

// Opens a ReadKvBlocks stream for `request`'s source slots, with its deadline.
std::unique_ptr<grpc::ClientReader<loom::v1::KvBlockChunk>> StartRead(
    loom::v1::Worker::Stub& stub, grpc::ClientContext& context, const KvHostTier* tier,
    const loom::v1::FetchKvBlocksRequest& request, bool offer_shared_memory) {
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(request.timeout_ms() > 0 ? request.timeout_ms() : 30000));
  loom::v1::ReadKvBlocksRequest read;
  read.mutable_host_slots()->CopyFrom(request.source_slots());
  read.set_after_step_id(request.after_step_id());
  read.set_slot_bytes(tier->slot_bytes());
  read.set_offer_shared_memory(offer_shared_memory);
  return stub.ReadKvBlocks(&context, read);
}

// The same machine: maps the source's tier instead of streaming its bytes. nullopt when
// the bytes must be streamed instead (the source has no shared tier, or it cannot be
// mapped from here).
std::optional<absl::StatusOr<loom::v1::FetchKvBlocksResponse>> FetchShared(
    loom::v1::Worker::Stub& stub, KvHostTier* tier, const loom::v1::FetchKvBlocksRequest& request,
    std::chrono::steady_clock::time_point start) {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<loom::v1::KvBlockChunk>> reader =
      StartRead(stub, context, tier, request, /*offer_shared_memory=*/true);
  loom::v1::KvBlockChunk first;
  if (!reader->Read(&first)) {
    const grpc::Status finished = reader->Finish();
    if (finished.ok()) return std::nullopt;
    return FromGrpc(finished, "reading KV blocks from " + request.source_address());
  }
  if (!first.has_shared()) {
    // A source without a shared tier started streaming bytes: ask again for the stream.
    context.TryCancel();
    reader->Finish().ok();
    return std::nullopt;
  }
  const grpc::Status finished = reader->Finish();
  const absl::Status copied = finished.ok() ? CopyShared(tier, first.shared(), request)
                                            : FromGrpc(finished, "reading KV blocks");
  if (copied.ok()) {
    loom::v1::FetchKvBlocksResponse response;
    response.set_bytes(static_cast<int64_t>(request.dest_slots_size()) * tier->slot_bytes());
    response.set_seconds(SecondsSince(start));
    tier->RecordRemote(0, response.bytes(), response.seconds(), /*shared=*/true);
    return response;
  }
  for (const int32_t slot : request.dest_slots()) tier->WriteSlot(slot, 0, {}).IgnoreError();
  // Not mappable from here: stream the bytes (the step wait has passed already).
  if (copied.code() == absl::StatusCode::kUnavailable) return std::nullopt;
  return copied;
}

}  // namespace

absl::StatusOr<loom::v1::FetchKvBlocksResponse> FetchKvBlocks(
    KvHostTier* tier, const loom::v1::FetchKvBlocksRequest& request) {
  if (tier == nullptr) {
    return absl::FailedPreconditionError("this worker has no host tier (--kv-offload-memory)");
  }
  if (request.source_slots_size() != request.dest_slots_size() || request.dest_slots_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a fetch needs one destination slot per source slot, got %d and %d",
                        request.source_slots_size(), request.dest_slots_size()));
  }
  absl::flat_hash_set<int32_t> distinct;
  for (const int32_t slot : request.dest_slots()) {
    if (slot < 0 || slot >= tier->num_slots() || !distinct.insert(slot).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "destination host slot %d is out of [0, %d) or named twice", slot, tier->num_slots()));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  auto channel = grpc::CreateChannel(request.source_address(), grpc::InsecureChannelCredentials());
  auto stub = loom::v1::Worker::NewStub(channel);
  if (!request.no_shared_memory()) {
    std::optional<absl::StatusOr<loom::v1::FetchKvBlocksResponse>> mapped =
        FetchShared(*stub, tier, request, start);
    if (mapped.has_value()) return *std::move(mapped);
  }
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<loom::v1::KvBlockChunk>> reader =
      StartRead(*stub, context, tier, request, /*offer_shared_memory=*/false);
  std::vector<int64_t> received(static_cast<size_t>(request.dest_slots_size()), 0);
  absl::Status failure;
  loom::v1::KvBlockChunk chunk;
  while (failure.ok() && reader->Read(&chunk)) {
    if (chunk.index() < 0 || chunk.index() >= request.dest_slots_size() ||
        chunk.offset() != received[static_cast<size_t>(chunk.index())]) {
      failure = absl::DataLossError(absl::StrFormat(
          "the source sent chunk %d at offset %d out of order", chunk.index(), chunk.offset()));
      break;
    }
    const int32_t slot = request.dest_slots(chunk.index());
    failure =
        tier->WriteSlot(slot, chunk.offset(),
                        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(chunk.data().data()),
                                            chunk.data().size()));
    received[static_cast<size_t>(chunk.index())] += static_cast<int64_t>(chunk.data().size());
    if (failure.ok() && received[static_cast<size_t>(chunk.index())] == tier->slot_bytes()) {
      failure = tier->MarkWritten(slot, chunk.checksum());
    }
  }
  if (!failure.ok()) context.TryCancel();
  const grpc::Status finished = reader->Finish();
  if (failure.ok() && !finished.ok()) {
    failure = FromGrpc(finished, "reading KV blocks from " + request.source_address());
  }
  for (size_t i = 0; failure.ok() && i < received.size(); ++i) {
    if (received[i] != tier->slot_bytes()) {
      failure = absl::DataLossError(absl::StrFormat("the source sent %d of slot %d's %d bytes",
                                                    received[i], request.source_slots(i),
                                                    tier->slot_bytes()));
    }
  }
  if (!failure.ok()) {
    // Nothing half-written may be read back as a block.
    for (const int32_t slot : request.dest_slots()) tier->WriteSlot(slot, 0, {}).IgnoreError();
    return failure;
  }
  loom::v1::FetchKvBlocksResponse response;
  response.set_bytes(static_cast<int64_t>(request.dest_slots_size()) * tier->slot_bytes());
  response.set_seconds(SecondsSince(start));
  tier->RecordRemote(0, response.bytes(), response.seconds());
  return response;
}

}  // namespace loom::worker
