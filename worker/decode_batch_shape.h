#pragma once

#include <cstdint>

#include "worker/step_batch.h"

// How the CUDA forward pass shapes a step for the decode kernel and its graphs (host code,
// no CUDA): one-token sequences, padded to a graph's batch bucket.

namespace loom::worker {

/// The step the decode kernel would run for `batch`: every query token becomes its own one-token
/// sequence with context_len = position + 1 over the first ceil((position + 1) / block_size) blocks
/// of its sequence's table, which is exactly causal attention (this step's K/V are written before
/// attention reads them). Token ids, positions, slots and sample rows are unchanged; a batch
/// ValidateStepBatch accepts stays accepted. A decode step maps to itself (up to trailing
/// blocks). The forward pass uses it for decode steps; multi-token steps go to the prefill
/// kernel, for which this is the reference path. Exposed for tests (the CPU forward pass checks
/// it gives the same logits).
StepBatch ExpandToSingleTokenSequences(const StepBatch& batch, int64_t block_size);

/// Pads a batch of one-token sequences to `num_seqs` sequences (a CUDA graph bucket) and
/// `num_samples` sample rows: dummy token 0 at position 0 writing slot
/// scratch_block * block_size, its table {scratch_block}; extra sample rows repeat row 0.
/// The real rows' results do not change. Exposed for tests.
void PadDecodeBatch(StepBatch& batch, int64_t num_seqs, int64_t num_samples, int32_t scratch_block,
                    int64_t block_size);

}  // namespace loom::worker
