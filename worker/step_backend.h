#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/formats/model_config.h"
#include "worker/forward_pass.h"
#include "worker/sampler.h"
#include "worker/step_batch.h"

namespace loom::worker {

/// One sequence of a step whose next token is picked: which sequence it is and its
/// sampler (nullptr when the backend does not use samplers). Usually it owns one entry of
/// batch.sample_rows. Speculative decoding: it proposed `draft_tokens` after its computed
/// token and owns 1 + draft_tokens.size() consecutive entries (the computed token's and
/// each draft's); the backend emits the drafts the model accepts plus one token. A draft
/// model's proposals carry the distributions they were sampled from (`draft_probs`);
/// one-hot proposals (n-gram lookup, a greedy sequence's drafts) carry none.
/// Prompt scoring (StepBackend::RunAndScore): per scored row, the token that follows it,
/// and how many of the most likely tokens to return with it (`top_counts`; empty: none).
struct ScoreRequest {
  absl::Span<const int32_t> targets;
  absl::Span<const int32_t> top_counts;
};

/// Its answer, per scored row in order: the target's raw log-softmax in double, its rank
/// (1 + the tokens whose logit is higher), and the row's top_counts[i] most likely tokens
/// (most likely first; all rows' entries one after another).
struct PromptScores {
  std::vector<double> logprobs;
  std::vector<int32_t> ranks;
  std::vector<TokenLogprob> top;
  void Clear() {
    logprobs.clear();
    ranks.clear();
    top.clear();
  }
};

struct SampleRow {
  uint64_t seq_id = 0;
  SequenceSampler* sampler = nullptr;
  absl::Span<const int32_t> draft_tokens;  // empty: a plain decode or prefill's last token
  absl::Span<const float> draft_probs;     // [draft_tokens.size(), vocab] q, or empty
  // NewSequence.embed: the backend answers with the row's L2-normalized final hidden state
  // (SampledToken::embedding) instead of a token; nothing is sampled.
  bool embed = false;
};

/// SequenceSampler::PositionUniform streams of draft-model speculation: one independent
/// uniform per position of the sequence and purpose.
enum SpeculativeStream : uint32_t {
  kDraftSampleStream = 1,   // the draft model's sample of the token at a position
  kAcceptStream = 2,        // accepting or rejecting the draft at a position
  kTargetSampleStream = 3,  // the target's draw at a position (after a rejection, or bonus)
};

/// Entries of batch.sample_rows that `rows` own: one per row and one per draft token.
inline size_t NumSampleRows(absl::Span<const SampleRow> rows) {
  size_t count = 0;
  for (const SampleRow& row : rows) count += 1 + row.draft_tokens.size();
  return count;
}

/// Where one step's time went, in seconds.
struct BackendTimings {
  double execute_seconds = 0;  // the forward pass
  double sample_seconds = 0;   // picking the tokens
};

/// What executes a step for the StepExecutor: runs the forward pass over a flattened
/// batch and picks one token per sampled row. "Run and sample" is one call so that a
/// backend that does no math (noop) never materializes logits. Implementations are not
/// thread-safe: the executor calls them one step at a time.
class StepBackend {
 public:
  virtual ~StepBackend() = default;

  /// The name the worker registers with: "cpu", "noop", ...
  virtual std::string_view name() const = 0;
  /// The model's hyper-parameters (vocab size and context length bound the plans).
  virtual const common::ModelConfig& config() const = 0;
  /// KV pool size in blocks; block ids of a step are in [0, num_kv_blocks()).
  virtual int64_t num_kv_blocks() const = 0;
  /// Tokens per KV block.
  virtual int64_t block_size() const = 0;
  /// False when Run ignores SampleRow::sampler: the executor then creates no samplers.
  virtual bool uses_samplers() const = 0;
  /// How the model's forward pass ran its steps (zeros without one).
  virtual ForwardPassStats forward_pass_stats() const { return {}; }
  /// The KV pool the steps run on (the host tier's copies); nullptr without one (noop).
  virtual const model::KvCache* kv_pool() const { return nullptr; }
  /// False on a pipeline stage before the last: Run computes the stage's layers and
  /// passes them on, emitting no tokens (and scoring nothing); the last stage samples.
  virtual bool samples() const { return true; }
  /// A step with scheduled work that will not Run (its plan failed on this worker): a
  /// pipeline stage still takes its predecessor's message and passes the failure on.
  virtual void SkipStep(uint64_t step_id, const absl::Status& why) { (void)step_id, (void)why; }
  /// Calls `observer` (empty: none) twice per layer of every later step, after the layer's
  /// attention (its K/V are in the pool then) and after its FFN, on the computing thread:
  /// what KV pushes copy a layer after. False where the forward pass cannot.
  virtual bool SetHalfLayerObserver(std::function<void()> observer) {
    (void)observer;
    return false;
  }

  /// Runs `batch` and picks the tokens of each of `rows` (which cover batch.sample_rows
  /// in order, see SampleRow): `num_emitted[i]` tokens for rows[i] (1 + its accepted
  /// drafts), appended to `tokens` in row order. A speculative row without draft_probs
  /// (or of a greedy sequence) emits exactly the tokens its sampler would pick one step
  /// at a time: the model's token at each position, stopping after the first one that
  /// differs from the draft. A sampled row with draft_probs q is verified by rejection
  /// sampling against the target's distribution p (accept with min(1, p/q), else draw
  /// from norm(max(0, p - q))): its tokens are distributed as the sampler's own, not
  /// equal to them. InvalidArgument for a batch ValidateStepBatch rejects or rows that do
  /// not cover the sample rows; on any error no sampler has been touched.
  virtual absl::Status Run(const StepBatch& batch, absl::Span<const SampleRow> rows,
                           std::vector<SampledToken>& tokens, std::vector<int32_t>& num_emitted,
                           BackendTimings& timings) = 0;

  /// Run, where batch.sample_rows also holds, after the entries `rows` own, one row per
  /// prompt position being scored: `score.targets[i]` is the token that follows the i-th
  /// of them, and `scores` receives its raw log-softmax at that row, computed in double as
  /// -(max + log(sum(exp(logit - max))) - logit[target]) (perplexity's negative
  /// log-likelihood, negated exactly), its rank and the row's most likely tokens. With no
  /// targets this is Run; a backend that cannot score answers Unimplemented (the default).
  virtual absl::Status RunAndScore(const StepBatch& batch, absl::Span<const SampleRow> rows,
                                   const ScoreRequest& score, std::vector<SampledToken>& tokens,
                                   std::vector<int32_t>& num_emitted, PromptScores& scores,
                                   BackendTimings& timings) {
    scores.Clear();
    if (score.targets.empty()) return Run(batch, rows, tokens, num_emitted, timings);
    return absl::UnimplementedError(absl::StrCat("the ", std::string(name()), " backend cannot score prompts"));
  }
};

}  // namespace loom::worker
