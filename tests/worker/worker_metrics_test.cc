#include "worker/worker_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace loom::worker {
namespace {

double CounterValue(const WorkerMetrics& metrics, const std::string& name) {
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].counter.value;
  }
  ADD_FAILURE() << "no metric " << name;
  return -1;
}

// The forward pass reports cumulative counts; the counters follow them (quick.sh's serving
// step reads loom_worker_cuda_graph_replays_total to see that decode steps replayed graphs).
TEST(WorkerMetricsTest, ForwardPassCountsBecomeCounters) {
  WorkerMetrics metrics("r0", 0, "cuda", 100);
  ForwardPassStats stats;
  stats.eager_steps = 3;
  stats.graph_captures = 1;
  stats.graph_replays = 2;
  metrics.RecordForwardPassStats(stats);
  stats.graph_replays = 7;
  stats.graph_capture_failures = 1;
  stats.pipeline_wait_seconds = 0.25;
  metrics.RecordForwardPassStats(stats);
  metrics.RecordForwardPassStats(stats);  // nothing new: nothing counted twice
  EXPECT_EQ(CounterValue(metrics, "loom_worker_eager_steps_total"), 3);
  EXPECT_EQ(CounterValue(metrics, "loom_worker_cuda_graph_captures_total"), 1);
  EXPECT_EQ(CounterValue(metrics, "loom_worker_cuda_graph_replays_total"), 7);
  EXPECT_EQ(CounterValue(metrics, "loom_worker_cuda_graph_capture_failures_total"), 1);
  EXPECT_EQ(CounterValue(metrics, "loom_worker_pipeline_wait_seconds_total"), 0.25);
}

// A step's timings split its time: the whole step, the forward pass and sampling (the GPU
// window's serving benchmark sets them beside the inter-token latency clients see).
TEST(WorkerMetricsTest, StepTimingsBecomeCounters) {
  WorkerMetrics metrics("r0", 0, "cuda", 100);
  loom::v1::StepTimings timings;
  timings.set_total_seconds(0.004);
  timings.set_execute_seconds(0.003);
  timings.set_sample_seconds(0.0005);
  metrics.RecordStep(timings, 2, 2, false);
  metrics.RecordStep(timings, 1, 1, true);
  EXPECT_EQ(CounterValue(metrics, "loom_worker_steps_total"), 2);
  EXPECT_EQ(CounterValue(metrics, "loom_worker_rejected_steps_total"), 1);
  EXPECT_DOUBLE_EQ(CounterValue(metrics, "loom_worker_execute_seconds_total"), 0.006);
  EXPECT_DOUBLE_EQ(CounterValue(metrics, "loom_worker_sample_seconds_total"), 0.001);
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name != "loom_worker_step_seconds") continue;
    EXPECT_EQ(family.metric[0].histogram.sample_count, 2u);
    EXPECT_DOUBLE_EQ(family.metric[0].histogram.sample_sum, 0.008);
  }
}

}  // namespace
}  // namespace loom::worker
