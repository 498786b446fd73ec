#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/process_metrics.h"
#include "coordinator/metric_naming.h"
#include "engine/request_metrics.h"
#include "loom/v1/inference.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

// The latency histograms of one replica (label `replica`), looked up once per request: the
// engine's opaque handle (engine/request_metrics.h), defined by its implementation here.
namespace loom::engine {
struct ReplicaLatencySeries {
  prometheus::Histogram* ttft = nullptr;
  prometheus::Histogram* inter_token = nullptr;
};
}  // namespace loom::engine

namespace loom::coordinator {

/// The coordinator's Prometheus metrics, named after vLLM's (`vllm:x` is `loom_x`: no
/// colons, base units, `_total` on counters) with the same semantics and histogram
/// buckets, so dashboards, KEDA autoscalers and inference gateways built for vLLM work
/// with a rename. Every series carries `model_name`; per-replica series and the latency
/// histograms carry `replica`. Counters move when their event happens (a token streamed,
/// a prompt scheduled, a draft verified), not when the request finishes. Also serves the
/// process_* metrics. Documented in docs/metrics.md. Thread-safe (prometheus-cpp metrics
/// are atomic; the per-replica series cache has a mutex).
class CoordinatorMetrics : public engine::RequestMetrics {
 public:
  explicit CoordinatorMetrics(std::string model_name);

  /// A finished request: finish reason, lengths, parameters and latency histograms.
  void RecordRequest(const engine::RequestRecord& record) override;
  /// A request's first token, `ttft_seconds` after its arrival, on `replica_id`: the TTFT
  /// histogram and its prompt tokens (counted once its prefill completed, as vLLM does).
  /// Returns the replica's latency series for the request's later tokens.
  const engine::ReplicaLatencySeries& RecordFirstToken(const std::string& replica_id,
                                                       double ttft_seconds,
                                                       int64_t prompt_tokens) override;
  /// One generated token streamed (with the gap since the previous one of the request,
  /// or negative for the first), on `series` from RecordFirstToken.
  void RecordToken(const engine::ReplicaLatencySeries& series, double inter_token_seconds) override;
  /// Prefix-cache lookup when a replica schedules a prompt: tokens queried and found.
  void RecordPrefixCacheQuery(const std::string& replica_id, int64_t queried, int64_t hits) override;
  /// One speculative step of one sequence: tokens drafted and accepted (a prefix of the
  /// drafts: positions 0..accepted-1 were accepted).
  void RecordSpeculativeStep(int64_t drafted, int64_t accepted) override;
  /// A request refused at admission: ResourceExhausted (429, queue full) or Unavailable
  /// (503, no replica or draining); other codes are not counted.
  void RecordRejected(const absl::Status& status);
  /// The endpoint picker's answer for one request (api/endpoint_picker): `outcome` is one of
  /// kEndpointPickOutcomes.
  void RecordEndpointPick(std::string_view outcome);
  static constexpr const char* kEndpointPickOutcomes[] = {"scored", "unscored", "not_found",
                                                          "queue_full", "unavailable"};
  /// An API request's sampling parameters at admission: `n` samples of up to
  /// `max_tokens` each.
  void RecordRequestParams(int64_t n, int64_t max_tokens);

  /// Gauges (running, waiting, KV usage, preemptions...) from a cluster snapshot; called
  /// just before each scrape, so nothing in the step loop touches them. Replicas drained
  /// and gone (scaled in) leave the per-replica gauges.
  void UpdateFromClusterState(const loom::v1::ClusterState& state);

  /// The text exposition format (version 0.0.4) of every metric, process_* included,
  /// under the names set_naming chose (default: Loom's and vLLM's).
  std::string Serialize() const;
  void set_naming(MetricNaming naming) { naming_ = naming; }
  prometheus::Registry& registry() { return *registry_; }

 private:
  prometheus::Labels Model() const { return {{"model_name", model_name_}}; }
  prometheus::Labels Replica(const std::string& replica_id) const {
    return {{"model_name", model_name_}, {"replica", replica_id}};
  }

