#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// Largest vocabulary the sampler takes (its fixed-point probability sums fit 64 bits).
inline constexpr int64_t kSamplingMaxVocab = int64_t{1} << 23;

/// One row's sampling parameters, as worker::SamplingParams (validated on the host by
/// worker::ValidateSamplingParams; out-of-range values never make the kernel read or
/// write out of bounds). Plain data, copied to the device as an array.
struct SamplingRowParams {
  float temperature = 1.0f;         // >= 0; 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;                // 0 (or >= vocab): off; 1: greedy
  float top_p = 1.0f;               // (0, 1]; 1: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float presence_penalty = 0.0f;    // 0: off
  float frequency_penalty = 0.0f;   // 0: off
  uint32_t reserved = 0;            // padding, ignored
  uint64_t seed = 0;                // the row's sequence seed
  /// The row's draw counter: the number of tokens this sequence sampled before (greedy
  /// steps included, or not: any numbering the caller keeps per sequence). The same
  /// (seed, step) gives the same random draw, whatever the batch or row position.
  uint64_t step = 0;
};
static_assert(sizeof(SamplingRowParams) == 48, "the device reads this layout");

/// Picks one token per row of logits on the GPU with worker::SequenceSampler's semantics:
///  1. Penalties on a copy of the logits (in `workspace`), for the tokens listed in the
///     row's CSR range: the repetition penalty (HF: logit / p when positive, * p when not)
///     on every listed token, then presence + frequency * count subtracted from those with
///     count > 0 (float arithmetic, no fused multiply-add, as the CPU).
///  2. temperature 0 or top_k 1: the argmax of the penalized logits, lowest id on ties
///     (bit-exact with the CPU's Argmax: NaN logits are never chosen; a row of NaNs only
///     gives token 0).
///  3. Otherwise, in the order (logit descending, id ascending): keep the top_k first;
///     weights exp((logit - max) / temperature); drop those below min_p (the max's weight
///     is 1); keep the shortest prefix whose weight reaches top_p of the kept sum; draw one
///     token with probability proportional to its weight.
/// The chosen token's logprob is the log-softmax of the raw (unpenalized) logits, as
/// SampledToken::logprob.
///
/// Differences from the CPU sampler, by design:
///  - The random stream: a Philox4x32-10 draw keyed by (seed, step) (SamplingRandomBits),
///    not std::mt19937_64; the same seed gives a different (equally distributed) token.
///  - Weights are F32 (exp2f) turned into 40-bit fixed point, summed exactly in 64-bit
///    integers (so the result is deterministic and independent of thread order); the CPU
///    sums doubles. A token whose weight is below 2^-40 of the max's is never drawn, and
///    the min_p / top_p boundaries may differ from the CPU's when a weight or a cumulative
///    sum lies within F32 rounding of the threshold.
///  - Non-finite maximum (every logit -inf or NaN, or a +inf logit): the argmax is taken.
///  - NaN logits count as -inf when sampling.
///  - Only the chosen token's logprob (no top-n logprobs).
struct SampleTokensParams {
  const float* logits = nullptr;  // [num_rows] rows of [vocab_size], logits_stride apart, device
  int64_t logits_stride = 0;      // elements between rows; 0: vocab_size
  int64_t num_rows = 0;           // in [0, 2^31)
  int64_t vocab_size = 0;         // in [1, kSamplingMaxVocab]
  const SamplingRowParams* rows = nullptr;  // [num_rows], device
  /// Penalties, in CSR form; all three null: no penalties (and no workspace needed).
  /// Row r's entries are [penalty_indptr[r], penalty_indptr[r + 1]): each a distinct token
  /// the sequence has seen (prompt or output; the repetition penalty applies to all) and
  /// how often it was generated (presence / frequency apply where > 0). Ids outside the
  /// vocabulary are ignored.
  const int32_t* penalty_indptr = nullptr;  // [num_rows + 1], device
  const int32_t* penalty_tokens = nullptr;  // [penalty_indptr[num_rows]], device
  const int32_t* penalty_counts = nullptr;  // [penalty_indptr[num_rows]], device: output counts
  float* workspace = nullptr;               // device, >= SampleTokensWorkspaceBytes(*this)
  size_t workspace_bytes = 0;
  int32_t* tokens = nullptr;  // [num_rows], device: the chosen ids
  float* logprobs = nullptr;  // [num_rows], device: their raw log-softmax; null: not wanted
  /// [num_rows, vocab_size], device, or null: each row's distribution the token is drawn from,
  /// as worker::SequenceSampler::Distribution gives it (speculative decoding's target p):
  /// the kept weights over their total (F32 of the fixed-point quotient), 0 for the others;
  /// a one-hot at the argmax for a greedy row or one whose filters keep no weight.
  float* probs = nullptr;
};

/// Workspace bytes a launch with these params needs: the penalized logits
/// (num_rows * vocab_size floats) when penalties are given, else 0.
size_t SampleTokensWorkspaceBytes(const SampleTokensParams& params);

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run:
/// checked before any CUDA call.
absl::Status CheckSampleTokensParams(const SampleTokensParams& params);

/// One block per row, asynchronous on `stream`; thread-safe (no state; the workspace is
/// the caller's). FailedPrecondition without CUDA; launch errors are Internal.
absl::Status LaunchSampleTokens(const SampleTokensParams& params, cudaStream_t stream);

/// The 64 random bits a sampling row with (seed, step) draws: the first two 32-bit words
/// of Philox4x32-10 with key (seed low, seed high) and counter (step low, step high, 0, 0),
/// low word first. The row picks the token where the kept weights' running sum (in id
/// order) first exceeds floor(bits * total / 2^64). Host-side, for tests and tools.
uint64_t SamplingRandomBits(uint64_t seed, uint64_t step);

}  // namespace loom::kernels::cuda
