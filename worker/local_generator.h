#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/forward_pass.h"
#include "worker/sampler.h"

namespace loom::worker {

enum class FinishReason { kStop, kLength };

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // besides the model's end-of-generation ids
  bool ignore_eos = false;
};

struct GenerationResult {
  std::vector<SampledToken> tokens;
  FinishReason finish_reason = FinishReason::kLength;
  double prefill_seconds = 0;  // wall time of the steps that held this request's prefill
  double decode_seconds = 0;   // wall time of its decode steps
};

/// In-process generation for one runner: the `loom generate` command, tests and
/// benchmarks. It allocates KV blocks from a free list and runs continuous batches
/// (every running sequence decodes in the same step; prompts are prefilled in chunks of
/// at most `max_batched_tokens`). The cluster's scheduler and block manager live in the
/// coordinator; this is the single-process stand-in for them. Not thread-safe.
class LocalGenerator {
 public:
  /// `eos_ids`: the model's end-of-generation tokens.
  LocalGenerator(ForwardPass& runner, std::vector<int32_t> eos_ids,
                 int64_t max_batched_tokens = 512);

  /// Calls on_token(request index, token) as each token is produced.
  using TokenCallback = std::function<void(size_t, const SampledToken&)>;

  /// Runs all requests to completion together. `batched` false runs them one after
  /// another instead (for batch-invariance checks). InvalidArgument for a bad request
  /// (nothing runs); ResourceExhausted when the KV pool cannot hold them.
  absl::StatusOr<std::vector<GenerationResult>> Generate(
      const std::vector<GenerationRequest>& requests, const TokenCallback& on_token = nullptr,
      bool batched = true);

 private:
  absl::StatusOr<std::vector<GenerationResult>> RunBatch(
      const std::vector<GenerationRequest>& requests, size_t first_index,
      const TokenCallback& on_token);

  ForwardPass& runner_;
  std::vector<int32_t> eos_ids_;
  int64_t max_batched_tokens_;
};

}  // namespace loom::worker
