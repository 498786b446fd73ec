#include "coordinator/metrics.h"

#include <algorithm>
#include <string>
#include <vector>

#include "engine/request.h"
#include "prometheus/text_serializer.h"

namespace loom::coordinator {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// vLLM's buckets (vllm/engine/metrics.py and v1/metrics/loggers.py).
const Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,  0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                 0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                 7.5,  10.0,  20.0, 40.0,  80.0};
const Histogram::BucketBoundaries kRequestLatencyBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// 1, 2, 5, 10, 20, 50, ... up to 10^7 tokens (vLLM stops at max_model_len; a fixed set
// keeps the series identical across models).
Histogram::BucketBoundaries TokenBuckets() {
  Histogram::BucketBoundaries buckets;
  for (double scale = 1; scale <= 1e7; scale *= 10) {
    for (double mantissa : {1.0, 2.0, 5.0}) buckets.push_back(mantissa * scale);
  }
  return buckets;
}
const Histogram::BucketBoundaries kParamsNBuckets = {1, 2, 5, 10, 20};

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(std::string model_name)
    : model_name_(std::move(model_name)),
      registry_(std::make_shared<prometheus::Registry>()),
      requests_running_(BuildGauge()
                            .Name("loom_num_requests_running")
                            .Help("Requests running on a replica (in its batch).")
                            .Register(*registry_)),
      requests_waiting_(BuildGauge()
                            .Name("loom_num_requests_waiting")
                            .Help("Requests waiting to be scheduled on a replica.")
                            .Register(*registry_)),
      kv_cache_usage_(BuildGauge()
                          .Name("loom_kv_cache_usage_perc")
                          .Help("Fraction of a replica's KV blocks in use (1 = full).")
                          .Register(*registry_)),
      replica_up_(BuildGauge()
                      .Name("loom_replica_up")
                      .Help("1 when a replica's workers are connected and healthy, else 0.")
                      .Register(*registry_)),
      kv_blocks_free_(BuildGauge()
                          .Name("loom_kv_blocks_free")
                          .Help("Free KV blocks of a replica.")
                          .Register(*registry_)),
      kv_blocks_total_(BuildGauge()
                           .Name("loom_kv_blocks_capacity")
                           .Help("KV blocks of a replica's pool.")
                           .Register(*registry_)),
      cache_config_info_(BuildGauge()
                             .Name("loom_cache_config_info")
                             .Help("A replica's KV cache configuration, in the labels "
                                   "(block_size, cache_dtype, num_gpu_blocks, backend); "
                                   "value 1.")
                             .Register(*registry_)),
      preemptions_(BuildCounter()
                       .Name("loom_num_preemptions_total")
                       .Help("Sequences preempted (recomputed later) for lack of KV blocks.")
                       .Register(*registry_)),
      steps_(BuildCounter()
                 .Name("loom_replica_steps_total")
                 .Help("Steps (batches) a replica ran.")
                 .Register(*registry_)),
      step_tokens_(BuildCounter()
                       .Name("loom_replica_step_tokens_total")
                       .Help("Tokens a replica computed (prefill and decode).")
                       .Register(*registry_)),
      host_blocks_total_(BuildGauge()
                             .Name("loom_kv_host_tier_blocks_capacity")
                             .Help("KV blocks a replica's host tier holds (--kv-offload-memory).")
                             .Register(*registry_)),
      host_blocks_used_(BuildGauge()
                            .Name("loom_kv_host_tier_blocks")
                            .Help("KV blocks held in a replica's host tier.")
                            .Register(*registry_)),
      host_blocks_held_(BuildGauge()
                            .Name("loom_kv_host_tier_slots_held")
                            .Help("Host tier slots held now: reserved for blocks on their way "
                                  "in (fetches, pushes from prefill workers), read by another "
                                  "worker, or kept for requests about to reload them.")
                            .Register(*registry_)),
      kv_copies_queued_(BuildGauge()
                            .Name("loom_kv_offload_queue_blocks")
                            .Help("Host tier copies (offloads and reloads) the last plan "
                                  "carried.")
                            .Register(*registry_)),
      kv_offloaded_(BuildCounter()
                        .Name("loom_kv_offloaded_blocks_total")
                        .Help("Cached KV blocks evicted from the pool into the host tier.")
                        .Register(*registry_)),
      kv_reloaded_(BuildCounter()
                       .Name("loom_kv_reloaded_blocks_total")
                       .Help("KV blocks reloaded from the host tier on a prefix hit.")
                       .Register(*registry_)),
      host_hits_(BuildCounter()
                     .Name("loom_kv_host_tier_hits_total")
                     .Help("Prompt tokens served by host tier reloads (a subset of "
                           "loom_prefix_cache_hits_total).")
                     .Register(*registry_)),
      kv_fetches_(BuildCounter()
                      .Name("loom_kv_fetches_total")
                      .Help("Prefixes fetched from another replica's host tier instead of "
                            "recomputed.")
                      .Register(*registry_)),
      kv_pool_fetches_(BuildCounter()
                           .Name("loom_kv_pool_fetches_total")
                           .Help("KV transfers from another replica (prefix fetches and "
                                 "disaggregated hand-offs) copied straight out of its pools "
                                 "into this replica's: shared memory or CUDA IPC, no host tier.")
                           .Register(*registry_)),
      kv_fetch_failures_(BuildCounter()
                             .Name("loom_kv_fetch_failures_total")
                             .Help("Prefix fetches from another replica that failed (the "
                                   "source gone, a timeout, a transfer error); their requests "
                                   "recomputed the prefix.")
                             .Register(*registry_)),
      kv_fetched_blocks_(BuildCounter()
                             .Name("loom_kv_fetched_blocks_total")
                             .Help("KV blocks fetched from other replicas into the host tier.")
                             .Register(*registry_)),
      handoffs_(BuildCounter()
                    .Name("loom_disagg_handoffs_total")
                    .Help("Disaggregated serving: requests a prefill replica handed to a decode "
                          "replica after their first token (direction out), and those a "
                          "decode replica took over (direction in).")
                    .Register(*registry_)),
      handoff_failures_(BuildCounter()
                            .Name("loom_disagg_handoff_failures_total")
                            .Help("Hand-offs whose KV did not reach the decode replica (the "
                                  "prefill replica gone, a timeout, a transfer error): the "
                                  "prompt was recomputed there.")
                            .Register(*registry_)),
      prefills_kept_local_(BuildCounter()
                               .Name("loom_disagg_prefills_kept_local_total")
                               .Help("Prompts past a replica's local prefill limit that it "
                                     "prefilled itself: every prefill replica would have "
                                     "given the first token later.")
                               .Register(*registry_)),
      handoffs_pushed_(BuildCounter()
                           .Name("loom_disagg_handoffs_pushed_total")
                           .Help("Hand-offs a decode replica received whose KV the prefill "
                                 "workers pushed into its host tier as they computed it (no "
                                 "transfer after the first token); the others were pulled.")
                           .Register(*registry_)),
      reserved_blocks_(BuildGauge()
                           .Name("loom_disagg_reserved_blocks")
                           .Help("KV blocks a decode replica holds free for hand-offs placed on "
                                 "it whose prompts are being prefilled elsewhere.")
                           .Register(*registry_)),
      local_prefill_limit_(BuildGauge()
                               .Name("loom_disagg_local_prefill_limit_tokens")
                               .Help("Uncached prompt tokens past which a prompt placed on "
                                     "this replica is prefilled on a prefill replica "
                                     "(measured unless --max-local-prefill-length is set).")
                               .Register(*registry_)),
      prefill_chunk_(BuildGauge()
                         .Name("loom_disagg_prefill_chunk_tokens")
                         .Help("Prompt tokens a step of this replica computes at most: on a "
                               "decode replica the chunk that at most doubles its decodes' "
                               "step.")
                         .Register(*registry_)),
      prefix_queries_(BuildCounter()
                          .Name("loom_prefix_cache_queries_total")
                          .Help("Prompt tokens looked up in the prefix cache when a "
                                "replica schedules a prompt.")
                          .Register(*registry_)),
      prefix_hits_(BuildCounter()
                       .Name("loom_prefix_cache_hits_total")
                       .Help("Prompt tokens found in the prefix cache.")
                       .Register(*registry_)),
      prompt_tokens_(BuildCounter()
                         .Name("loom_prompt_tokens_total")
                         .Help("Prompt tokens prefilled (counted at the request's first "
                               "token).")
                         .Register(*registry_)),
      generation_tokens_(BuildCounter()
                             .Name("loom_generation_tokens_total")
                             .Help("Tokens generated, counted as they are streamed.")
                             .Register(*registry_)),
      request_success_(BuildCounter()
                           .Name("loom_request_success_total")
                           .Help("Finished requests by finish reason (stop, length, abort, "
                                 "error).")
                           .Register(*registry_)),
      rejected_(BuildCounter()
                    .Name("loom_request_rejected_total")
                    .Help("Requests refused at admission, by reason: queue_full (HTTP 429, "
                          "gRPC RESOURCE_EXHAUSTED) or unavailable (503, UNAVAILABLE).")
                    .Register(*registry_)),
      endpoint_picks_(BuildCounter()
                          .Name("loom_endpoint_picker_decisions_total")
                          .Help("The endpoint picker's answers (Gateway API Inference Extension), "
                                "by outcome: scored (a replica picked), unscored (sent to the "
                                "leader without one), not_found (404), queue_full (429), "
                                "unavailable (503).")
                          .Register(*registry_)),
      spec_drafts_(BuildCounter()
                       .Name("loom_spec_decode_num_drafts_total")
                       .Help("Speculative steps (each verifies one sequence's drafts).")
                       .Register(*registry_)),
      spec_drafted_(BuildCounter()
                        .Name("loom_spec_decode_num_draft_tokens_total")
                        .Help("Tokens proposed by speculative decoding.")
                        .Register(*registry_)),
      spec_accepted_(BuildCounter()
                         .Name("loom_spec_decode_num_accepted_tokens_total")
                         .Help("Proposed tokens the target model accepted.")
                         .Register(*registry_)),
      spec_accepted_per_pos_(BuildCounter()
                                 .Name("loom_spec_decode_num_accepted_tokens_per_pos")
                                 .Help("Accepted draft tokens by their position in the "
                                       "draft (label position, from 0).")
                                 .Register(*registry_)),
      ttft_(BuildHistogram()
                .Name("loom_time_to_first_token_seconds")
                .Help("Time from arrival to the first generated token.")
                .Register(*registry_)),
      itl_(BuildHistogram()
               .Name("loom_inter_token_latency_seconds")
               .Help("Time between consecutive generated tokens of a request.")
               .Register(*registry_)),
      e2e_(BuildHistogram()
               .Name("loom_e2e_request_latency_seconds")
               .Help("Time from arrival to finish.")
               .Register(*registry_)),
      queue_time_(BuildHistogram()
                      .Name("loom_request_queue_time_seconds")
                      .Help("Time from arrival to first being scheduled.")
                      .Register(*registry_)),
      prefill_time_(BuildHistogram()
                        .Name("loom_request_prefill_time_seconds")
                        .Help("Time from first being scheduled to the first token.")
                        .Register(*registry_)),
      decode_time_(BuildHistogram()
                       .Name("loom_request_decode_time_seconds")
                       .Help("Time from the first token to the last.")
                       .Register(*registry_)),
      inference_time_(BuildHistogram()
                          .Name("loom_request_inference_time_seconds")
                          .Help("Time from first being scheduled to finish (prefill and "
                                "decode).")
                          .Register(*registry_)),
      time_per_output_token_(BuildHistogram()
                                 .Name("loom_request_time_per_output_token_seconds")
                                 .Help("A request's mean time per output token after the "
                                       "first: decode time / (generated tokens - 1).")
                                 .Register(*registry_)),
      prompt_length_(BuildHistogram()
                         .Name("loom_request_prompt_tokens")
                         .Help("Prompt length of finished requests, in tokens.")
                         .Register(*registry_)),
      generation_length_(BuildHistogram()
                             .Name("loom_request_generation_tokens")
                             .Help("Generated tokens of finished requests.")
                             .Register(*registry_)),
      max_generation_length_(BuildHistogram()
                                 .Name("loom_request_max_num_generation_tokens")
                                 .Help("Most tokens generated by a sequence of a finished "
                                       "request (each sample of n is its own request).")
                                 .Register(*registry_)),
      params_n_(BuildHistogram()
                    .Name("loom_request_params_n")
                    .Help("The n parameter (samples per prompt) of admitted requests.")
                    .Register(*registry_)),
      params_max_tokens_(BuildHistogram()
                             .Name("loom_request_params_max_tokens")
                             .Help("The max_tokens parameter of admitted requests.")
                             .Register(*registry_)),
      disagg_phase_(BuildHistogram()
                        .Name("loom_disagg_phase_seconds")
                        .Help("Disaggregated serving: the phases of handed-off requests: queue "
                              "and prefill on the prefill replica (TTFT = queue + prefill), "
                              "transfer (first token to the decode replica's admission with "
                              "the KV), decode (admission to the last token).")
                        .Register(*registry_)) {
  // Series that exist before the first request, so rate() and dashboards see zeros.
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    prometheus::Labels labels = Model();
    labels["finished_reason"] = reason;
    request_success_.Add(labels);
  }
  for (const char* reason : {"queue_full", "unavailable"}) {
    prometheus::Labels labels = Model();
    labels["reason"] = reason;
    rejected_.Add(labels);
  }
  for (const char* outcome : kEndpointPickOutcomes) {
    prometheus::Labels labels = Model();
    labels["outcome"] = outcome;
    endpoint_picks_.Add(labels);
  }
  prompt_tokens_model_ = &prompt_tokens_.Add(Model());
  generation_tokens_model_ = &generation_tokens_.Add(Model());
  spec_drafts_.Add(Model());
  spec_drafted_.Add(Model());
  spec_accepted_.Add(Model());
}

