#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/types.h"
#include "kernels/cuda_device.h"

namespace loom::kernels::cuda {

/// The fused QKV product's rows into attention's inputs in one launch, where a layer would
/// otherwise split them, normalize the heads of Q and K (QK-norm), rotate them and write K and
/// V (three to five launches): each token's row holds num_heads query heads, then the cache's
/// num_kv_heads key heads, then as many value heads (F32); the query heads go to q_out
/// normalized and rotated, the key heads normalized and rotated and the value heads as they are
/// into the token's slot of the cache. The rotation is LaunchRope's (the same float operations:
/// rope_internal.cuh), the stored values LaunchWriteKv's, so without QK-norm the results equal
/// LaunchRope then LaunchWriteKv on the split rows bit for bit; QK-norm is LaunchRmsNorm's
/// x * rsqrt(mean(x^2) + eps) * weight per head, its sum in another order. A cache of F16 or
/// BF16 elements; 8-bit caches take LaunchRope and LaunchWriteKv.
struct RopeWriteKvParams {
  const float* qkv = nullptr;          // [num_tokens] rows of (num_heads + 2 kv heads) x head_dim
  int64_t qkv_stride = 0;              // elements between tokens' rows; 0: the row's length
  float* q_out = nullptr;              // [num_tokens, num_heads, head_dim]; not overlapping qkv
  KvCacheView cache;                   // quant kNone
  const int32_t* slots = nullptr;      // [num_tokens], device: a negative slot (padding) is skipped
  const int32_t* positions = nullptr;  // [num_tokens], device (unread without inv_freq)
  const float* inv_freq = nullptr;     // [rope_dim / 2], device; null: no rotation (NoPE)
  int64_t num_tokens = 0;              // >= 0, < 2^31
  int64_t num_heads = 0;               // >= 1
  int64_t rope_dim = 0;                // with inv_freq: even, in [2, cache.head_dim]
  bool neox = false;                   // false: pairs (2i, 2i+1); true: (i, i + rope_dim / 2)
  float attention_factor = 1.0f;       // multiplies cos and sin (YaRN); > 0
  /// QK-norm (Qwen3's, Gemma 3's): each query head RMS-normalized with q_norm's weights, each
  /// key head with k_norm's, before the rotation. Both or neither.
  const float* q_norm = nullptr;  // [head_dim], device
  const float* k_norm = nullptr;  // [head_dim], device
  float norm_eps = 0.0f;          // finite, >= 0
};

/// InvalidArgument (naming the field and value) for a shape the kernel cannot run; before any
/// CUDA call.
absl::Status CheckRopeWriteKvParams(const RopeWriteKvParams& params);

/// Asynchronous on `stream`, one block per token; thread-safe (no state). FailedPrecondition
/// without CUDA.
absl::Status LaunchRopeWriteKv(const RopeWriteKvParams& params, cudaStream_t stream);

}  // namespace loom::kernels::cuda
