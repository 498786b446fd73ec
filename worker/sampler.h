#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/grammar/grammar_matcher.h"
#include "common/sampling_params.h"
#include "loom/v1/worker.pb.h"

namespace loom::worker {

/// How one sequence picks its next token: common::SamplingParams (one definition, its
/// defaults and its validation shared with the coordinator).
using common::SamplingParams;
using common::ValidateSamplingParams;

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token_id = 0;
  float logprob = 0.0f;                     // log-softmax of the model's raw logits
  std::vector<TokenLogprob> top_logprobs;   // most likely first, num_logprobs entries
  std::vector<float> embedding;             // an embedding row's pooled hidden state instead
  std::string error;  // the sequence cannot go on (its grammar's dead end): token_id is void
};

/// Per-sequence sampler state: the RNG (seeded per sequence, so a sequence's samples do
/// not depend on what else is in the batch) and token counts for the penalties. Lives
/// on the worker with the sequence. Not thread-safe.
class SequenceSampler {
 public:
  SequenceSampler(const SamplingParams& params, absl::Span<const int32_t> prompt_ids,
                  int64_t vocab_size);

  /// Picks the next token from `logits` [vocab_size] and records it for the penalties.
  SampledToken Sample(const float* logits);

  /// Records a token this sequence generated before (a preempted sequence's outputs,
  /// sent again) or one chosen elsewhere (speculative verification): counts it for the
  /// penalties and advances the RNG as Sample did, so a resumed sequence samples what it
  /// would have sampled without the preemption.
  void RecordOutput(int32_t token_id);

  /// Constrains the sequence to `grammar` (structured output): Sample then only picks
  /// tokens the grammar allows next (the mask for a step is computed on another thread as
  /// soon as the previous token is known, so it overlaps the next forward pass), and both
  /// Sample and RecordOutput advance it. Set before the first Sample / RecordOutput.
  void SetGrammar(std::unique_ptr<common::GrammarMatcher> grammar);
  /// True when a grammar constrains the sequence (it then never speculates: Distribution
  /// and PenalizedArgmax ignore the grammar).
  bool constrained() const { return grammar_ != nullptr; }
  /// The grammar's matcher, or null.
  const common::GrammarMatcher* grammar() const { return grammar_.get(); }

  /// True when Sample picks the argmax (temperature 0 or top_k 1) and draws nothing.
  bool greedy() const { return params_.temperature == 0.0f || params_.top_k == 1; }

  /// The distribution Sample draws its next token from, for `logits` [vocab_size]: the
  /// penalties, top-k, temperature, min-p and top-p applied exactly as Sample applies
  /// them, as probabilities into `probs` [vocab_size] (0 outside the kept tokens, sum 1;
  /// one-hot at the argmax when greedy). The penalties count `pending` as if those tokens
  /// had been recorded after the outputs so far (speculative drafts not yet accepted).
  /// Neither the RNG nor the recorded tokens change.
  void Distribution(const float* logits, absl::Span<const int32_t> pending, float* probs);

  /// The argmax of `logits` [vocab_size] after the penalties (counting `pending` as
  /// Distribution does): what a greedy Sample picks, without a distribution.
  int32_t PenalizedArgmax(const float* logits, absl::Span<const int32_t> pending);

  /// A uniform double in [0, 1) that is a function of the seed, `position` (the index in
  /// the sequence of the token it helps decide) and `stream` alone: a counter-based draw,
  /// independent of the RNG and of every other (position, stream). Speculative decoding
  /// with a draft model draws its uniforms here, so a token's randomness never depends on
  /// how many numbers earlier steps consumed (which a resumed sequence cannot know), and
  /// no uniform ever decides two emitted tokens.
  double PositionUniform(int64_t position, uint32_t stream) const;

  /// The tokens the penalties touch, appended to `tokens` with how often each was
  /// generated in `counts` (0 for a token only seen in the prompt): what a device sampler
  /// needs to apply the same penalties. Nothing without penalties. `pending` counts as
  /// Distribution's does: each pending token generated once more (speculative drafts
  /// before the row's position).
  void PenaltyEntries(std::vector<int32_t>& tokens, std::vector<int32_t>& counts,
                      absl::Span<const int32_t> pending = {}) const;

  const SamplingParams& params() const { return params_; }

  /// True while logit_bias or min_tokens changes the next token's logits (the device
  /// sampler applies neither: such rows sample on the host).
  bool adjusts_logits() const {
    return !params_.logit_bias.empty() ||
           (num_outputs_ < params_.min_tokens && !params_.min_tokens_suppressed_ids.empty());
  }

 private:
  void ApplyPenalties(float* logits, absl::Span<const int32_t> pending = {}) const;
  // logit_bias, and min_tokens' suppression for the token after the outputs and `pending`.
  void ApplyBiasAndSuppression(float* logits, size_t num_pending) const;
  // `logits` with the penalties applied (in scratch_), or `logits` itself without them.
  const float* Penalized(const float* logits, absl::Span<const int32_t> pending);
  // Fills candidates_/weights_ with the tokens the filters keep, in draw order, and
  // returns how many of them the draw walks (top-p's cut) with their total weight in
  // `sum`; 0 when no logit is finite.
  size_t BuildCandidates(const float* logits, double& sum);
  int32_t PickFromDistribution(const float* logits);
  // `logits` (or scratch_ holding them) with the tokens the grammar forbids at -inf, in
  // scratch_; the end-of-text token when the grammar allows nothing (a dead end). When
  // penalties, biases or min_tokens left none of the allowed tokens finite, the allowed
  // ones take the model's `raw` logits: the grammar outranks the other constraints.
  const float* Masked(const float* logits, const float* raw);
  // Advances the grammar over `token` and starts computing the next mask.
  void AdvanceGrammar(int32_t token);

  SamplingParams params_;
  int64_t vocab_size_;
  std::mt19937_64 rng_;
  int64_t num_outputs_ = 0;                               // tokens sampled or recorded
  absl::flat_hash_map<int32_t, int32_t> output_counts_;  // token -> times generated
  absl::flat_hash_map<int32_t, bool> seen_;              // prompt or output tokens
  std::vector<float> scratch_;                           // [vocab_size]
  std::string grammar_error_;  // set by Masked at a dead end, for Sample to report
  std::vector<std::pair<float, int32_t>> candidates_;    // (logit, id)
  std::vector<double> weights_;                          // exp((logit - max) / T)
  std::unique_ptr<common::GrammarMatcher> grammar_;      // null: unconstrained
  // The mask for the grammar's current state, being computed (valid() when started).
  std::future<std::shared_ptr<const common::TokenMask>> next_mask_;
};

/// log-softmax of `logits` at `token_id`, and the `n` most likely tokens.
SampledToken RawLogprobs(const float* logits, int64_t vocab_size, int32_t token_id, int32_t n);

/// `token` into a step result's `output`: its id, a dead end's error, an embedding, and with
/// `with_logprobs` its log-probabilities.
void WriteSampledToken(const SampledToken& token, bool with_logprobs,
                       loom::v1::SequenceOutput& output);

}  // namespace loom::worker
