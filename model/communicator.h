#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace loom::model {

/// The collectives a tensor-parallel replica's ranks run between them (all-reduce after
/// the row-parallel projections, all-gather of vocabulary-parallel logits, broadcast of
/// rank 0's inputs, barriers). Implementations: gloo over TCP for CPU workers
/// (worker/gloo_communicator) and NCCL for CUDA workers (worker/nccl_communicator). Every
/// call runs under the communicator's timeout: a peer that died or stalls becomes
/// DeadlineExceeded or Unavailable, never a hang, and the communicator is then broken
/// (every later call fails at once; the worker reports it and the replica is rebuilt).
/// Calls are collective: every rank makes the same calls in the same order. Not
/// thread-safe.
///
/// The span calls take host memory and return once the collective is complete. A
/// communicator may also offer stream-ordered collectives on device memory
/// (has_device_collectives()): they are only enqueued on the caller's CUDA stream, never
/// wait on the host (so they may be captured into a CUDA graph), and their failures show
/// at the next WaitOnDevice of that stream.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  /// data <- the element-wise sum of every rank's data.
  virtual absl::Status AllReduceSum(absl::Span<float> data) = 0;
  /// out (world_size x in.size(), rank r's part at r * in.size()) <- every rank's in.
  virtual absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) = 0;
  /// data <- root's data.
  virtual absl::Status Broadcast(absl::Span<float> data, int root) = 0;
  virtual absl::Status Barrier() = 0;

  /// Whether the *OnDevice calls below are implemented (NCCL: yes; gloo: no).
  virtual bool has_device_collectives() const { return false; }
  /// Enqueues on `stream` (a cudaStream_t): data[0, n) (device memory) <- the element-wise
  /// sum over the ranks. Returns once enqueued, without waiting on the host (capture-safe);
  /// an error here means nothing usable was enqueued and the communicator is broken.
  virtual absl::Status AllReduceSumOnDevice(float* /*data*/, int64_t /*n*/,
                                            void* /*stream*/) {
    return absl::UnimplementedError("this communicator has no device collectives");
  }
  /// Enqueues on `stream`: out[r * n, (r + 1) * n) (device memory, world_size * n floats)
  /// <- rank r's in[0, n). Rank-major, as AllGather. Capture-safe as AllReduceSumOnDevice.
  virtual absl::Status AllGatherOnDevice(const float* /*in*/, int64_t /*n*/, float* /*out*/,
                                         void* /*stream*/) {
    return absl::UnimplementedError("this communicator has no device collectives");
  }
  /// Waits on the host until the work enqueued on `stream` so far is done, under the
  /// communicator's timeout, watching for the collectives' asynchronous errors: a peer
  /// that died or stalls becomes DeadlineExceeded or Unavailable (the communicator is
  /// aborted, so the stream's collectives stop and the stream drains) instead of a wait
  /// that never returns. Not to be called while `stream` is being captured.
  virtual absl::Status WaitOnDevice(void* /*stream*/) {
    return absl::UnimplementedError("this communicator has no device collectives");
  }
};

}  // namespace loom::model
