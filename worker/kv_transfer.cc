#include "worker/kv_transfer.h"

#include <algorithm>
#include <chrono>
#include <memory>
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
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(request.timeout_ms() > 0 ? request.timeout_ms() : 30000));
  loom::v1::ReadKvBlocksRequest read;
  read.mutable_host_slots()->CopyFrom(request.source_slots());
  read.set_after_step_id(request.after_step_id());
  read.set_slot_bytes(tier->slot_bytes());
  std::unique_ptr<grpc::ClientReader<loom::v1::KvBlockChunk>> reader =
      stub->ReadKvBlocks(&context, read);
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
