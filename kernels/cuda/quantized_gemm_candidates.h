#pragma once

// The quantized GEMM's tuning space: members beyond the dispatch table
// (internal::kQuantGemmCandidates), launched by index so that `quantized_gemm_bench --sweep` can
// time each of them against the table's member at every m on a lent GPU, and the kernel tests can
// hold each against the CPU reference. Serving never launches them; a candidate that wins a range
// of m moves into the table.

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "kernels/cuda/quantized_gemm.h"

namespace loom::kernels::cuda {

/// Members of the tuning space.
int QuantGemmCandidateCount();

/// Candidate `index`'s tile (its name, block_m, block_n, step_k, threads); index in
/// [0, QuantGemmCandidateCount()).
QuantGemmTile QuantGemmCandidateTile(int index);

/// Split-K partitions candidate `index` takes for m x n x k on `num_sms` multiprocessors when
/// num_splits is 0 (ChooseQuantGemmSplits' rule with the candidate's tile and target).
int QuantGemmCandidateSplits(int index, int64_t m, int64_t n, int64_t k, int num_sms);

/// LaunchQuantGemm with candidate `index` in place of the dispatch table's member. F16
/// activations with INT4 weights in groups of 128 (F16 scale and min) or INT8 weights per output
/// channel only (InvalidArgument otherwise); Unimplemented for a member whose pipeline would not
/// fit sm_86's shared memory in that format (also with m = 0, which launches nothing). The
/// workspace must hold num_splits x m x n floats (the splits this call uses); counters, when given,
/// one word per output tile.
absl::Status LaunchQuantGemmCandidate(const QuantGemmParams& params, int index,
                                      cudaStream_t stream);

}  // namespace loom::kernels::cuda
