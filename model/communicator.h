#pragma once

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace loom::model {

/// The collectives a tensor-parallel replica's ranks run between them (all-reduce after
/// the row-parallel projections, all-gather of vocabulary-parallel logits, broadcast of
/// rank 0's inputs, barriers). Implementations: gloo over TCP for CPU workers (and NCCL
/// for CUDA workers, with the CUDA backend). Every call runs under the communicator's
/// timeout: a peer that died or stalls becomes DeadlineExceeded or Unavailable, never a
/// hang, and the communicator is then broken (every later call fails at once; the worker
/// reports it and the replica is rebuilt). Calls are collective: every rank makes the
/// same calls in the same order. Not thread-safe.
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
};

}  // namespace loom::model
