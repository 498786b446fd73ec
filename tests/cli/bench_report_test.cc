#include "cli/bench_report.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom::cli {
namespace {

TEST(BenchReportTest, PercentilesInterpolateLinearly) {
  const nlohmann::json summary = LatencySummaryMs({0.004, 0.001, 0.003, 0.002, 0.005});
  EXPECT_DOUBLE_EQ(summary["mean"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(summary["p50"].get<double>(), 3.0);
  EXPECT_NEAR(summary["p90"].get<double>(), 4.6, 1e-9);
  EXPECT_NEAR(summary["p99"].get<double>(), 4.96, 1e-9);
  EXPECT_EQ(LatencySummaryMs({})["p99"].get<double>(), 0.0);
}

TEST(BenchReportTest, ThroughputGoodputAndCacheHitRate) {
  std::vector<RequestSample> samples(3);
  for (RequestSample& s : samples) {
    s.ok = true;
    s.prompt_tokens = 100;
    s.output_tokens = 11;
    s.ttft = 0.1;
    s.e2e = 1.1;  // tpot = 1.0 / 10 = 100 ms
  }
  samples[1].ttft = 0.5;  // misses a 200 ms TTFT SLO
  samples[2].cached_prompt_tokens = 60;
  samples[0].draft_tokens = 8;
  samples[0].accepted_tokens = 5;
  samples[2].draft_tokens = 2;
  samples[2].accepted_tokens = 1;
  RequestSample failed;
  failed.error = "UNAVAILABLE";
  samples.push_back(failed);
  const nlohmann::json run = SummarizeRun(samples, 2.0, Slo{200, 150, 0});
  EXPECT_EQ(run["completed"].get<int64_t>(), 3);
  EXPECT_EQ(run["failed"].get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(run["request_throughput"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(run["output_throughput"].get<double>(), 16.5);
  EXPECT_DOUBLE_EQ(run["goodput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(run["cache_hit_rate"].get<double>(), 60.0 / 300.0);
  EXPECT_EQ(run["draft_tokens"].get<int64_t>(), 10);
  EXPECT_EQ(run["accepted_tokens"].get<int64_t>(), 6);
  EXPECT_DOUBLE_EQ(run["acceptance_rate"].get<double>(), 0.6);
  EXPECT_NEAR(run["tpot_ms"]["mean"].get<double>(), (100.0 + 60.0 + 100.0) / 3, 1e-9);
  EXPECT_EQ(run["errors"][0].get<std::string>(), "UNAVAILABLE");
}

}  // namespace
}  // namespace loom::cli