void CoordinatorMetrics::RecordRequest(const engine::RequestRecord& record) {
  prometheus::Labels reason = Model();
  reason["finished_reason"] = engine::FinishReasonName(record.finish_reason);
  request_success_.Add(reason).Increment();
  prompt_length_.Add(Model(), TokenBuckets()).Observe(static_cast<double>(record.prompt_tokens));
  generation_length_.Add(Model(), TokenBuckets())
      .Observe(static_cast<double>(record.generation_tokens));
  max_generation_length_.Add(Model(), TokenBuckets())
      .Observe(static_cast<double>(record.generation_tokens));
  // Latency histograms of the replica it ran on last (`replica` "" if never placed).
  const prometheus::Labels labels = Replica(record.replica_id);
  if (record.e2e_seconds >= 0) e2e_.Add(labels, kRequestLatencyBuckets).Observe(record.e2e_seconds);
  if (record.queue_seconds >= 0) {
    queue_time_.Add(labels, kRequestLatencyBuckets).Observe(record.queue_seconds);
  }
  if (record.prefill_seconds >= 0) {
    prefill_time_.Add(labels, kRequestLatencyBuckets).Observe(record.prefill_seconds);
  }
  if (record.decode_seconds >= 0) {
    decode_time_.Add(labels, kRequestLatencyBuckets).Observe(record.decode_seconds);
  }
  if (record.inference_seconds >= 0) {
    inference_time_.Add(labels, kRequestLatencyBuckets).Observe(record.inference_seconds);
  }
  if (record.transfer_seconds >= 0) {
    const auto observe = [&](const char* phase, double seconds) {
      if (seconds < 0) return;
      prometheus::Labels phase_labels = Model();
      phase_labels["phase"] = phase;
      disagg_phase_.Add(phase_labels, kRequestLatencyBuckets).Observe(seconds);
    };
    observe("queue", record.queue_seconds);
    observe("prefill", record.prefill_seconds);
    observe("transfer", record.transfer_seconds);
    observe("decode", record.decode_seconds >= 0
                          ? std::max(0.0, record.decode_seconds - record.transfer_seconds)
                          : -1.0);
  }
  // vLLM observes TPOT for requests with more than one output token.
  if (record.decode_seconds >= 0 && record.generation_tokens > 1) {
    time_per_output_token_.Add(labels, kItlBuckets)
        .Observe(record.decode_seconds / static_cast<double>(record.generation_tokens - 1));
  }
}

