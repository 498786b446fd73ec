#include "coordinator/metric_naming.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace loom::coordinator {
namespace {

// Loom's name -> vLLM's names (docs/metrics.md's table): the same semantics, labels and
// buckets. A name with two entries is served under both (v1's and v0's).
const absl::flat_hash_map<std::string, std::vector<std::string>>& VllmNames() {
  static const auto* names = [] {
    auto* map = new absl::flat_hash_map<std::string, std::vector<std::string>>;
    for (const char* name :
         {"num_requests_running", "num_requests_waiting", "cache_config_info",
          "num_preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
          "request_success_total", "prompt_tokens_total", "generation_tokens_total",
          "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
          "spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens_per_pos",
          "time_to_first_token_seconds", "request_time_per_output_token_seconds",
          "e2e_request_latency_seconds", "request_queue_time_seconds",
          "request_prefill_time_seconds", "request_decode_time_seconds",
          "request_inference_time_seconds", "request_prompt_tokens",
          "request_generation_tokens", "request_max_num_generation_tokens", "request_params_n",
          "request_params_max_tokens"}) {
      (*map)[absl::StrCat("loom_", name)] = {absl::StrCat("vllm:", name)};
    }
    (*map)["loom_kv_cache_usage_perc"] = {"vllm:kv_cache_usage_perc",
                                          "vllm:gpu_cache_usage_perc"};
    (*map)["loom_inter_token_latency_seconds"] = {"vllm:inter_token_latency_seconds",
                                                  "vllm:time_per_output_token_seconds"};
    return map;
  }();
  return *names;
}

}  // namespace

absl::StatusOr<MetricNaming> ParseMetricNaming(std::string_view name) {
  if (name == "loom") return MetricNaming::kLoom;
  if (name == "vllm") return MetricNaming::kVllm;
  if (name == "both") return MetricNaming::kBoth;
  return absl::InvalidArgumentError(
      absl::StrCat("metric naming '", std::string(name), "': use loom, vllm or both"));
}

std::vector<prometheus::MetricFamily> ApplyMetricNaming(
    std::vector<prometheus::MetricFamily> families, MetricNaming naming) {
  if (naming == MetricNaming::kLoom) return families;
  std::vector<prometheus::MetricFamily> out;
  out.reserve(families.size() * 2);
  std::vector<prometheus::MetricFamily> renamed;
  for (prometheus::MetricFamily& family : families) {
    const auto vllm = VllmNames().find(family.name);
    if (vllm != VllmNames().end()) {
      for (const std::string& name : vllm->second) {
        prometheus::MetricFamily copy = family;
        copy.name = name;
        renamed.push_back(std::move(copy));
      }
    }
    if (naming == MetricNaming::kBoth || vllm == VllmNames().end()) {
      out.push_back(std::move(family));
    }
  }
  for (prometheus::MetricFamily& family : renamed) out.push_back(std::move(family));
  return out;
}

}  // namespace loom::coordinator
