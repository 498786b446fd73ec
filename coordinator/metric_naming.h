#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/metric_family.h"

namespace loom::coordinator {

/// Which names the coordinator's metrics are served under (--metrics-naming): Loom's
/// (`loom_x`), vLLM's (`vllm:x`, for the metrics vLLM has, so vLLM's Grafana dashboards,
/// KEDA queries and llm-d's endpoint picker work unchanged; v0 names too:
/// `vllm:gpu_cache_usage_perc`, `vllm:time_per_output_token_seconds`), or both.
enum class MetricNaming { kLoom, kVllm, kBoth };

/// "loom", "vllm" or "both"; InvalidArgument naming the choices otherwise.
absl::StatusOr<MetricNaming> ParseMetricNaming(std::string_view name);

/// `families` (Loom's names) as `naming` serves them: with kVllm, each metric vLLM has
/// renamed (and the others, which vLLM lacks, kept under Loom's names); with kBoth, Loom's
/// families followed by the vLLM-named copies.
std::vector<prometheus::MetricFamily> ApplyMetricNaming(
    std::vector<prometheus::MetricFamily> families, MetricNaming naming);

}  // namespace loom::coordinator
