#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "model/cuda_device.h"

namespace loom::model {

/// Decode steps up to 256 sequences are padded to the next bucket and replayed from a graph.
inline constexpr int64_t kGraphBatchBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
inline constexpr int64_t kMaxGraphBatch = 256;
/// Graphs are also keyed by the context bucket (a power of two, at least this): the split
/// count of the decode kernel is baked into a graph and depends on the context length.
inline constexpr int64_t kMinContextBucket = 256;

/// The smallest of kGraphBatchBuckets that holds `num_seqs` sequences; 0 above the largest.
int64_t GraphBatchBucket(int64_t num_seqs);

/// A power of two >= max_context_len, at least kMinContextBucket; capped at 2^30 (the
/// kernel attends a longer sequence in full anyway: its last split runs longer).
int64_t ContextBucket(int64_t max_context_len);

/// How the forward passes CudaGraphCache::Run was given ran so far.
struct CudaGraphStats {
  int64_t eager_steps = 0;             // every step not replayed from a graph
  int64_t graph_captures = 0;          // graphs captured (a bucket's second decode step)
  int64_t graph_replays = 0;           // steps run by replaying a captured graph
  int64_t graph_capture_failures = 0;  // captures that failed; their steps ran eagerly
};

/// Decode graphs on a CudaDevice by (batch bucket, context bucket). A key is captured the
/// second time it is seen (the first runs eagerly: that grows every buffer the shape needs
/// and loads lazily loaded kernels, both outside capture). A graph whose memory generation
/// is no longer the device's drops them all. A key whose capture failed runs eagerly from
/// then on. Destroy it before the device whose stream its graphs ran on. Not thread-safe.
class CudaGraphCache {
 public:
  using Key = std::pair<int64_t, int64_t>;  // (batch bucket, context bucket)

  /// `device` is not owned and outlives the cache. `fail_captures`: every capture fails, as
  /// a driver refusal would (tests of the eager fallback).
  CudaGraphCache(CudaDevice* device, bool fail_captures)
      : device_(device), fail_captures_(fail_captures) {}

  /// Runs `forward` (the step's Device calls) on the device's stream: replayed from the
  /// key's graph, captured (the key's second step) or enqueued eagerly; always eagerly when
  /// `graphed` is false.
  absl::Status Run(absl::FunctionRef<absl::Status()> forward, bool graphed, Key key);

  const CudaGraphStats& stats() const { return stats_; }

 private:
  CudaDevice* device_;  // every capture and replay goes to its stream
  bool fail_captures_;
  std::map<Key, std::unique_ptr<CudaGraph>> graphs_;
  std::set<Key> warmed_;
  std::set<Key> uncapturable_;  // keys whose capture failed
  CudaGraphStats stats_;
};

}  // namespace loom::model
