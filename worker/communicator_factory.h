#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/communicator.h"
#include "worker/pipeline_link.h"

namespace loom::worker {

/// Who a tensor-parallel rank is and how it meets the other ranks of its replica.
struct CommunicatorOptions {
  std::string coordinator_address;  // HOST:PORT of the coordinator (the rendezvous store)
  // Keys of one replica incarnation: every rank of one start of `replica_id` passes the same
  // `rendezvous_id`, a restarted group a new one.
  std::string replica_id;
  std::string rendezvous_id;
  int rank = 0;        // in [0, world_size)
  int world_size = 2;  // > 1
  // The rendezvous and, afterwards, every collective: a dead peer fails a call after this.
  std::chrono::milliseconds timeout{300000};
  bool cuda = false;  // NCCL on CUDA device `gpu_index`; else gloo over TCP
  int gpu_index = 0;
  std::string hostname = "127.0.0.1";  // gloo: the address the other ranks reach this one at
};

/// Joins rank `options.rank` to the other ranks of its replica through the coordinator's
/// rendezvous store: NCCL (its unique id through the store) on CUDA, gloo on the CPU. Blocks
/// until every rank arrived or the timeout passed (DeadlineExceeded); FailedPrecondition
/// where NCCL is not found.
absl::StatusOr<std::unique_ptr<model::Communicator>> ConnectCommunicator(
    const CommunicatorOptions& options);

/// Joins pipeline stage `options.rank` of `options.world_size` to the other stages of its
/// column through the same store (keys under `pp/`), over gloo TCP. Blocks like
/// ConnectCommunicator; `cuda` must be false (stages exchange host memory).
absl::StatusOr<std::unique_ptr<PipelineLink>> ConnectPipelineLink(
    const CommunicatorOptions& options);

}  // namespace loom::worker
