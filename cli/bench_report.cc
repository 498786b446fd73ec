#include "cli/bench_report.h"

#include <algorithm>
#include <numeric>

namespace loom::cli {

nlohmann::json LatencySummaryMs(std::vector<double> seconds) {
  nlohmann::json summary = {{"mean", 0.0}, {"p50", 0.0}, {"p90", 0.0}, {"p99", 0.0}};
  if (seconds.empty()) return summary;
  std::sort(seconds.begin(), seconds.end());
  auto percentile = [&](double q) {
    const double position = q * static_cast<double>(seconds.size() - 1);
    const size_t below = static_cast<size_t>(position);
    const size_t above = std::min(below + 1, seconds.size() - 1);
    const double fraction = position - static_cast<double>(below);
    return 1000.0 * (seconds[below] + fraction * (seconds[above] - seconds[below]));
  };
  summary["mean"] =
      1000.0 * std::accumulate(seconds.begin(), seconds.end(), 0.0) / static_cast<double>(seconds.size());
  summary["p50"] = percentile(0.50);
  summary["p90"] = percentile(0.90);
  summary["p99"] = percentile(0.99);
  return summary;
}

nlohmann::json SummarizeRun(const std::vector<RequestSample>& samples, double duration_s,
                            const Slo& slo) {
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t completed = 0, failed = 0, input_tokens = 0, output_tokens = 0, cached = 0, good = 0;
  int64_t drafts = 0, accepted = 0;
  std::vector<std::string> errors;
  for (const RequestSample& sample : samples) {
    if (!sample.ok) {
      ++failed;
      if (errors.size() < 5) errors.push_back(sample.error);
      continue;
    }
    ++completed;
    input_tokens += sample.prompt_tokens;
    output_tokens += sample.output_tokens;
    cached += sample.cached_prompt_tokens;
    drafts += sample.draft_tokens;
    accepted += sample.accepted_tokens;
    ttft.push_back(sample.ttft);
    e2e.push_back(sample.e2e);
    if (sample.output_tokens > 1) tpot.push_back(sample.tpot());
    itl.insert(itl.end(), sample.itl.begin(), sample.itl.end());
    const bool meets = (slo.ttft_ms <= 0 || sample.ttft * 1000 <= slo.ttft_ms) &&
                       (slo.tpot_ms <= 0 || sample.tpot() * 1000 <= slo.tpot_ms) &&
                       (slo.e2e_ms <= 0 || sample.e2e * 1000 <= slo.e2e_ms);
    if (meets) ++good;
  }
  const double seconds = std::max(duration_s, 1e-9);
  return {
      {"completed", completed},
      {"failed", failed},
      {"errors", errors},
      {"duration_s", duration_s},
      {"input_tokens", input_tokens},
      {"output_tokens", output_tokens},
      {"request_throughput", completed / seconds},
      {"output_throughput", output_tokens / seconds},
      {"total_token_throughput", (input_tokens + output_tokens) / seconds},
      {"goodput", good / seconds},
      {"cache_hit_rate", input_tokens > 0 ? static_cast<double>(cached) / input_tokens : 0.0},
      {"draft_tokens", drafts},
      {"accepted_tokens", accepted},
      {"acceptance_rate", drafts > 0 ? static_cast<double>(accepted) / drafts : 0.0},
      {"ttft_ms", LatencySummaryMs(ttft)},
      {"tpot_ms", LatencySummaryMs(tpot)},
      {"itl_ms", LatencySummaryMs(itl)},
      {"e2e_ms", LatencySummaryMs(e2e)},
  };
}

}  // namespace loom::cli