const engine::ReplicaLatencySeries& CoordinatorMetrics::RecordFirstToken(
    const std::string& replica_id, double ttft_seconds, int64_t prompt_tokens) {
  const engine::ReplicaLatencySeries* series = nullptr;
  {
    absl::MutexLock lock(&latency_mu_);
    auto [it, inserted] = latency_.try_emplace(replica_id);
    if (inserted) {
      it->second.ttft = &ttft_.Add(Replica(replica_id), kTtftBuckets);
      it->second.inter_token = &itl_.Add(Replica(replica_id), kItlBuckets);
    }
    series = &it->second;
  }
  series->ttft->Observe(ttft_seconds);
  prompt_tokens_model_->Increment(static_cast<double>(prompt_tokens));
  generation_tokens_model_->Increment();
  return *series;
}

void CoordinatorMetrics::RecordToken(const engine::ReplicaLatencySeries& series,
                                     double inter_token_seconds) {
  generation_tokens_model_->Increment();
  if (inter_token_seconds >= 0) series.inter_token->Observe(inter_token_seconds);
}

void CoordinatorMetrics::RecordPrefixCacheQuery(const std::string& replica_id, int64_t queried,
                                                int64_t hits) {
  prefix_queries_.Add(Replica(replica_id)).Increment(static_cast<double>(queried));
  prefix_hits_.Add(Replica(replica_id)).Increment(static_cast<double>(hits));
}

