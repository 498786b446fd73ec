#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// Query rows (packed (token, head-of-group) pairs) one prefill block computes (half at
/// head dim 256: 64).
inline constexpr int kPagedPrefillRowsPerBlock = 128;
/// KV tokens one prefill block stages in shared memory per step (half from head dim 128 on).
inline constexpr int kPagedPrefillKvTile = 64;

/// Causal prefill attention over paged K/V, the semantics of cpu::PagedAttention: sequence
/// s owns query tokens [query_start[s], query_start[s + 1]); query token j of a sequence
/// with q_len tokens sits at position context_len[s] - q_len + j and attends to KV
/// positions [0, that position], or with a sliding window of W tokens to
/// [max(0, position - W + 1), position]; positions before the first query's window are
/// never read (their blocks may have been freed and reused). This covers a whole prompt
/// (context_len == q_len), a prompt whose first blocks were cached earlier and chunked prefill
/// (context_len > q_len) alike; decode (q_len 1) works too, but LaunchPagedDecode is faster for it.
/// Any GQA ratio: a block takes one KV head and packs its group's query heads with the
/// tokens into kPagedPrefillRowsPerBlock rows (row r = token r / group, head r % group),
/// so each K/V tile is read once for the whole group.
///
/// FlashAttention-2 style on tensor cores (mma.sync m16n8k16, F16/BF16 inputs, F32
/// accumulation and softmax): Q and K/V tiles in F16/BF16, the probabilities rounded to
/// the cache dtype before the P·V product (the denominator is summed in F32).
///
/// Block tables live on the device and are trusted (the host validates the step batch).
/// The kernel still never reads outside the pool: the query tiles of a sequence whose
/// table is too short or names a block outside the pool, or whose context_len is shorter
/// than its query, get NaN outputs.
struct PagedPrefillParams {
  const void* q = nullptr;  // [num_tokens] rows of [num_heads, head_dim] of q_dtype, q_stride apart
  void* out = nullptr;      // [num_tokens, num_heads, head_dim] of out_dtype
  DataType q_dtype = DataType::kF16;       // must equal cache.dtype (the tensor cores' input)
  DataType out_dtype = DataType::kF16;     // F32 or cache.dtype
  KvCacheView cache;                       // head_dim 64, 128 or 256; k and v 16-byte aligned
  const int32_t* query_start = nullptr;    // [num_seqs + 1], device: CSR offsets of query tokens
  const int32_t* context_len = nullptr;    // [num_seqs], device: KV tokens, this step's included
  const int32_t* block_indptr = nullptr;   // [num_seqs + 1], device: CSR offsets into block_indices
  const int32_t* block_indices = nullptr;  // [block_indptr[num_seqs]], device: block ids in order
  int64_t num_seqs = 0;                    // in [0, 65535]
  int64_t num_heads = 0;                   // a positive multiple of cache.num_kv_heads
  /// Elements between tokens' q rows (a fused QKV buffer's row); 0: num_heads * head_dim.
  /// A multiple of 8, so that every row starts 16-byte aligned.
  int64_t q_stride = 0;
  float scale = 0.0f;  // finite, usually 1 / sqrt(head_dim)
  /// Sliding window (Mistral's and Gemma's local layers) in tokens; 0: the causal prefix.
  int64_t window = 0;  // in [0, 2^31)
  /// Soft-capping (Gemma 2): each scaled score s becomes softcap * tanh(s / softcap)
  /// before the softmax; 0: none.
  float softcap = 0.0f;  // finite, >= 0
  /// Attention sinks (gpt-oss): a logit per query head that joins its softmax's
  /// denominator only (weights exp(s_j) / (exp(sink) + sum_j exp(s_j)), summing to less
  /// than 1), as cpu::PagedAttentionParams::sinks.
  const float* sinks = nullptr;  // [num_heads] F32 on the device, 4-byte aligned; nullptr: none
  /// An upper bound of the query tokens of any sequence (known on the host); it sizes the
  /// grid. A longer sequence is still computed in full (its blocks loop over more tiles).
  int64_t max_query_len = 0;  // in [1, 2^31)
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run:
/// checked before any CUDA call.
absl::Status CheckPagedPrefillParams(const PagedPrefillParams& params);

/// Asynchronous on `stream`; thread-safe (no state). FailedPrecondition without CUDA;
/// launch errors are Internal.
absl::Status LaunchPagedPrefill(const PagedPrefillParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
