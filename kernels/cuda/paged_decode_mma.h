#pragma once

// Internal to kernels/cuda: decode attention on tensor cores (paged_decode_mma.cu), a member
// of decode attention's tuning space (paged_attention_candidates.h) beside the tilings of
// paged_attention.cu's kernel, and the split reduction both share.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/paged_attention.h"

namespace loom::kernels::cuda::internal {

/// Whether LaunchPagedDecodeMma takes these (checked) params: head dim 128, F16 K/V with an
/// F16 query, at most 16 query heads per KV head.
bool PagedDecodeMmaSupports(const PagedDecodeParams& params);

/// LaunchPagedDecode's semantics (windows, soft-capping, sinks, splits and their workspace,
/// NaN for a bad block table) on tensor cores; params checked and supported.
absl::Status LaunchPagedDecodeMma(const PagedDecodeParams& params, cudaStream_t stream);

/// Merges `num_splits` partial results per (sequence, query head) from `workspace` (acc
/// [seqs, heads, splits, head_dim], then max and sum [seqs, heads, splits]) into params.out,
/// adding the sinks once.
absl::Status LaunchPagedDecodeReduce(const PagedDecodeParams& params, int num_splits,
                                     cudaStream_t stream);

}  // namespace loom::kernels::cuda::internal