void CoordinatorMetrics::RecordSpeculativeStep(int64_t drafted, int64_t accepted) {
  spec_drafts_.Add(Model()).Increment();
  spec_drafted_.Add(Model()).Increment(static_cast<double>(drafted));
  spec_accepted_.Add(Model()).Increment(static_cast<double>(accepted));
  for (int64_t position = 0; position < accepted; ++position) {
    prometheus::Labels labels = Model();
    labels["position"] = std::to_string(position);
    spec_accepted_per_pos_.Add(labels).Increment();
  }
}

void CoordinatorMetrics::RecordRejected(const absl::Status& status) {
  const char* reason = nullptr;
  if (status.code() == absl::StatusCode::kResourceExhausted) reason = "queue_full";
  if (status.code() == absl::StatusCode::kUnavailable) reason = "unavailable";
  if (reason == nullptr) return;
  prometheus::Labels labels = Model();
  labels["reason"] = reason;
  rejected_.Add(labels).Increment();
}

void CoordinatorMetrics::RecordEndpointPick(std::string_view outcome) {
  prometheus::Labels labels = Model();
  labels["outcome"] = std::string(outcome);
  endpoint_picks_.Add(labels).Increment();
}

void CoordinatorMetrics::RecordRequestParams(int64_t n, int64_t max_tokens) {
  params_n_.Add(Model(), kParamsNBuckets).Observe(static_cast<double>(n));
  params_max_tokens_.Add(Model(), TokenBuckets()).Observe(static_cast<double>(max_tokens));
}

