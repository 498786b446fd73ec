#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "gloo/rendezvous/store.h"
#include "model/communicator.h"

namespace loom::worker {

/// model::Communicator over NCCL for CUDA workers, one GPU per rank. The device
/// collectives (AllReduceSumOnDevice, AllGatherOnDevice) are ncclAllReduce/ncclAllGather
/// enqueued on the caller's stream with no host wait, so they run in stream order between
/// the CUDA device's kernels and may be captured into CUDA graphs (NCCL >= 2.9);
/// WaitOnDevice then waits for that stream under the timeout, polling NCCL's
/// asynchronous error. The host-span calls of model::Communicator stage through device
/// scratch on a stream of the communicator's own and wait the same way. A failure or a
/// timeout aborts the communicator (ncclCommAbort, which also stops its kernels on every
/// stream) so no rank hangs in a collective, and every later call fails at once.
///
/// Rank 0's NCCL unique id travels through the rendezvous store gloo uses (the
/// coordinator's). Built where the CUDA toolkit's nccl.h is present (elsewhere Connect
/// answers FailedPrecondition); the library itself is loaded at the first Connect
/// (worker/nccl_library), which answers FailedPrecondition "NCCL not found: ..." where it
/// cannot be loaded. Not thread-safe; any thread may call it (each call selects the
/// communicator's device).
class NcclCommunicator final : public model::Communicator {
 public:
  /// Joins the ranks of `world_size` on CUDA device `device` (an index after
  /// CUDA_VISIBLE_DEVICES; it becomes the calling thread's current device). Every rank
  /// calls it at about the same time; the init is non-blocking, so a rank that never comes
  /// becomes DeadlineExceeded after `timeout` (also every collective's limit).
  /// InvalidArgument for a rank outside [0, world_size); FailedPrecondition without NCCL
  /// or without that device.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(
      std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size, int device,
      std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  /// The CUDA device this rank runs on.
  int device() const;

  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status Broadcast(absl::Span<float> data, int root) override;
  absl::Status Barrier() override;

  bool has_device_collectives() const override { return true; }
  absl::Status AllReduceSumOnDevice(float* data, int64_t n, void* stream) override;
  absl::Status AllGatherOnDevice(const float* in, int64_t n, float* out, void* stream) override;
  absl::Status WaitOnDevice(void* stream) override;

 private:
  struct Impl;
  NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size);

  std::unique_ptr<Impl> impl_;
  int rank_;
  int world_size_;
};

}  // namespace loom::worker
