#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/local_engine.h"

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
};

struct PerplexityResult {
  int64_t num_tokens = 0;  // tokens of the text evaluated
  int64_t windows = 0;
  double seconds = 0;  // wall time of the forward passes
  // Each scored token's negative log-likelihood (natural log), in text order.
  std::vector<double> token_nll;

  int64_t scored() const { return static_cast<int64_t>(token_nll.size()); }
  double mean_nll() const;  // 0 with nothing scored
  double perplexity() const;
  /// The standard error of mean_nll(): the tokens' sample standard deviation over
  /// sqrt(scored) (0 below two tokens), as llama.cpp's perplexity reports it. Two runs whose
  /// figures differ by less than a few of these cannot be told apart on this text; a paired
  /// comparison (the difference of token_nll, token by token) resolves finer.
  double nll_stderr() const;
  /// perplexity() * nll_stderr(): the perplexity's standard error (to first order).
  double perplexity_stderr() const { return perplexity() * nll_stderr(); }
};

/// KV blocks of `block_size` tokens one window of `context` tokens takes in the engine
/// (its tokens and the one token the engine samples after it).
int64_t PerplexityKvBlocks(int64_t context, int64_t block_size);

/// Runs `tokens` through `engine` window by window, each window one request (from
/// position 0) that scores its prompt from score_begin on (EngineRequest::
/// score_prompt_from), and sums -log softmax(logits)[next token] in double over the scored
/// tokens. The engine's pool needs PerplexityKvBlocks(context) blocks; its
/// max_num_batched_tokens is the prefill chunk. InvalidArgument for impossible windows or
/// a context of the model's context length or more.
absl::StatusOr<PerplexityResult> ComputePerplexity(LocalEngine& engine,
                                                   const std::vector<int32_t>& tokens,
                                                   const PerplexityOptions& options);

/// `loom perplexity --model PATH --text FILE [--context N] [--stride S]
/// [--max-tokens M] [--threads T] [--kv-dtype f16|f32|int8|fp8_e4m3] [--device cuda|cpu|auto]
/// [--quantization int8|int4|fp8] [--nll-out FILE] [--json]`: perplexity of the text's
/// tokens (the first M when given) under the model, on the device and in the weights' form a
/// worker would serve it with the same flags. argv[0] is "perplexity".
/// Returns the exit code.
int RunPerplexityCommand(int argc, char** argv);

}  // namespace loom::cli
