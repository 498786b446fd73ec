#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace loom::worker {

/// One step of work for the forward pass: the tokens of many sequences flattened into
/// one batch (Orca's selective batching). Prefills, prefill chunks and decodes look the
/// same: sequence s computes tokens [num_computed, num_computed + q) whose K/V go to the
/// slots named here; attention reads its first context_len[s] tokens through its block
/// table. Invariant (checked by ValidateStepBatch): the per-token arrays have
/// query_start.back() entries and agree with the per-sequence block tables.
struct StepBatch {
  std::vector<int32_t> token_ids;      // [num_tokens]
  std::vector<int32_t> positions;      // [num_tokens]
  std::vector<int32_t> slots;          // [num_tokens]: block * block_size + offset
  std::vector<int32_t> query_start;    // [num_seqs + 1], query_start[0] == 0
  std::vector<int32_t> context_len;    // [num_seqs]: tokens in KV after this step
  std::vector<int32_t> block_indptr;   // [num_seqs + 1], block_indptr[0] == 0
  std::vector<int32_t> block_indices;  // [block_indptr.back()]
  std::vector<int32_t> sample_rows;    // token rows whose logits the step returns
  uint64_t step_id = 0;                // the plan's (labels a pipeline stage's messages)

  StepBatch() : query_start{0}, block_indptr{0} {}
  /// Back to the empty batch, keeping the arrays' capacity.
  void Clear();
  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(context_len.size()); }
};

/// Appends one sequence computing `new_tokens` after `num_computed` tokens already in
/// its KV, with `block_ids` covering at least num_computed + new_tokens.size() slots.
/// When `sample_last`, its last token's logits are returned. InvalidArgument when the
/// blocks are too few or new_tokens is empty.
absl::Status AppendSequence(StepBatch& batch, absl::Span<const int32_t> new_tokens,
                            int32_t num_computed, absl::Span<const int32_t> block_ids,
                            int32_t block_size, bool sample_last);

/// Checks everything a step could get wrong from a peer: ids within the vocabulary,
/// positions within the context length, blocks and slots within the pool, CSR arrays
/// consistent, positions and slots matching the block tables. InvalidArgument naming the
/// sequence or token and the bad value.
absl::Status ValidateStepBatch(const StepBatch& batch, int64_t vocab_size,
                               int64_t context_length, int64_t num_blocks, int64_t block_size);

}  // namespace loom::worker
