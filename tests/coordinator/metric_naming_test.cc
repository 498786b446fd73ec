#include "coordinator/metric_naming.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/metrics.h"
#include "prometheus/text_serializer.h"

namespace loom::coordinator {
namespace {

std::vector<std::string> Names(const std::vector<prometheus::MetricFamily>& families) {
  std::vector<std::string> names;
  for (const prometheus::MetricFamily& family : families) names.push_back(family.name);
  return names;
}

bool Has(const std::string& text, const std::string& line_start) {
  return text.find("\n" + line_start) != std::string::npos;
}

// vLLM's dashboards and autoscalers query vllm:x; Loom's own, loom_x. The same series, with
// the same labels (model_name included) and values, under each name the naming serves.
TEST(MetricNamingTest, ServesVllmNamesBesideOrInsteadOfLoomNames) {
  CoordinatorMetrics metrics("smol");
  metrics.RecordRequestParams(2, 64);
  loom::v1::ClusterState state;
  state.add_replicas()->set_replica_id("r0");
  metrics.UpdateFromClusterState(state);
  metrics.set_naming(MetricNaming::kBoth);
  const std::string both = metrics.Serialize();
  EXPECT_TRUE(Has(both, "loom_request_params_n_count{model_name=\"smol\"} 1")) << both;
  EXPECT_TRUE(Has(both, "vllm:request_params_n_count{model_name=\"smol\"} 1")) << both;
  EXPECT_TRUE(Has(both, "# TYPE vllm:gpu_cache_usage_perc gauge")) << both;  // v0's name
  EXPECT_TRUE(Has(both, "# TYPE vllm:kv_cache_usage_perc gauge")) << both;

  metrics.set_naming(MetricNaming::kVllm);
  const std::string vllm = metrics.Serialize();
  EXPECT_TRUE(Has(vllm, "vllm:request_params_n_count{model_name=\"smol\"} 1")) << vllm;
  EXPECT_FALSE(Has(vllm, "loom_request_params_n_count")) << vllm;
  // What vLLM has no metric for keeps Loom's name.
  EXPECT_TRUE(Has(vllm, "# TYPE loom_replica_up gauge")) << vllm;

  metrics.set_naming(MetricNaming::kLoom);
  const std::string loom = metrics.Serialize();
  EXPECT_EQ(loom.find("vllm:"), std::string::npos);
  EXPECT_TRUE(Has(loom, "loom_request_params_n_count{model_name=\"smol\"} 1")) << loom;
}

TEST(MetricNamingTest, EveryVllmNameIsOneVllmServes) {
  // The copies take vLLM's names exactly (docs/metrics.md's table), none invented.
  CoordinatorMetrics metrics("m");
  loom::v1::ClusterState state;
  state.add_replicas()->set_replica_id("r0");
  metrics.UpdateFromClusterState(state);
  metrics.RecordFirstToken("r0", 0.1, 5);
  metrics.RecordRequestParams(1, 8);
  metrics.set_naming(MetricNaming::kVllm);
  const std::string text = metrics.Serialize();
  for (const char* name : {"vllm:num_requests_running", "vllm:num_requests_waiting",
                           "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds",
                           "vllm:request_success_total", "vllm:prompt_tokens_total",
                           "vllm:request_params_max_tokens", "vllm:inter_token_latency_seconds",
                           "vllm:time_per_output_token_seconds"}) {
    EXPECT_TRUE(Has(text, std::string("# TYPE ") + name + " ")) << name;
  }
}

TEST(MetricNamingTest, ParsesTheFlagValues) {
  EXPECT_EQ(*ParseMetricNaming("loom"), MetricNaming::kLoom);
  EXPECT_EQ(*ParseMetricNaming("vllm"), MetricNaming::kVllm);
  EXPECT_EQ(*ParseMetricNaming("both"), MetricNaming::kBoth);
  EXPECT_FALSE(ParseMetricNaming("prometheus").ok());
  EXPECT_TRUE(Names(ApplyMetricNaming({}, MetricNaming::kBoth)).empty());
}

}  // namespace
}  // namespace loom::coordinator
