#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// Most context splits (FlashDecoding partitions) one sequence's decode is cut into.
inline constexpr int kPagedDecodeMaxSplits = 64;
/// The heuristic never makes a partition shorter than this many tokens.
inline constexpr int64_t kPagedDecodeMinPartition = 256;

/// Decode attention: one query token per sequence over its paged K/V, the same semantics as
/// cpu::PagedAttention with one query token per sequence (the query sits at position
/// context_len - 1 and attends to all context_len tokens, this step's already written, or
/// with a sliding window of W tokens to the last W of them; positions before the window
/// are never read, so their blocks may have been freed and reused).
/// Each (sequence, KV head, context split) is one block handling every query head of the
/// KV head's group (any GQA ratio); with more than one split, a second kernel merges the
/// partial softmax results from `workspace`.
///
/// Block tables live on the device and are trusted (the host validates the step batch, as
/// worker::ValidateStepBatch does). The kernel still never reads outside the pool: a
/// sequence whose table is too short or names a block outside the pool gets NaN outputs.
struct PagedDecodeParams {
  const void* q = nullptr;  // [num_seqs] rows of [num_heads, head_dim] of q_dtype, q_stride apart
  void* out = nullptr;      // [num_seqs, num_heads, head_dim] of q_dtype
  /// A second copy of out rounded to out_low_dtype (F16 or BF16), for a GEMM that reads the
  /// attention output in that type (the output projection), written by whichever kernel writes
  /// out: no conversion launch between them. Null: none.
  void* out_low = nullptr;
  DataType out_low_dtype = DataType::kF16;
  DataType q_dtype = DataType::kF16;       // F32 or cache.dtype; F32 for an 8-bit cache
  KvCacheView cache;                       // head_dim 64, 128 or 256; k and v 16-byte aligned
  const int32_t* context_len = nullptr;    // [num_seqs], device: KV tokens, this step's included
  const int32_t* block_indptr = nullptr;   // [num_seqs + 1], device: CSR offsets into block_indices
  const int32_t* block_indices = nullptr;  // [block_indptr[num_seqs]], device: block ids in order
  int64_t num_seqs = 0;                    // in [0, 65535]
  int64_t num_heads = 0;                   // a positive multiple of cache.num_kv_heads
  int64_t q_stride = 0;  // elements between sequences' q rows; 0: num_heads * head_dim
  float scale = 0.0f;    // finite, usually 1 / sqrt(head_dim)
  /// Sliding window (Mistral's and Gemma's local layers): the query attends to positions
  /// [max(0, context_len - window), context_len); 0: the whole context.
  int64_t window = 0;  // in [0, 2^31)
  /// Soft-capping (Gemma 2): each scaled score s becomes softcap * tanh(s / softcap)
  /// before the softmax; 0: none.
  float softcap = 0.0f;  // finite, >= 0
  /// Attention sinks (gpt-oss): a logit per query head that joins its softmax's
  /// denominator only (weights exp(s_j) / (exp(sink) + sum_j exp(s_j)), summing to less
  /// than 1), as cpu::PagedAttentionParams::sinks. Added once per head, in the split-KV
  /// reduction when the context is split.
  const float* sinks = nullptr;  // [num_heads] F32 on the device, 4-byte aligned; nullptr: none
  /// An upper bound of context_len over the batch (known on the host); it sizes the
  /// splits. A longer sequence is still attended in full (its last split runs longer).
  int64_t max_context_len = 0;  // >= 1
  int num_splits = 0;           // 0: ChoosePagedDecodeSplits; else in [1, kPagedDecodeMaxSplits]
  void* workspace = nullptr;    // device scratch, >= PagedDecodeWorkspaceBytes(*this) bytes
  size_t workspace_bytes = 0;
};

/// Splits of the context for the fewest partial waves: blocks run in waves of `num_sms`
/// multiprocessors holding `resident_blocks_per_sm` each (the occupancy of the kernel
/// instantiation that runs, asked of the device; clamped to [1, 4]), so the time goes as
/// the waves times a partition's tokens plus a fixed cost per split; the cheapest count
/// wins (the H200 measured one wave plus 4 blocks, 50 splits of 8 blocks on 396 slots, at
/// half the speed of 49). Never partitions shorter than kPagedDecodeMinPartition tokens,
/// at most kPagedDecodeMaxSplits, at most two waves of blocks (1 when the (sequence, KV
/// head) blocks already make them). `blocks_per_split` = num_seqs * num_kv_heads * head
/// chunks.
int ChoosePagedDecodeSplits(int64_t blocks_per_split, int64_t max_context_len, int num_sms,
                            int resident_blocks_per_sm);

/// Tokens one sequence's query attends to at most: max_context_len, or the window when it
/// is shorter. The splits cut this length.
int64_t PagedDecodeAttendedLength(const PagedDecodeParams& params);

/// Workspace bytes a launch with these params may need: for num_splits when set, else for
/// the most splits the heuristic picks on a GPU of up to 256 multiprocessors (a batch that
/// fills the GPU needs none). 0 when no split is possible.
size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& params);

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run:
/// checked before any CUDA call.
absl::Status CheckPagedDecodeParams(const PagedDecodeParams& params);

/// Asynchronous on `stream`; thread-safe (no state; the workspace is the caller's).
/// FailedPrecondition without CUDA; launch errors are Internal.
absl::Status LaunchPagedDecode(const PagedDecodeParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
