#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// Largest vocabulary the verify kernel takes (ids and per-row offsets stay in int32).
inline constexpr int64_t kSpeculativeVerifyMaxVocab = int64_t{1} << 24;

/// Speculative decoding's verification on the GPU, with the semantics of
/// kernels::cpu::SpeculativeVerify (kernels/cpu/speculative_verify.h): sequence s owns
/// target rows [row_start[s], row_start[s+1]) (k_s + 1 of them) and draft rows
/// [row_start[s] - s, row_start[s+1] - s - 1). Greedy sequences accept drafts while each
/// equals the target row's argmax (lowest id on ties); sampled sequences accept draft x_i
/// when u_i * q_i(x_i) < p_i(x_i) (q one-hot when draft_probs is null), draw the first
/// rejection's replacement from norm(max(0, p_i - q_i)) and, after k acceptances, the
/// bonus token from the bonus row's p, with the same uniforms as the CPU.
///
/// Arithmetic: the acceptance test and the residual weights max(0, p - q) are computed
/// in double exactly as on the CPU, so num_accepted always matches it. The inverse-CDF
/// draw sums the weights in double in a fixed order (warps own contiguous id segments,
/// 32-wide shuffle scans within a segment, segments added in warp order): the result is
/// deterministic (independent of timing) but the sums associate differently from the
/// CPU's sequential ones, so next_token may differ from the CPU's where u * total lies
/// within about vocab * 2^-52 (relative to the total) of a CDF boundary. Greedy argmax is
/// bit-exact with the CPU for inputs without NaN; NaN probabilities are unsupported.
struct SpeculativeVerifyParams {
  const float* target_probs = nullptr;     // [num_rows, vocab], device; rows sum to 1
  const float* draft_probs = nullptr;      // [num_rows - num_seqs, vocab], device, or null
  const int32_t* draft_tokens = nullptr;   // [num_rows - num_seqs], device
  const float* uniforms = nullptr;         // [num_rows] in [0, 1), device
  const float* sample_uniforms = nullptr;  // [num_rows] in [0, 1), device, or null
  const int32_t* row_start = nullptr;      // [num_seqs + 1], device
  /// The same values as row_start, on the host: validated before launch (row_start_host[0]
  /// == 0, every sequence has >= 1 row); the device copy must hold exactly these.
  const int32_t* row_start_host = nullptr;  // [num_seqs + 1], host
  const uint8_t* greedy = nullptr;          // [num_seqs], device: 1 = greedy
  int64_t num_seqs = 0;                     // in [0, 2^31)
  int64_t vocab = 0;                        // in [1, kSpeculativeVerifyMaxVocab]
  // Outputs.
  int32_t* num_accepted = nullptr;  // [num_seqs], device: drafts accepted, 0..k_s
  int32_t* next_token = nullptr;    // [num_seqs], device: the token after the accepted drafts
};

/// InvalidArgument (naming the field and value) for params the kernel cannot run: null
/// pointers, an inconsistent row_start_host, vocab or num_seqs out of range. Host only:
/// checked before any CUDA call. Draft tokens live on the device and cannot be checked
/// here: a sequence with a draft token outside [0, vocab) (or a device row_start that
/// disagrees with row_start_host so its rows fall outside the batch) gets num_accepted
/// = next_token = -1, without any read out of bounds (the CPU answers InvalidArgument).
absl::Status CheckSpeculativeVerifyParams(const SpeculativeVerifyParams& params);

/// One block per sequence, asynchronous on `stream`; thread-safe (no state).
/// FailedPrecondition without CUDA; launch errors are Internal.
absl::Status LaunchSpeculativeVerify(const SpeculativeVerifyParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
