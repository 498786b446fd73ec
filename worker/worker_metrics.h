#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loom/v1/worker.pb.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/forward_pass.h"
#include "worker/kv_host_tier.h"

namespace loom::worker {

/// A worker's own Prometheus metrics (served on `--metrics-port`): step time, batch size
/// and tokens per step as histograms, steps and rejected steps, sequences held, its KV
/// pool size, and `loom_worker_up`. Every series carries replica, rank and backend
/// labels. Documented in docs/metrics.md. Thread-safe.
class WorkerMetrics {
 public:
  WorkerMetrics(const std::string& replica_id, int rank, const std::string& backend,
                int64_t num_kv_blocks);

  /// One step: its timings on the worker (wall time, forward pass, sampling), sequences
  /// and tokens it computed, and whether the plan was rejected.
  void RecordStep(const loom::v1::StepTimings& timings, int64_t sequences, int64_t tokens,
                  bool rejected);
  void SetSequences(int64_t sequences);
  /// The forward pass's counts so far (ForwardPassStats, cumulative): the counters move
  /// by what changed since the last call.
  void RecordForwardPassStats(const ForwardPassStats& stats);
  /// The host KV tier's size in blocks (a gauge; without a tier it stays 0).
  void SetHostTierCapacity(int64_t blocks);
  /// The host tier's counts so far (cumulative): the counters move by what changed, and a
  /// change in copy time is one observation of the transfer histogram (one plan's copies).
  void RecordKvTransfers(const KvTransferStats& stats);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* step_seconds_;
  prometheus::Histogram* batch_size_;
  prometheus::Histogram* tokens_per_step_;
  prometheus::Counter* steps_;
  prometheus::Counter* execute_seconds_;
  prometheus::Counter* sample_seconds_;
  prometheus::Counter* rejected_steps_;
  prometheus::Gauge* sequences_;
  prometheus::Counter* eager_steps_;
  prometheus::Counter* pipeline_wait_;
  prometheus::Counter* graph_captures_;
  prometheus::Counter* graph_replays_;
  prometheus::Counter* graph_capture_failures_;
  prometheus::Gauge* host_tier_capacity_;
  prometheus::Counter* blocks_to_host_;
  prometheus::Counter* blocks_to_device_;
  prometheus::Counter* bytes_to_host_;
  prometheus::Counter* bytes_to_device_;
  prometheus::Counter* bytes_to_peer_;
  prometheus::Counter* bytes_from_peer_;
  prometheus::Counter* bytes_from_peer_shared_;
  prometheus::Counter* fetch_seconds_;
  prometheus::Histogram* transfer_seconds_;
  ForwardPassStats recorded_;  // what RecordForwardPassStats has counted
  KvTransferStats recorded_transfers_;
};

}  // namespace loom::worker
