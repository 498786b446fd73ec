#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "loom/v1/worker.grpc.pb.h"
#include "worker/kv_host_tier.h"
#include "worker/kv_slot_layout.h"

namespace loom::worker {

/// A KV push over TCP (disaggregated serving across machines or containers): one
/// WriteKvBlocks stream to a decode worker for one step. The forward pass's thread hands it
/// layers of blocks (Send copies them into the next message), and a thread of its own
/// writes the messages under gRPC's flow control, so the compute goes on while the bytes
/// travel. What waits to be written is bounded (`max_queued_bytes`): Send blocks while it
/// is full. Finish waits until the decode worker answered that every byte is in its slots.
/// Neither waits longer than `stall_timeout` (at most an hour) without the writer moving
/// on (a message written, the stream closed): then the stream is cancelled and fails, so
/// a decode worker that stopped reading or a link gone quiet costs the step that long
/// once, not a hang until the deadline.
///
/// Any failure (the decode worker gone or refusing, the deadline) is kept: Send and Finish
/// return it, and the destructor cancels a stream not finished. Used by one thread (the
/// step's), besides its own writer.
class KvPushStream {
 public:
  static constexpr int64_t kDefaultMaxQueuedBytes = int64_t{16} << 20;

  /// Opens the stream to `address`, whose tier's slots are `slot_bytes` each (the layout
  /// the writer computed for that rank); the whole stream must end by `deadline`.
  /// `writer_heads` (num_kv_heads > 0) where this worker holds other KV heads than that
  /// rank: each piece sent is then one layer as this worker's slots lay it out, mapped by
  /// the receiver.
  KvPushStream(const std::string& address, int64_t slot_bytes, absl::Time deadline,
               const KvSlotLayout& writer_heads = {},
               absl::Duration stall_timeout = absl::Seconds(5),
               int64_t max_queued_bytes = kDefaultMaxQueuedBytes);
  ~KvPushStream();
  KvPushStream(const KvPushStream&) = delete;
  KvPushStream& operator=(const KvPushStream&) = delete;

  /// Queues `bytes` for `offset` of host slot `slot` of the decode worker's tier, held there
  /// under `hold_id` (0: none named): the receiver drops them once that hold closed.
  absl::Status Send(int32_t slot, int64_t offset, absl::Span<const uint8_t> bytes,
                    uint64_t hold_id = 0);
  /// Writes what is queued, closes the stream and waits for the answer: OK once every byte
  /// sent is in the decode worker's slots.
  absl::Status Finish();

  const std::string& address() const { return address_; }
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  void Flush(std::unique_lock<std::mutex>& lock);  // the message being built, to the queue
  void WriteLoop();
  absl::Status Failed(const absl::Status& status);  // the failure with the address named

  const std::string address_;
  const int64_t slot_bytes_;
  const absl::Duration stall_timeout_;
  const int64_t max_queued_bytes_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<loom::v1::Worker::Stub> stub_;
  grpc::ClientContext context_;
  loom::v1::WriteKvBlocksResponse response_;

  std::mutex mu_;
  std::condition_variable changed_;
  loom::v1::KvBlockWrite empty_;     // a message before its pieces
  loom::v1::KvBlockWrite building_;  // the step thread's next message
  int64_t building_bytes_ = 0;
  std::deque<loom::v1::KvBlockWrite> queue_;  // guarded by mu_
  int64_t queued_bytes_ = 0;                  // guarded by mu_
  bool closing_ = false;                      // guarded by mu_: no more messages
  bool writer_done_ = false;                  // guarded by mu_: WriteLoop returned
  absl::Status failure_;                      // guarded by mu_
  uint64_t progress_ = 0;   // guarded by mu_: messages written, then the stream closed
  int64_t bytes_sent_ = 0;  // guarded by mu_
  bool finished_ = false;
  std::thread thread_;
};

/// The decode side of WriteKvBlocks: writes every message's pieces into `tier`'s slots
/// (which hold no block until a plan's kv_pushed_slots marks them), mapping the heads both
/// hold where the writer's differ. FAILED_PRECONDITION for a writer whose slot size
/// differs from the tier's (or no tier at all), INVALID_ARGUMENT for a piece outside the
/// tier or not one layer of the writer's heads.
/// Once the writer cancelled (`context`), or once a plan closed the hold a piece names
/// (KvHostTier::CloseHolds), nothing more is written (CANCELLED).
grpc::Status ReceiveKvBlocks(grpc::ServerContext* context, KvHostTier* tier,
                             grpc::ServerReader<loom::v1::KvBlockWrite>* reader,
                             loom::v1::WriteKvBlocksResponse* response);

}  // namespace loom::worker
