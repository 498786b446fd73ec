#include "worker/decode_batch_shape.h"

namespace loom::worker {

// The forward pass calls this for decode steps only, where it maps the step to itself (up to
// trailing blocks) before graph padding; steps with multi-token sequences go to the
// prefill kernel over the batch's own CSR arrays. For multi-token batches it remains the
// reference path (one decode-kernel sequence per query token) that tests compare against.
StepBatch ExpandToSingleTokenSequences(const StepBatch& batch, int64_t block_size) {
  StepBatch expanded;
  expanded.token_ids = batch.token_ids;
  expanded.positions = batch.positions;
  expanded.slots = batch.slots;
  expanded.sample_rows = batch.sample_rows;
  const int64_t num_tokens = batch.num_tokens();
  expanded.query_start.resize(num_tokens + 1);
  expanded.context_len.resize(num_tokens);
  expanded.block_indptr.resize(num_tokens + 1);
  expanded.query_start[0] = 0;
  expanded.block_indptr[0] = 0;
  for (int64_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t* table = batch.block_indices.data() + batch.block_indptr[s];
    for (int64_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) {
      const int32_t context = batch.positions[t] + 1;
      const int64_t blocks = (context + block_size - 1) / block_size;
      expanded.query_start[t + 1] = static_cast<int32_t>(t + 1);
      expanded.context_len[t] = context;
      expanded.block_indices.insert(expanded.block_indices.end(), table, table + blocks);
      expanded.block_indptr[t + 1] = static_cast<int32_t>(expanded.block_indices.size());
    }
  }
  return expanded;
}

void PadDecodeBatch(StepBatch& batch, int64_t num_seqs, int64_t num_samples, int32_t scratch_block,
                    int64_t block_size) {
  while (batch.num_seqs() < num_seqs) {
    batch.token_ids.push_back(0);
    batch.positions.push_back(0);
    batch.slots.push_back(static_cast<int32_t>(scratch_block * block_size));
    batch.query_start.push_back(static_cast<int32_t>(batch.token_ids.size()));
    batch.context_len.push_back(1);
    batch.block_indices.push_back(scratch_block);
    batch.block_indptr.push_back(static_cast<int32_t>(batch.block_indices.size()));
  }
  while (static_cast<int64_t>(batch.sample_rows.size()) < num_samples)
    batch.sample_rows.push_back(0);
}

}  // namespace loom::worker
