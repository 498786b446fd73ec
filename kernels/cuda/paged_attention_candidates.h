#pragma once

// Decode attention's tuning space: other tilings of LaunchPagedDecode's kernel (threads per
// block, tokens per thread per tile, cp.async ring depth: internal::kDecodeTilings), launched
// by index so that `cuda_attention_bench --sweep` can time each against the dispatched one on a
// lent GPU and the kernel tests can hold each against the CPU reference. Serving never launches
// them; a tiling that wins becomes kDecodeTilings[0]. Index 0 is the dispatched tiling itself.

#include <string_view>

#include "absl/status/status.h"
#include "kernels/cuda/paged_attention.h"

namespace loom::kernels::cuda {

/// Tilings in the space (the dispatched one included, at index 0).
int PagedDecodeCandidateCount();

/// "t<threads>_p<passes>_s<stages>"; index in [0, PagedDecodeCandidateCount()).
std::string_view PagedDecodeCandidateName(int index);

/// LaunchPagedDecode with tiling `index`: index 0 is LaunchPagedDecode itself (every cache it
/// takes); the other tilings are compiled for Llama-3-style shapes only: head dim 128 and 3 or
/// more query heads per KV head, F16 K/V with an F16 query or INT8 K/V with an F32 query
/// (InvalidArgument otherwise); the tensor-core member takes F16 and BF16 (Unimplemented
/// otherwise). The workspace is sized by PagedDecodeWorkspaceBytes, as for LaunchPagedDecode.
absl::Status LaunchPagedDecodeCandidate(const PagedDecodeParams& params, int index,
                                        cudaStream_t stream);

}  // namespace loom::kernels::cuda
