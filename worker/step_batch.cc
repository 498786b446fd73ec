#include "worker/step_batch.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace loom::worker {
namespace {

// The index of the first value outside [0, limit), or -1.
int64_t FirstOutside(const std::vector<int32_t>& values, int64_t limit) {
  // Unsigned compare: a negative value wraps above any limit. The all-in-range case (every
  // step) is one vectorizable pass with no early exit.
  const uint32_t bound = static_cast<uint32_t>(std::min<int64_t>(limit, UINT32_MAX));
  auto outside = [bound](int32_t v) {
    return static_cast<uint32_t>(static_cast<uint32_t>(v) >= bound);
  };
  // Fixed 16-wide chunks: GCC vectorizes them at -O2, where an open-ended loop stays scalar.
  const int32_t* v = values.data();
  const size_t n = values.size();
  uint32_t any = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (size_t k = 0; k < 16; ++k) any |= outside(v[i + k]);
  }
  for (; i < n; ++i) any |= outside(v[i]);
  if (any == 0) return -1;
  for (i = 0; i < n; ++i) {
    if (outside(v[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

void StepBatch::Clear() {
  token_ids.clear();
  positions.clear();
  slots.clear();
  query_start.assign(1, 0);
  context_len.clear();
  block_indptr.assign(1, 0);
  block_indices.clear();
  sample_rows.clear();
}

absl::Status AppendSequence(StepBatch& batch, absl::Span<const int32_t> new_tokens,
                            int32_t num_computed, absl::Span<const int32_t> block_ids,
                            int32_t block_size, bool sample_last) {
  if (new_tokens.empty()) return absl::InvalidArgumentError("a sequence needs at least one new token");
  if (num_computed < 0 || block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_computed %d and block_size %d must be non-negative / positive", num_computed,
        block_size));
  }
  const int64_t total = static_cast<int64_t>(num_computed) + new_tokens.size();
  if (static_cast<int64_t>(block_ids.size()) * block_size < total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d blocks of %d slots cannot hold %d tokens", block_ids.size(), block_size, total));
  }
  for (size_t i = 0; i < new_tokens.size(); ++i) {
    const int32_t position = num_computed + static_cast<int32_t>(i);
    batch.token_ids.push_back(new_tokens[i]);
    batch.positions.push_back(position);
    batch.slots.push_back(block_ids[position / block_size] * block_size + position % block_size);
  }
  batch.query_start.push_back(static_cast<int32_t>(batch.token_ids.size()));
  batch.context_len.push_back(static_cast<int32_t>(total));
  batch.block_indices.insert(batch.block_indices.end(), block_ids.begin(), block_ids.end());
  batch.block_indptr.push_back(static_cast<int32_t>(batch.block_indices.size()));
  if (sample_last) batch.sample_rows.push_back(batch.query_start.back() - 1);
  return absl::OkStatus();
}

absl::Status ValidateStepBatch(const StepBatch& batch, int64_t vocab_size,
                               int64_t context_length, int64_t num_blocks, int64_t block_size) {
  const int64_t num_tokens = batch.num_tokens();
  const int64_t num_seqs = batch.num_seqs();
  if (num_tokens == 0 || num_seqs == 0) return absl::InvalidArgumentError("empty step");
  if (static_cast<int64_t>(batch.positions.size()) != num_tokens ||
      static_cast<int64_t>(batch.slots.size()) != num_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step has %d tokens but %d positions and %d slots", num_tokens, batch.positions.size(),
        batch.slots.size()));
  }
  if (static_cast<int64_t>(batch.query_start.size()) != num_seqs + 1 ||
      static_cast<int64_t>(batch.block_indptr.size()) != num_seqs + 1 ||
      batch.query_start[0] != 0 || batch.query_start[num_seqs] != num_tokens ||
      batch.block_indptr[0] != 0 ||
      batch.block_indptr[num_seqs] != static_cast<int64_t>(batch.block_indices.size())) {
    return absl::InvalidArgumentError("step's query_start / block_indptr arrays are inconsistent");
  }
  // Range checks as branch-free reductions (the block tables cover every sequence's
  // context: this loop is the step's longest); the message needs the first offender.
  if (const int64_t t = FirstOutside(batch.token_ids, vocab_size); t >= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "token %d: id %d is outside the vocabulary [0, %d)", t, batch.token_ids[t], vocab_size));
  }
  if (const int64_t i = FirstOutside(batch.block_indices, num_blocks); i >= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "block id %d is outside the KV pool [0, %d)", batch.block_indices[i], num_blocks));
  }
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_begin = batch.query_start[s], q_end = batch.query_start[s + 1];
    const int64_t ctx = batch.context_len[s];
    const int64_t blocks = batch.block_indptr[s + 1] - batch.block_indptr[s];
    if (q_end <= q_begin || ctx < q_end - q_begin) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: %d query tokens with context length %d", s, q_end - q_begin, ctx));
    }
    if (ctx > context_length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: context of %d tokens exceeds the model's context length %d", s, ctx,
          context_length));
    }
    if (blocks * block_size < ctx) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sequence %d: %d blocks cannot hold %d tokens", s, blocks, ctx));
    }
    const int32_t* table = batch.block_indices.data() + batch.block_indptr[s];
    for (int64_t t = q_begin; t < q_end; ++t) {
      const int64_t position = ctx - (q_end - t);
      if (batch.positions[t] != position) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "token %d of sequence %d: position %d, the block table says %d", t, s,
            batch.positions[t], position));
      }
      const int64_t slot = static_cast<int64_t>(table[position / block_size]) * block_size +
                           position % block_size;
      if (batch.slots[t] != slot) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "token %d of sequence %d: slot %d, the block table says %d", t, s, batch.slots[t], slot));
      }
    }
  }
  for (int32_t row : batch.sample_rows) {
    if (row < 0 || row >= num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sample row %d is outside the step's %d tokens", row, num_tokens));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::worker
