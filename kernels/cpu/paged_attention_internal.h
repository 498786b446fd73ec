#pragma once

// Internal to kernels/cpu: one (query token, head) of PagedAttention, per ISA.

#include <cstdint>

#include "kernels/cpu/paged_attention.h"

namespace loom::kernels::cpu::internal {

/// The cache's KV head that local query head `h` reads (see PagedAttentionParams::group).
inline int64_t KvHeadOf(const PagedAttentionParams& p, int64_t h) {
  if (p.group == 0) return h / (p.num_heads / p.cache.num_kv_heads);
  return (p.head0 + h) / p.group - p.kv_head0;
}


/// One query row attending to KV positions [0, attend_len) of one sequence.
struct AttentionTask {
  const float* q = nullptr;           // [head_dim]
  float* out = nullptr;               // [head_dim]
  const int32_t* blocks = nullptr;    // the sequence's block ids, [ceil(attend_len / block_size)]
  int64_t kv_head = 0;
  int64_t attend_len = 0;             // >= 1
};

/// Online-softmax attention of one task (float accumulation). Head dims up to
/// kMaxHeadDim.
inline constexpr int64_t kMaxHeadDim = 1024;
void AttendScalar(const KvLayerView& cache, float scale, const AttentionTask& task);
void AttendAvx512(const KvLayerView& cache, float scale, const AttentionTask& task);

/// Test hook: false forces the scalar path even where AVX-512 is available.
void SetAttentionSimdForTesting(bool enabled);

}  // namespace loom::kernels::cpu::internal
