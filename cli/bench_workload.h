#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::cli {

/// Synthetic serving workloads for `loom bench` (vLLM benchmark_serving's random dataset
/// and its shared-prefix and multi-turn variants), as token ids so lengths are exact.
struct WorkloadOptions {
  std::string dataset = "random";  // random | shared-prefix | multi-turn
  int64_t num_requests = 64;       // requests (multi-turn: sessions x turns, rounded up)
  int64_t input_len = 256;         // tokens of each request's own part
  int64_t output_len = 64;
  double range_ratio = 0.0;        // lengths uniform in len * [1 - r, 1 + r]
  int64_t prefix_len = 1024;       // shared-prefix: the shared system prompt
  int64_t num_prefixes = 8;        // shared-prefix: distinct system prompts
  int64_t turns = 4;               // multi-turn: turns per session
  uint64_t seed = 0;
};

/// One turn of a session (every request is a session of one turn outside multi-turn).
struct BenchTurn {
  std::vector<int32_t> new_tokens;  // appended to the conversation so far
  int32_t max_tokens = 0;
};

/// A unit of work a client runs in order: its turns' prompts grow by the previous
/// prompt, the previous reply and the new tokens.
struct BenchSession {
  std::vector<int32_t> prefix;  // shared-prefix: the system prompt (else empty)
  std::vector<BenchTurn> turns;
};

/// Sessions for `options`, with token ids drawn from [first_token, vocab_size).
/// InvalidArgument for unknown datasets or non-positive sizes.
absl::StatusOr<std::vector<BenchSession>> MakeWorkload(const WorkloadOptions& options,
                                                       int32_t vocab_size, int32_t first_token);

}  // namespace loom::cli
