#include "worker/kv_push_stream.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cluster_secret.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "worker/kv_transfer.h"

namespace loom::worker {
namespace {

#ifdef NDEBUG
constexpr bool kChecksumPieces = false;
#else
constexpr bool kChecksumPieces = true;  // each piece's bytes, checked by the receiver
#endif

// DataLoss unless `piece` (its checksum set) arrived as sent.
absl::Status CheckPiece(const loom::v1::KvSlotWrite& piece) {
  if (piece.checksum() == 0) return absl::OkStatus();
  const auto data = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(piece.data().data()),
                                        piece.data().size());
  if (KvSlotChecksum(data) == piece.checksum()) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrFormat("the %d bytes pushed for slot %d at %d do not match their checksum",
                      piece.data().size(), piece.slot(), piece.offset()));
}

// One channel per decode worker, kept between steps: a step's stream then reuses the
// connection instead of opening one (a handshake per step and rank).
std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* channels = new std::map<std::string, std::shared_ptr<grpc::Channel>>();
  constexpr size_t kMaxChannels = 64;
  absl::MutexLock lock(&mu);
  auto found = channels->find(address);
  if (found != channels->end()) return found->second;
  if (channels->size() >= kMaxChannels) channels->clear();  // decode workers come and go
  grpc::ChannelArguments arguments;
  arguments.SetMaxSendMessageSize(-1);
  auto channel = common::CreateClusterChannel(address, arguments);
  channels->emplace(address, channel);
  return channel;
}

// The pieces of `message`, each the slot's own bytes, while `wanted` and each piece's hold
// is open.
absl::Status WriteSlotBytes(KvHostTier* tier, const loom::v1::KvBlockWrite& message,
                            const std::function<bool()>& wanted) {
  for (const loom::v1::KvSlotWrite& piece : message.writes()) {
    LOOM_RETURN_IF_ERROR(CheckPiece(piece));
    LOOM_RETURN_IF_ERROR(
        tier->WriteSlot(piece.slot(), piece.offset(),
                        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(piece.data().data()),
                                            piece.data().size()),
                        {piece.hold_id(), wanted}));
  }
  return absl::OkStatus();
}

// The pieces of `message`, each one layer of the writer's heads: the heads the tier holds
// too are copied into their places, while `wanted` and each piece's hold is open.
absl::Status WriteMappedHeads(KvHostTier* tier, const loom::v1::KvBlockWrite& message,
                              const std::function<bool()>& wanted) {
  KvSlotLayout mine = tier->layout();
  if (!mine.known()) {
    return absl::FailedPreconditionError("this worker's host tier does not know its KV heads");
  }
  mine.num_layers = 1;
  const KvSlotLayout writer = mine.WithHeads(message.kv_head_begin(), message.num_kv_heads());
  std::vector<int64_t> heads;
  if (writer.kv_head_begin >= 0) {
    for (int64_t head = std::max(writer.kv_head_begin, mine.kv_head_begin);
         head < std::min(writer.kv_head_begin + writer.num_kv_heads,
                         mine.kv_head_begin + mine.num_kv_heads);
         ++head) {
      heads.push_back(head);
    }
  }
  if (heads.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the writer's KV heads [%d, +%d) are none of this worker's [%d, +%d)", writer.kv_head_begin,
        writer.num_kv_heads, mine.kv_head_begin, mine.num_kv_heads));
  }
  const int64_t layer_bytes = mine.slot_bytes();
  for (const loom::v1::KvSlotWrite& piece : message.writes()) {
    if (static_cast<int64_t>(piece.data().size()) != writer.slot_bytes() || piece.offset() < 0 ||
        piece.offset() % layer_bytes != 0 || piece.offset() > tier->slot_bytes() - layer_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a piece of %d bytes at %d is not one layer of the writer's heads (%d bytes) at a "
          "layer of a %d-byte slot",
          piece.data().size(), piece.offset(), writer.slot_bytes(), tier->slot_bytes()));
    }
    LOOM_RETURN_IF_ERROR(CheckPiece(piece));
    const auto from = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(piece.data().data()),
                                          piece.data().size());
    LOOM_RETURN_IF_ERROR(tier->WriteSlotWith(
        piece.slot(),
        [&](absl::Span<uint8_t> slot) {
          if (slot.empty()) return;  // bookkeeping only
          CopyKvHeads(
              writer, from, mine,
              slot.subspan(static_cast<size_t>(piece.offset()), static_cast<size_t>(layer_bytes)),
              heads);
        },
        {piece.hold_id(), wanted}));
  }
  return absl::OkStatus();
}

}  // namespace