  std::string model_name_;
  MetricNaming naming_ = MetricNaming::kBoth;
  std::shared_ptr<prometheus::Registry> registry_;
  common::ProcessCollector process_;
  // Per replica, from ClusterState.
  prometheus::Family<prometheus::Gauge>& requests_running_;
  prometheus::Family<prometheus::Gauge>& requests_waiting_;
  prometheus::Family<prometheus::Gauge>& kv_cache_usage_;
  prometheus::Family<prometheus::Gauge>& replica_up_;
  prometheus::Family<prometheus::Gauge>& kv_blocks_free_;
  prometheus::Family<prometheus::Gauge>& kv_blocks_total_;
  prometheus::Family<prometheus::Gauge>& cache_config_info_;
  prometheus::Family<prometheus::Counter>& preemptions_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& step_tokens_;
  prometheus::Family<prometheus::Gauge>& host_blocks_total_;
  prometheus::Family<prometheus::Gauge>& host_blocks_used_;
  prometheus::Family<prometheus::Gauge>& host_blocks_held_;
  prometheus::Family<prometheus::Gauge>& kv_copies_queued_;
  prometheus::Family<prometheus::Counter>& kv_offloaded_;
  prometheus::Family<prometheus::Counter>& kv_reloaded_;
  prometheus::Family<prometheus::Counter>& host_hits_;
  prometheus::Family<prometheus::Counter>& kv_fetches_;
  prometheus::Family<prometheus::Counter>& kv_pool_fetches_;
  prometheus::Family<prometheus::Counter>& kv_fetch_failures_;
  prometheus::Family<prometheus::Counter>& kv_fetched_blocks_;
  prometheus::Family<prometheus::Counter>& handoffs_;
  prometheus::Family<prometheus::Counter>& handoff_failures_;
  prometheus::Family<prometheus::Counter>& prefills_kept_local_;
  prometheus::Family<prometheus::Counter>& handoffs_pushed_;
  prometheus::Family<prometheus::Gauge>& reserved_blocks_;
  prometheus::Family<prometheus::Gauge>& local_prefill_limit_;
  prometheus::Family<prometheus::Gauge>& prefill_chunk_;
  // As they happen.
  prometheus::Family<prometheus::Counter>& prefix_queries_;
  prometheus::Family<prometheus::Counter>& prefix_hits_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_;
  prometheus::Family<prometheus::Counter>& generation_tokens_;
  prometheus::Family<prometheus::Counter>& request_success_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& endpoint_picks_;
  prometheus::Family<prometheus::Counter>& spec_drafts_;
  prometheus::Family<prometheus::Counter>& spec_drafted_;
  prometheus::Family<prometheus::Counter>& spec_accepted_;
  prometheus::Family<prometheus::Counter>& spec_accepted_per_pos_;
  prometheus::Family<prometheus::Histogram>& ttft_;
  prometheus::Family<prometheus::Histogram>& itl_;
  prometheus::Family<prometheus::Histogram>& e2e_;
  prometheus::Family<prometheus::Histogram>& queue_time_;
  prometheus::Family<prometheus::Histogram>& prefill_time_;
  prometheus::Family<prometheus::Histogram>& decode_time_;
  prometheus::Family<prometheus::Histogram>& inference_time_;
  prometheus::Family<prometheus::Histogram>& time_per_output_token_;
  prometheus::Family<prometheus::Histogram>& prompt_length_;
  prometheus::Family<prometheus::Histogram>& generation_length_;
  prometheus::Family<prometheus::Histogram>& max_generation_length_;
  prometheus::Family<prometheus::Histogram>& params_n_;
  prometheus::Family<prometheus::Histogram>& params_max_tokens_;
  prometheus::Family<prometheus::Histogram>& disagg_phase_;
  prometheus::Counter* generation_tokens_model_ = nullptr;  // children looked up once
  prometheus::Counter* prompt_tokens_model_ = nullptr;
  absl::Mutex latency_mu_;
  // Never erased: pointers handed out stay valid.
  std::map<std::string, engine::ReplicaLatencySeries> latency_ ABSL_GUARDED_BY(latency_mu_);
  // Counters mirrored from ClusterState totals (monotonic per replica incarnation).
  std::map<std::string, double> last_preemptions_, last_steps_, last_tokens_;
  std::map<std::string, double> last_offloaded_, last_reloaded_, last_host_hits_;
  std::map<std::string, double> last_fetches_, last_fetch_failures_, last_fetched_blocks_;
  std::map<std::string, double> last_pool_fetches_;
  std::map<std::string, double> last_handoffs_out_, last_handoffs_in_, last_handoff_failures_,
      last_prefills_kept_local_, last_handoffs_pushed_;
  // cache_config_info's labels per replica, to replace the series when they change.
  std::map<std::string, prometheus::Labels> cache_config_labels_;
};

}  // namespace loom::coordinator
