#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace loom::kernels::cpu {

/// Speculative decoding's verification for a batch of sequences (Leviathan et al. 2023,
/// Chen et al. 2023): sequence s proposed k_s draft tokens; the target model scored them
/// in one pass. Rows are in CSR form: sequence s owns target rows
/// [row_start[s], row_start[s+1]) = k_s + 1 rows (one per draft token and the bonus
/// position) and draft rows [row_start[s] - s, row_start[s+1] - s - 1) = k_s rows.
///
/// Greedy (`greedy[s]`): accept drafts while each equals the target's argmax (lowest id on
/// ties); the next token is the argmax at the first mismatch, or the bonus row's.
/// Sampling: accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)) using uniform
/// u[row] (accept when u < p/q); at the first rejection the next token is drawn from
/// norm(max(0, p_i - q_i)) with sample_uniforms[row of x_i] (or, with sample_uniforms
/// null, the uniform u of the bonus row); after k acceptances from the bonus row's p with
/// sample_uniforms[bonus row] (or u of the bonus row). The emitted tokens are then
/// distributed exactly as the target's own samples. `draft_probs` null: one-hot proposals
/// (n-gram lookup), q_i(x_i) = 1. Per-row sample uniforms let a caller key every uniform to
/// the position whose token it decides, so no uniform ever decides two emitted tokens.
/// Uniforms come from the caller (each sequence's seeded RNG), so the result is a pure
/// function of its inputs and a GPU kernel can match it bit for bit.
struct SpeculativeVerifyParams {
  const float* target_probs = nullptr;  // [row_start[num_seqs], vocab], each row sums to 1
  const float* draft_probs = nullptr;   // [row_start[num_seqs] - num_seqs, vocab] or null
  const int32_t* draft_tokens = nullptr;  // [row_start[num_seqs] - num_seqs]
  const float* uniforms = nullptr;      // [row_start[num_seqs]] in [0, 1)
  const float* sample_uniforms = nullptr;  // [row_start[num_seqs]] in [0, 1), or null
  const int32_t* row_start = nullptr;   // [num_seqs + 1], row_start[0] == 0
  const uint8_t* greedy = nullptr;      // [num_seqs]: 1 = greedy
  int64_t num_seqs = 0;
  int64_t vocab = 0;
  // Outputs.
  int32_t* num_accepted = nullptr;      // [num_seqs]: drafts accepted, 0..k_s
  int32_t* next_token = nullptr;        // [num_seqs]: the token after the accepted drafts
};

/// InvalidArgument (nothing written) for inconsistent rows or a draft token outside the
/// vocabulary.
absl::Status SpeculativeVerify(const SpeculativeVerifyParams& params);

/// What SpeculativeVerify decides for one sequence.
struct VerifiedDrafts {
  int32_t accepted = 0;  // drafts accepted, 0..k
  int32_t next = 0;      // the token after them
};

/// SpeculativeVerify for one sampling (not greedy) sequence of k = drafts.size() drafts:
/// `target_probs` its k + 1 rows, `draft_probs` its drafts' q rows, `uniforms` and
/// `sample_uniforms` one per row. Errors as SpeculativeVerify's.
absl::StatusOr<VerifiedDrafts> VerifySampledDrafts(const float* target_probs,
                                                   const float* draft_probs,
                                                   absl::Span<const int32_t> drafts,
                                                   const float* uniforms,
                                                   const float* sample_uniforms, int64_t vocab);

}  // namespace loom::kernels::cpu
