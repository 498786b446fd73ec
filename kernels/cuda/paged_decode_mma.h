#pragma once

// Internal to kernels/cuda: decode attention on tensor cores (paged_decode_mma.cu), a member
// of decode attention's tuning space (paged_attention_candidates.h) beside the tilings of
// paged_attention.cu's kernel, and the host side both kernels share (their arguments, the
// splits, the split reduction), defined in paged_attention.cu.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/paged_attention.h"

namespace loom::kernels::cuda::internal {

struct DecodeArgs;  // paged_decode_internal.cuh

/// The decode kernels' arguments from checked params (InvalidArgument when the grid's head
/// dimension would overflow).
absl::StatusOr<DecodeArgs> MakeDecodeArgs(const PagedDecodeParams& params);

/// The splits a launch runs (params.num_splits, else ChoosePagedDecodeSplits for
/// `blocks_per_split` blocks, `resident` of which fit a multiprocessor), checked against the
/// workspace, with the arguments that depend on them (the partials' places, the partition).
absl::StatusOr<int> PlanDecodeSplits(const PagedDecodeParams& params, int64_t blocks_per_split,
                                     int resident, DecodeArgs& args);

/// Whether LaunchPagedDecodeMma takes these (checked) params: head dim 128, F16 or BF16 K/V
/// with a query of the same type or F32, at most 16 query heads per KV head, query rows aligned
/// to two of their elements (an even q_stride, the base likewise aligned).
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
