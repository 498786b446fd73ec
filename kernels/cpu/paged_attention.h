#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace loom::kernels::cpu {

/// One layer's paged KV cache: [num_blocks, block_size, num_kv_heads, head_dim] for K and
/// for V. Slot s (= block * block_size + offset) holds one token's K/V.
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  KvDtype dtype = KvDtype::kF16;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  uint16_t* k_scale = nullptr;  // the 8-bit dtypes only
  uint16_t* v_scale = nullptr;
};

/// Writes new tokens' K/V into their slots (quantized, with their scales, for the 8-bit
/// dtypes). k, v: [num_tokens, num_kv_heads, head_dim];
/// slots: [num_tokens]. A view whose v is its k (a pool whose values are its keys: latent
/// attention's) takes v == k and writes once. InvalidArgument for a slot outside the pool.
absl::Status WriteKv(const KvLayerView& cache, const float* k, const float* v,
                     const int32_t* slots, int64_t num_tokens);

/// Causal attention of a flattened batch over paged K/V (prefill, chunked prefill and
/// decode alike). Sequence s owns query tokens [query_start[s], query_start[s+1]); its
/// KV holds context_len[s] tokens (including this step's, already written), spread over
/// blocks block_indices[block_indptr[s] .. block_indptr[s+1]). Query token j of a
/// sequence with q tokens sits at position context_len - q + j and attends to KV
/// positions [0, that position], or with a sliding window of W tokens only the last W of them
/// ([max(0, position - W + 1), position], as Mistral's and Gemma's local layers). Any GQA
/// ratio (num_heads % num_kv_heads == 0).
struct PagedAttentionParams {
  const float* q = nullptr;             // [num_tokens, num_heads, head_dim]
  float* out = nullptr;                 // [num_tokens, num_heads, head_dim]
  KvLayerView cache;
  const int32_t* query_start = nullptr; // [num_seqs + 1]
  const int32_t* context_len = nullptr; // [num_seqs]
  const int32_t* block_indptr = nullptr;   // [num_seqs + 1]
  const int32_t* block_indices = nullptr;  // [block_indptr[num_seqs]]
  int64_t num_seqs = 0;
  int64_t num_heads = 0;
  float scale = 0.0f;                   // usually 1 / sqrt(head_dim)
  // A tensor-parallel slice whose query heads need not line up with whole KV heads:
  // query head h (local) reads KV head (head0 + h) / group - kv_head0 of `cache`, with
  // `group` the model's query heads per KV head and head0 / kv_head0 the global indices
  // of the slice's first query and KV head. group 0: num_heads / num_kv_heads, no offsets.
  int64_t group = 0;
  int64_t head0 = 0;
  int64_t kv_head0 = 0;
  // Sliding-window attention: each query attends to at most the last `window` positions
  // (itself included); 0: the whole causal prefix.
  int64_t window = 0;
  // Soft-capping (Gemma 2): each scaled score s becomes softcap * tanh(s / softcap) before
  // the softmax; 0: none. Soft-capped attention runs the scalar per-token kernel.
  float softcap = 0.0f;
  // Attention sinks (gpt-oss): [num_heads], a logit per (local) query head that joins each
  // softmax's denominator and nothing else: weights exp(s_j) / (exp(sink) + sum_j exp(s_j)),
  // which sum to less than 1. nullptr: none.
  const float* sinks = nullptr;
  // kBf16 (--activations bf16): the queries, keys, values and softmax weights enter the two
  // products rounded to BF16, on AMX tiles (paged_attention_amx.cc), for F16, BF16 and F32 KV,
  // head dims a multiple of 16 and separate K and V pools without soft-capping; elsewhere
  // (8-bit KV, latent attention's shared pool, Gemma 2's capped scores) and for kF32 / kInt8,
  // float arithmetic throughout. FailedPrecondition where AMX-BF16 is not available
  // (ActivationPrecisionStatus).
  ActivationPrecision activations = ActivationPrecision::kF32;
};

/// InvalidArgument for inconsistent sizes, a block id outside the pool, or a sequence
/// whose blocks cannot hold context_len tokens (checked before computing). On AVX2 every
/// token runs in FlashAttention-style tiles (paged_attention_tiled.h), elsewhere per token;
/// either way a token's result depends only on its own sequence and position, never on
/// the rest of the batch, the thread count or how its prompt was split into steps.
absl::Status PagedAttention(const PagedAttentionParams& params, ThreadPool& pool);
/// In double precision; where the AMX-BF16 tiles would run (PagedAttentionParams::activations),
/// with their inputs rounded to BF16 as theirs are (a softmax weight relative to the running
/// max of the 32-position tiles seen so far, then scaled to the final max).
absl::Status PagedAttentionReference(const PagedAttentionParams& params);

}  // namespace loom::kernels::cpu