KvPushStream::KvPushStream(const std::string& address, int64_t slot_bytes, absl::Time deadline,
                           const KvSlotLayout& writer_heads, absl::Duration stall_timeout,
                           int64_t max_queued_bytes)
    : address_(address),
      slot_bytes_(slot_bytes),
      stall_timeout_(std::min(stall_timeout, absl::Hours(1))),
      max_queued_bytes_(std::max(max_queued_bytes, kKvChunkBytes)),
      channel_(ChannelTo(address)),
      stub_(loom::v1::Worker::NewStub(channel_)) {
  context_.set_deadline(absl::ToChronoTime(deadline));
  empty_.set_slot_bytes(slot_bytes_);
  if (writer_heads.num_kv_heads > 0) {
    empty_.set_kv_head_begin(static_cast<int32_t>(writer_heads.kv_head_begin));
    empty_.set_num_kv_heads(static_cast<int32_t>(writer_heads.num_kv_heads));
  }
  building_ = empty_;
  thread_ = std::thread([this] { WriteLoop(); });
}

KvPushStream::~KvPushStream() {
  if (!finished_) {
    context_.TryCancel();
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    changed_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status KvPushStream::Failed(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrFormat("pushing KV to the decode worker at %s: %s",
                                                     address_, status.message()));
}

void KvPushStream::WriteLoop() {
  // The call starts here, not on the step's thread: connecting may take a while.
  std::unique_ptr<grpc::ClientWriter<loom::v1::KvBlockWrite>> writer =
      stub_->WriteKvBlocks(&context_, &response_);
  bool broken = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [this] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) break;  // closing, everything written
    loom::v1::KvBlockWrite message = std::move(queue_.front());
    queue_.pop_front();
    const int64_t bytes = static_cast<int64_t>(message.ByteSizeLong());
    lock.unlock();
    const bool written = writer->Write(message);
    lock.lock();
    queued_bytes_ -= bytes;
    ++progress_;
    changed_.notify_all();
    if (!written) {
      broken = true;
      break;
    }
  }
  lock.unlock();
  if (!broken) writer->WritesDone();
  lock.lock();
  ++progress_;  // Finish waits for the answer from here
  changed_.notify_all();
  lock.unlock();
  grpc::Status status = writer->Finish();
  lock.lock();
  if (failure_.ok()) {
    if (!status.ok()) {
      failure_ = common::FromGrpcStatus(status);
    } else if (broken) {
      failure_ = absl::UnavailableError("the stream broke");
    } else if (response_.bytes_written() != bytes_sent_) {
      failure_ = absl::DataLossError(
          absl::StrFormat("%d of %d bytes arrived", response_.bytes_written(), bytes_sent_));
    }
  }
  queue_.clear();
  queued_bytes_ = 0;
  writer_done_ = true;
  changed_.notify_all();
}

void KvPushStream::Flush(std::unique_lock<std::mutex>& lock) {
  if (building_.writes_size() == 0) return;
  const int64_t bytes = static_cast<int64_t>(building_.ByteSizeLong());
  const bool room = changed_.wait_for(lock, absl::ToChronoNanoseconds(stall_timeout_), [&] {
    return !failure_.ok() || writer_done_ || queued_bytes_ + bytes <= max_queued_bytes_ ||
           queued_bytes_ == 0;
  });
  if (!failure_.ok() || writer_done_) return;
  if (!room) {
    failure_ = absl::DeadlineExceededError(
        absl::StrFormat("%d bytes waited more than %s to be accepted", queued_bytes_,
                        absl::FormatDuration(stall_timeout_)));
    context_.TryCancel();
    return;
  }
  queued_bytes_ += bytes;
  queue_.push_back(std::move(building_));
  building_ = empty_;
  building_bytes_ = 0;
  changed_.notify_all();
}

