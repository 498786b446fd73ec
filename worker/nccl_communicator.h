#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "gloo/rendezvous/store.h"
#include "model/communicator.h"

namespace loom::worker {

/// model::Communicator over NCCL for CUDA workers: the spans are device memory (the CUDA
/// backend's activations), collectives are enqueued on `stream` (a cudaStream_t) and each
/// call waits for its completion under the timeout, polling NCCL's asynchronous error; a
/// failure or timeout aborts the communicator (ncclCommAbort) so no rank hangs in a
/// collective, and every later call fails at once. Rank 0's NCCL unique id travels through
/// the same rendezvous store gloo uses (the coordinator's). Built where the CUDA toolkit's
/// nccl.h is present (elsewhere Connect answers Unimplemented); the library itself is
/// loaded at the first Connect (worker/nccl_library), which answers FailedPrecondition
/// "NCCL not found: ..." where it cannot be loaded. One GPU per rank;
/// multi-GPU runs are not available in this project's environment (the code path for world
/// size 1 is the same).
class NcclCommunicator final : public model::Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(
      std::shared_ptr<gloo::rendezvous::Store> store, int rank, int world_size, int device,
      void* stream, std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status Broadcast(absl::Span<float> data, int root) override;
  absl::Status Barrier() override;

 private:
  struct Impl;
  NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size);

  std::unique_ptr<Impl> impl_;
  int rank_;
  int world_size_;
};

}  // namespace loom::worker
