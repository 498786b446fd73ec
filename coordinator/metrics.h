#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "loom/v1/inference.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace loom::coordinator {

/// What one finished request reports to the metrics (durations in seconds; negative when
/// the request never reached that point, e.g. no token before an abort).
struct RequestRecord {
  std::string replica_id;                  // where it ran last ("" if never placed)
  loom::v1::FinishReason finish_reason = loom::v1::FINISH_REASON_UNSPECIFIED;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t num_speculative_steps = 0;  // steps that verified drafts (possibly none found)
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  double queue_seconds = -1;    // arrival to first scheduled
  double ttft_seconds = -1;     // arrival to first token
  double prefill_seconds = -1;  // first scheduled to first token
  double decode_seconds = -1;   // first token to last token
  double e2e_seconds = -1;      // arrival to finish
};

/// The coordinator's Prometheus metrics, named after vLLM's (`vllm:x` is `loom_x`: no
/// colons, base units, `_total` on counters) with the same semantics and histogram
/// buckets, so dashboards, KEDA autoscalers and inference gateways built for vLLM work
/// with a rename. Every series carries `model_name`; per-replica series carry `replica`.
/// Documented in docs/metrics.md. Thread-safe (prometheus-cpp metrics are atomic).
class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(std::string model_name);

  /// A finished request: counters and latency histograms.
  void RecordRequest(const RequestRecord& record);
  /// One inter-token gap of a running request.
  void RecordInterTokenLatency(double seconds);
  /// Prefix-cache lookups at admission: prompt tokens queried and found cached.
  void RecordPrefixCacheQuery(const std::string& replica_id, int64_t queried, int64_t hits);
  /// Speculative decoding: steps that proposed drafts, tokens drafted and accepted.
  void RecordSpeculation(int64_t drafts, int64_t drafted, int64_t accepted);

  /// Gauges (running, waiting, KV usage, preemptions...) from a cluster snapshot; called
  /// just before each scrape, so nothing in the step loop touches them.
  void UpdateFromClusterState(const loom::v1::ClusterState& state);

  /// The text exposition format (version 0.0.4) of every metric.
  std::string Serialize() const;
  prometheus::Registry& registry() { return *registry_; }

 private:
  prometheus::Labels Model() const { return {{"model_name", model_name_}}; }
  prometheus::Labels Replica(const std::string& replica_id) const {
    return {{"model_name", model_name_}, {"replica", replica_id}};
  }

  std::string model_name_;
  std::shared_ptr<prometheus::Registry> registry_;
  // Per replica, from ClusterState.
  prometheus::Family<prometheus::Gauge>& requests_running_;
  prometheus::Family<prometheus::Gauge>& requests_waiting_;
  prometheus::Family<prometheus::Gauge>& kv_cache_usage_;
  prometheus::Family<prometheus::Gauge>& replica_up_;
  prometheus::Family<prometheus::Gauge>& kv_blocks_free_;
  prometheus::Family<prometheus::Gauge>& kv_blocks_total_;
  prometheus::Family<prometheus::Counter>& preemptions_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& step_tokens_;
  // Per request.
  prometheus::Family<prometheus::Counter>& prefix_queries_;
  prometheus::Family<prometheus::Counter>& prefix_hits_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_;
  prometheus::Family<prometheus::Counter>& generation_tokens_;
  prometheus::Family<prometheus::Counter>& request_success_;
  prometheus::Family<prometheus::Counter>& spec_drafts_;
  prometheus::Family<prometheus::Counter>& spec_drafted_;
  prometheus::Family<prometheus::Counter>& spec_accepted_;
  prometheus::Family<prometheus::Histogram>& ttft_;
  prometheus::Family<prometheus::Histogram>& itl_;
  prometheus::Histogram* itl_model_ = nullptr;  // itl_'s child for this model (never removed)
  prometheus::Family<prometheus::Histogram>& e2e_;
  prometheus::Family<prometheus::Histogram>& queue_time_;
  prometheus::Family<prometheus::Histogram>& prefill_time_;
  prometheus::Family<prometheus::Histogram>& decode_time_;
  prometheus::Family<prometheus::Histogram>& prompt_length_;
  prometheus::Family<prometheus::Histogram>& generation_length_;
  // Counters mirrored from ClusterState totals (monotonic per replica incarnation).
  std::map<std::string, double> last_preemptions_, last_steps_, last_tokens_;
};

}  // namespace loom::coordinator
