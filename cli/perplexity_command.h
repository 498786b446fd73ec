#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/forward_pass.h"

namespace loom::cli {

/// One sliding window: tokens [begin, end) are the model's input (positions 0 ..
/// end - begin - 1); the tokens at [score_begin, end) are scored, each predicted from
/// the window's tokens before it.
struct PerplexityWindow {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t score_begin = 0;
};

/// Hugging Face's sliding-window recipe: windows of `context` tokens starting every
/// `stride` tokens; each scores only the tokens the previous window did not reach. With
/// stride < context every token but the first is scored exactly once; with stride ==
/// context (disjoint windows) each window's first token is not scored either, having
/// nothing before it. InvalidArgument unless 1 <= stride <= context and num_tokens >= 2.
absl::StatusOr<std::vector<PerplexityWindow>> PlanPerplexityWindows(int64_t num_tokens,
                                                                    int64_t context,
                                                                    int64_t stride);

struct PerplexityOptions {
  int64_t context = 512;
  int64_t stride = 256;
  /// Tokens per Step (a window longer than this is prefilled in chunks).
  int64_t max_step_tokens = 512;
};

struct PerplexityResult {
  int64_t num_tokens = 0;  // tokens of the text evaluated
  int64_t scored = 0;      // tokens whose negative log-likelihood is summed
  int64_t windows = 0;
  double nll_sum = 0;  // natural log
  double seconds = 0;  // wall time of the forward passes

  double mean_nll() const { return scored > 0 ? nll_sum / static_cast<double>(scored) : 0.0; }
  double perplexity() const;
};

/// Runs `tokens` through `runner` window by window (each window from position 0, its
/// KV in blocks 0, 1, ...: the runner needs ceil(context / block_size) blocks) and sums
/// -log softmax(logits)[next token] in double over the scored tokens.
absl::StatusOr<PerplexityResult> ComputePerplexity(worker::ForwardPass& runner,
                                                   const std::vector<int32_t>& tokens,
                                                   const PerplexityOptions& options);

/// `loom perplexity --model PATH --text FILE [--context N] [--stride S]
/// [--max-tokens M] [--threads T] [--kv-dtype f16|f32] [--json]`: perplexity of the
/// text's tokens (the first M when given) under the model. argv[0] is "perplexity".
/// Returns the exit code.
int RunPerplexityCommand(int argc, char** argv);

}  // namespace loom::cli
