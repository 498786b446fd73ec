#pragma once

// Prefill attention's tuning space: other tilings of LaunchPagedPrefill's kernel (warps per
// block, 16-row M-tiles per warp, KV tokens per shared-memory tile), launched by index so that
// `cuda_attention_bench --sweep` can time each against the dispatched one on a lent GPU and the
// kernel tests can hold each against the CPU reference. Serving never launches them; a tiling
// that wins becomes head dim 128's DispatchedTiling (prefill_attention.cuh). Index 0 is the
// dispatched tiling itself.

#include <string_view>

#include "absl/status/status.h"
#include "kernels/cuda/prefill_attention.h"

namespace loom::kernels::cuda {

/// Tilings in the space (the dispatched one included, at index 0).
int PagedPrefillCandidateCount();

/// "w<warps>_m<M-tiles>_n<KV tile>"; index in [0, PagedPrefillCandidateCount()).
std::string_view PagedPrefillCandidateName(int index);

/// LaunchPagedPrefill with tiling `index`. Only the shapes the sweep times are compiled: head
/// dim 128, a BF16 or F16 cache (not 8-bit) and query, output in the cache's dtype
/// (InvalidArgument otherwise).
absl::Status LaunchPagedPrefillCandidate(const PagedPrefillParams& params, int index,
                                         cudaStream_t stream);

}  // namespace loom::kernels::cuda
