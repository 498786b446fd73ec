#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/formats/gguf_file.h"
#include "worker/forward_pass.h"
#include "worker/sampler.h"
#include "worker/step_batch.h"

namespace loom::worker {

/// One speculating sequence as the draft model sees it in one step.
struct DraftRequest {
  absl::Span<const int32_t> tokens;  // the sequence's known tokens: prompt, then outputs (n)
  // Leading tokens whose K/V the draft model holds in its pool, < tokens.size(): 0 for a
  // sequence it has not seen (new, or resumed after a preemption).
  int64_t num_draft_computed = 0;
  // The sequence's blocks after this step's new ones (the target's table: block b is the
  // same slots in both pools); covers tokens.size() + max_drafts - 1 slots.
  absl::Span<const int32_t> block_table;
  int32_t max_drafts = 0;              // drafts wanted, >= 0
  SequenceSampler* sampler = nullptr;  // the sequence's: its sampling parameters and seed
};

/// What the draft model proposed for one sequence.
struct DraftProposal {
  std::vector<int32_t> tokens;  // [k], k <= max_drafts (less only at the draft's context end)
  // [k, vocab]: the distribution q each draft was drawn from (the sequence's sampling
  // transforms over the draft's logits); empty for a greedy sequence (one-hot drafts).
  std::vector<float> probs;
};

/// Draft-model speculation: a second model with the target's vocabulary, run by the same
/// worker, proposes each speculating sequence's next k tokens. Its KV pool has the
/// target's block count and block size and is addressed through the target's block
/// tables (the coordinator's), so it needs no blocks of its own. Per step it first
/// catches up on the tokens it has not seen (the prompt on a first proposal, the tokens
/// the last verification emitted after that) in one batched pass that also yields each
/// sequence's first draft, then runs one batched single-token pass per further draft.
/// Drafts are drawn from the sequence's own sampling transforms applied to the draft's
/// logits (SequenceSampler::Distribution; the argmax for greedy sequences) with uniforms
/// from SequenceSampler::PositionUniform(position, kDraftSampleStream). On a draft forward
/// pass that samples on its device (CUDA), a greedy sequence's drafts are picked there
/// (ForwardPass::StepAndSample: the penalized argmax, the drafts before it counted in its
/// penalties) and only token ids cross; the others' logits come back for the host. The
/// draft's K/V past the accepted tokens are never read again: the caller tracks the valid
/// prefix (NumDraftComputedAfter). Not thread-safe.
class DraftProposer {
 public:
  /// `draft` must share the target's vocabulary of `vocab_size` tokens and have a KV pool
  /// of `num_kv_blocks` blocks of `block_size` tokens (the target's); InvalidArgument
  /// naming the mismatch otherwise. `max_pass_tokens` > 0 caps the tokens of one pass of
  /// the draft (a catch-up larger than that first runs in passes that sample nothing, as
  /// chunked prefill does; the CUDA forward pass reserves activations for that many); 0:
  /// one catch-up pass whatever its size.
  static absl::StatusOr<std::unique_ptr<DraftProposer>> Create(std::unique_ptr<ForwardPass> draft,
                                                               int64_t vocab_size,
                                                               int64_t num_kv_blocks,
                                                               int64_t block_size,
                                                               int64_t max_pass_tokens = 0);

  /// Proposes for every request (proposals[i] for requests[i]), writing the draft's K/V
  /// of tokens [num_draft_computed, n) and of the first k - 1 drafts at positions
  /// [n, n + k - 1). InvalidArgument for a request without a sampler, with nothing to
  /// catch up on, or whose blocks are too few; an error leaves the proposals unspecified.
  absl::Status Propose(absl::Span<const DraftRequest> requests,
                       std::vector<DraftProposal>& proposals);

  /// The draft's valid prefix after a step proposed `num_drafts` >= 1 drafts for a
  /// sequence of `num_tokens` known tokens and the target accepted `num_accepted` of them:
  /// the known tokens and the accepted drafts whose K/V the draft wrote.
  static int64_t NumDraftComputedAfter(int64_t num_tokens, int32_t num_drafts,
                                       int32_t num_accepted);

  const ForwardPass& model() const { return *draft_; }

 private:
  DraftProposer(std::unique_ptr<ForwardPass> draft, int64_t max_pass_tokens)
      : draft_(std::move(draft)), max_pass_tokens_(max_pass_tokens) {}

  // Appends the draft drawn from q = Distribution(logits, proposal.tokens) for the token at
  // `position`.
  void Draw(const DraftRequest& request, const float* logits, int64_t position,
            DraftProposal& proposal);
  // Whether `request`'s drafts are picked on the draft's device: a greedy sampler whose
  // logits the device sampler takes as they are (no logit_bias, min_tokens or grammar).
  bool DrawsOnDevice(const DraftRequest& request) const;
  // Runs passes that sample nothing over the oldest unseen tokens of the speculating
  // requests (those with num_drafts[i] > 0) while their unseen tokens exceed
  // max_pass_tokens_, each pass at most that many and every request's last token left for
  // the sampling pass; computed[i] advances over what they wrote.
  absl::Status CatchUp(absl::Span<const DraftRequest> requests,
                       absl::Span<const int32_t> num_drafts, std::vector<int64_t>& computed);
  // Pass `pass` of Propose (batch_ holds its rows, requests[in_pass[r]] row r) on a device
  // that samples: greedy rows picked there, the others drawn from their logits.
  absl::Status StepAndDraw(absl::Span<const DraftRequest> requests,
                           absl::Span<const size_t> in_pass, int32_t pass,
                           std::vector<DraftProposal>& proposals);

  std::unique_ptr<ForwardPass> draft_;
  int64_t max_pass_tokens_ = 0;  // 0: no limit
  StepBatch batch_;            // one pass, rebuilt each time
  std::vector<float> logits_;  // [sequences in the pass (on the host), vocab]
  // StepAndDraw's rows and the device's picks.
  DeviceSampleRows device_rows_;
  std::vector<int32_t> device_tokens_;
  std::vector<float> device_logprobs_;
};

/// OK when `draft` can propose for `target`: the same vocabulary size, the same tokenizer
/// model and, where both carry one, the same token list. InvalidArgument naming the first
/// difference otherwise.
absl::Status CheckSameVocabulary(const common::GgufFile& target, const common::GgufFile& draft);

}  // namespace loom::worker