void CoordinatorMetrics::UpdateFromClusterState(const loom::v1::ClusterState& state) {
  // Counters mirrored from cumulative totals: add what grew since the last scrape (a
  // replica that reconnected starts from zero again: its new total is the growth).
  auto mirror = [](prometheus::Counter& counter, std::map<std::string, double>& last,
                   const std::string& id, double total) {
    auto [it, inserted] = last.try_emplace(id, 0.0);
    const double growth = total >= it->second ? total - it->second : total;
    if (growth > 0) counter.Increment(growth);
    it->second = total;
  };
  for (const loom::v1::ReplicaStatus& replica : state.replicas()) {
    const prometheus::Labels labels = Replica(replica.replica_id());
    if (replica.draining() && !replica.healthy()) {
      // Drained and gone (scaled in): no longer a replica that is down.
      for (auto* family : {&requests_running_, &requests_waiting_, &kv_cache_usage_,
                           &replica_up_, &kv_blocks_free_, &kv_blocks_total_}) {
        if (family->Has(labels)) family->Remove(&family->Add(labels));
      }
      if (auto it = cache_config_labels_.find(replica.replica_id());
          it != cache_config_labels_.end()) {
        cache_config_info_.Remove(&cache_config_info_.Add(it->second));
        cache_config_labels_.erase(it);
      }
      continue;
    }
    prometheus::Labels config = labels;
    config["block_size"] = std::to_string(replica.block_size());
    config["cache_dtype"] = replica.kv_dtype();
    config["num_gpu_blocks"] = std::to_string(replica.num_kv_blocks());
    config["backend"] = replica.backend();
    auto [config_it, first] = cache_config_labels_.try_emplace(replica.replica_id(), config);
    if (!first && config_it->second != config) {
      cache_config_info_.Remove(&cache_config_info_.Add(config_it->second));
      config_it->second = config;
    }
    cache_config_info_.Add(config).Set(1);
    requests_running_.Add(labels).Set(replica.num_running());
    requests_waiting_.Add(labels).Set(replica.num_waiting());
    kv_cache_usage_.Add(labels).Set(replica.kv_cache_usage());
    replica_up_.Add(labels).Set(replica.healthy() ? 1 : 0);
    kv_blocks_free_.Add(labels).Set(static_cast<double>(replica.num_free_blocks()));
    kv_blocks_total_.Add(labels).Set(static_cast<double>(replica.num_kv_blocks()));
    mirror(preemptions_.Add(labels), last_preemptions_, replica.replica_id(),
           static_cast<double>(replica.num_preemptions()));
    mirror(steps_.Add(labels), last_steps_, replica.replica_id(),
           static_cast<double>(replica.num_steps()));
    mirror(step_tokens_.Add(labels), last_tokens_, replica.replica_id(),
           static_cast<double>(replica.num_tokens_computed()));
    if (replica.num_host_kv_blocks() > 0) {
      host_blocks_total_.Add(labels).Set(static_cast<double>(replica.num_host_kv_blocks()));
      host_blocks_used_.Add(labels).Set(static_cast<double>(replica.num_host_kv_blocks_used()));
      host_blocks_held_.Add(labels).Set(static_cast<double>(replica.num_host_kv_blocks_held()));
      kv_copies_queued_.Add(labels).Set(replica.num_kv_copies_queued());
      mirror(kv_offloaded_.Add(labels), last_offloaded_, replica.replica_id(),
             static_cast<double>(replica.num_kv_blocks_offloaded()));
      mirror(kv_reloaded_.Add(labels), last_reloaded_, replica.replica_id(),
             static_cast<double>(replica.num_kv_blocks_reloaded()));
      mirror(host_hits_.Add(labels), last_host_hits_, replica.replica_id(),
             static_cast<double>(replica.num_host_hit_tokens()));
    }
    // Fetches go into the host tier, or pool to pool without one.
    if (replica.num_host_kv_blocks() > 0 || replica.num_kv_fetches() > 0 ||
        replica.num_kv_fetch_failures() > 0) {
      mirror(kv_fetches_.Add(labels), last_fetches_, replica.replica_id(),
             static_cast<double>(replica.num_kv_fetches()));
      mirror(kv_pool_fetches_.Add(labels), last_pool_fetches_, replica.replica_id(),
             static_cast<double>(replica.num_kv_pool_fetches()));
      mirror(kv_fetch_failures_.Add(labels), last_fetch_failures_, replica.replica_id(),
             static_cast<double>(replica.num_kv_fetch_failures()));
      mirror(kv_fetched_blocks_.Add(labels), last_fetched_blocks_, replica.replica_id(),
             static_cast<double>(replica.num_kv_fetched_blocks()));
    }
    if (replica.role() != "mixed" || replica.num_handoffs_in() > 0) {
      prometheus::Labels out = labels;
      out["direction"] = "out";
      prometheus::Labels in = labels;
      in["direction"] = "in";
      mirror(handoffs_.Add(out), last_handoffs_out_, replica.replica_id(),
             static_cast<double>(replica.num_handoffs_out()));
      mirror(handoffs_.Add(in), last_handoffs_in_, replica.replica_id(),
             static_cast<double>(replica.num_handoffs_in()));
      mirror(handoff_failures_.Add(labels), last_handoff_failures_, replica.replica_id(),
             static_cast<double>(replica.num_handoff_failures()));
      mirror(prefills_kept_local_.Add(labels), last_prefills_kept_local_, replica.replica_id(),
             static_cast<double>(replica.num_prefills_kept_local()));
      mirror(handoffs_pushed_.Add(labels), last_handoffs_pushed_, replica.replica_id(),
             static_cast<double>(replica.num_handoffs_pushed()));
      reserved_blocks_.Add(labels).Set(static_cast<double>(replica.num_reserved_blocks()));
      local_prefill_limit_.Add(labels).Set(static_cast<double>(replica.local_prefill_limit()));
      prefill_chunk_.Add(labels).Set(static_cast<double>(replica.prefill_chunk_tokens()));
    }
  }
}

std::string CoordinatorMetrics::Serialize() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& family : process_.Collect()) families.push_back(std::move(family));
  return prometheus::TextSerializer().Serialize(ApplyMetricNaming(std::move(families), naming_));
}

}  // namespace loom::coordinator
