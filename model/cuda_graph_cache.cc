#include "model/cuda_graph_cache.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "absl/status/statusor.h"
#include "common/status_macros.h"

namespace loom::model {

int64_t GraphBatchBucket(int64_t num_seqs) {
  for (int64_t bucket : kGraphBatchBuckets) {
    if (num_seqs <= bucket) return bucket;
  }
  return 0;
}

int64_t ContextBucket(int64_t max_context_len) {
  const uint64_t bucket =
      std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(max_context_len, 1)));
  return std::clamp<int64_t>(static_cast<int64_t>(std::min<uint64_t>(bucket, uint64_t{1} << 30)),
                             kMinContextBucket, int64_t{1} << 30);
}

absl::Status CudaGraphCache::Run(absl::FunctionRef<absl::Status()> forward, bool graphed, Key key) {
  if (!graphed || uncapturable_.contains(key)) {
    ++stats_.eager_steps;
    return forward();
  }
  auto found = graphs_.find(key);
  if (found != graphs_.end() && found->second->generation() != device_->memory_generation()) {
    // Memory moved since (a larger step grew a buffer): every graph names freed memory.
    graphs_.clear();
    found = graphs_.end();
  }
  if (found != graphs_.end()) {
    LOOM_RETURN_IF_ERROR(device_->Replay(*found->second));
    ++stats_.graph_replays;
    return absl::OkStatus();
  }
  if (!warmed_.contains(key)) {
    LOOM_RETURN_IF_ERROR(forward());
    warmed_.insert(key);
    ++stats_.eager_steps;
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<CudaGraph>> captured =
      fail_captures_ ? absl::InternalError("capture refused (debug_fail_graph_captures)")
                     : device_->Capture(forward);
  if (!captured.ok()) {
    // The stream left capture mode and nothing ran: the step runs eagerly, and so does
    // every later step of this key. A tensor-parallel rank thus still makes each
    // collective exactly once, as its peers do, whether they replay or not.
    ++stats_.graph_capture_failures;
    std::fprintf(stderr,
                 "loom-worker: CUDA graph capture of decode bucket (%lld sequences, context "
                 "%lld) failed, running it eagerly from now on: %s\n",
                 static_cast<long long>(key.first), static_cast<long long>(key.second),
                 captured.status().ToString().c_str());
    uncapturable_.insert(key);
    ++stats_.eager_steps;
    return forward();
  }
  ++stats_.graph_captures;
  LOOM_RETURN_IF_ERROR(device_->Replay(**captured));
  ++stats_.graph_replays;
  graphs_[key] = *std::move(captured);
  return absl::OkStatus();
}

}  // namespace loom::model
