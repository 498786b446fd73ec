#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace loom::cli {

/// What one request of `loom bench` measured on the client (seconds).
struct RequestSample {
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t draft_tokens = 0;        // speculative drafts proposed (gRPC API only)
  int64_t accepted_tokens = 0;     //   and accepted
  double ttft = 0;                 // send to the first token
  double e2e = 0;                  // send to the last message
  std::vector<double> itl;         // gaps between tokens (a message of n tokens: n gaps)
  double tpot() const {            // mean time per output token after the first
    return output_tokens > 1 ? (e2e - ttft) / static_cast<double>(output_tokens - 1) : 0.0;
  }
};

/// Service-level objectives for goodput (requests/s meeting all of them); 0: none.
struct Slo {
  double ttft_ms = 0;
  double tpot_ms = 0;
  double e2e_ms = 0;
};

/// Mean and p50/p90/p99 (linear interpolation) of `values`, in milliseconds.
nlohmann::json LatencySummaryMs(std::vector<double> seconds);

/// The report of one load level: throughput, latency summaries, goodput, failures and
/// the prefix-cache hit rate, as vLLM's benchmark_serving prints them.
nlohmann::json SummarizeRun(const std::vector<RequestSample>& samples, double duration_s,
                            const Slo& slo);

}  // namespace loom::cli
