#pragma once

namespace loom::cli {

/// `loom bench`: a load generator against a running cluster's gRPC API or any
/// OpenAI-compatible server's /v1/completions (vLLM's benchmark_serving for Loom): fixed concurrency or Poisson arrivals, synthetic random,
/// shared-prefix and multi-turn workloads, throughput and TTFT/TPOT/ITL/e2e percentiles,
/// goodput under SLOs, prefix-cache hit rate; JSON report. bench/plot_serving.py draws
/// latency against load from it.
int RunBenchCommand(int argc, char** argv);

}  // namespace loom::cli
