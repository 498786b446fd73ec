#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace loom::worker {

/// A worker's own Prometheus metrics (served on `--metrics-port`): step time, batch size
/// and tokens per step as histograms, steps and rejected steps, sequences held, its KV
/// pool size, and `loom_worker_up`. Every series carries replica, rank and backend
/// labels. Documented in docs/metrics.md. Thread-safe.
class WorkerMetrics {
 public:
  WorkerMetrics(const std::string& replica_id, int rank, const std::string& backend,
                int64_t num_kv_blocks);

  /// One step: its wall time on the worker, sequences and tokens it computed, and
  /// whether the plan was rejected.
  void RecordStep(double seconds, int64_t sequences, int64_t tokens, bool rejected);
  void SetSequences(int64_t sequences);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* step_seconds_;
  prometheus::Histogram* batch_size_;
  prometheus::Histogram* tokens_per_step_;
  prometheus::Counter* steps_;
  prometheus::Counter* rejected_steps_;
  prometheus::Gauge* sequences_;
};

}  // namespace loom::worker