absl::Status KvPushStream::Send(int32_t slot, int64_t offset, absl::Span<const uint8_t> bytes,
                                uint64_t hold_id) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!failure_.ok()) return Failed(failure_);
  if (writer_done_ || closing_) return Failed(absl::FailedPreconditionError("the stream ended"));
  loom::v1::KvSlotWrite* piece = building_.add_writes();
  piece->set_slot(slot);
  piece->set_offset(offset);
  piece->set_data(bytes.data(), bytes.size());
  piece->set_hold_id(hold_id);
  if (kChecksumPieces) piece->set_checksum(KvSlotChecksum(bytes));
  building_bytes_ += static_cast<int64_t>(bytes.size());
  bytes_sent_ += static_cast<int64_t>(bytes.size());
  if (building_bytes_ >= kKvChunkBytes) Flush(lock);
  return failure_.ok() ? absl::OkStatus() : Failed(failure_);
}

absl::Status KvPushStream::Finish() {
  if (finished_) return absl::FailedPreconditionError("the push stream was finished already");
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (failure_.ok() && !writer_done_) Flush(lock);
    closing_ = true;
    changed_.notify_all();
    // The writer may block in a write, in connecting or in waiting for the answer (a decode
    // worker stopped, or a link gone quiet): each step of it must come within the stall
    // timeout, else the stream is cancelled, not waited for until its deadline.
    uint64_t seen = progress_;
    while (!writer_done_) {
      if (!changed_.wait_for(lock, absl::ToChronoNanoseconds(stall_timeout_),
                             [&] { return writer_done_ || progress_ != seen; })) {
        if (failure_.ok()) {
          failure_ = absl::DeadlineExceededError(
              absl::StrFormat("no progress for %s (%d bytes waiting)",
                              absl::FormatDuration(stall_timeout_), queued_bytes_));
        }
        context_.TryCancel();
        break;
      }
      seen = progress_;
    }
  }
  thread_.join();
  finished_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  return failure_.ok() ? absl::OkStatus() : Failed(failure_);
}

grpc::Status ReceiveKvBlocks(grpc::ServerContext* context, KvHostTier* tier,
                             grpc::ServerReader<loom::v1::KvBlockWrite>* reader,
                             loom::v1::WriteKvBlocksResponse* response) {
  if (tier == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this worker has no host KV tier");
  }
  // A writer that gave up (its step failed the push) may have the slots named to another
  // transfer soon: nothing of its stream is written once it cancelled, or once a plan
  // closed the hold the slots were held under (the coordinator gave them back).
  const std::function<bool()> wanted = [context] { return !context->IsCancelled(); };
  int64_t bytes = 0;
  loom::v1::KvBlockWrite message;
  while (reader->Read(&message)) {
    if (context->IsCancelled()) break;
    if (message.slot_bytes() != tier->slot_bytes()) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrFormat("pushed slots of %d bytes into a tier of %d-byte slots (another model, "
                          "tensor-parallel slice or KV dtype)",
                          message.slot_bytes(), tier->slot_bytes()));
    }
    absl::Status written = message.num_kv_heads() > 0 ? WriteMappedHeads(tier, message, wanted)
                                                      : WriteSlotBytes(tier, message, wanted);
    if (!written.ok()) {
      return common::ToGrpcStatus(written);
    }
    for (const loom::v1::KvSlotWrite& piece : message.writes()) {
      bytes += static_cast<int64_t>(piece.data().size());
    }
  }
  if (context->IsCancelled())
    return grpc::Status(grpc::StatusCode::CANCELLED, "the writer gave up");
  // No time counted: the stream lasts the writer's step, mostly waiting for its compute.
  tier->RecordRemote(/*bytes_served=*/0, /*bytes_fetched=*/bytes, /*seconds=*/0);
  response->set_bytes_written(bytes);
  return grpc::Status::OK;
}

}  // namespace loom::worker
