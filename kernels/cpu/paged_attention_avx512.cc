// AVX-512 inner loop of PagedAttention (compiled with -mavx512f -mf16c -mfma, see
// kernels/CMakeLists.txt); called only after a run-time CPU check.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/paged_attention_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

// Loads 16 (or the masked tail of) K/V elements as float.
template <bool kHalf>
inline __m512 LoadRow(const void* base, int64_t index, __mmask16 mask) {
  if constexpr (kHalf) {
    return _mm512_cvtph_ps(
        _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + index));
  } else {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + index);
  }
}

template <bool kHalf>
void Attend(const KvLayerView& cache, float scale, const AttentionTask& task) {
  const int64_t d = cache.head_dim, bs = cache.block_size;
  const int64_t num_vecs = (d + 15) / 16;
  const __mmask16 tail =
      d % 16 == 0 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (d % 16)) - 1);
  auto mask_of = [&](int64_t vec) { return vec == num_vecs - 1 ? tail : __mmask16{0xffff}; };
  alignas(64) float acc[kMaxHeadDim];
  __m512 q[kMaxHeadDim / 16];
  for (int64_t v = 0; v < num_vecs; ++v) {
    q[v] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask_of(v), task.q + v * 16), _mm512_set1_ps(scale));
    _mm512_store_ps(acc + v * 16, _mm512_setzero_ps());
  }
  float running_max = -std::numeric_limits<float>::infinity();
  float denominator = 0.0f;
  constexpr int64_t kChunk = 32;
  float scores[kChunk];
  for (int64_t pos = 0; pos < task.attend_len;) {
    const int64_t block = task.blocks[pos / bs];
    const int64_t count = std::min({kChunk, bs - pos % bs, task.attend_len - pos});
    const int64_t slot0 = block * bs + pos % bs;
    const int64_t stride = cache.num_kv_heads * d;
    const int64_t base0 = (slot0 * cache.num_kv_heads + task.kv_head) * d;
    float chunk_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < count; ++j) {
      const int64_t base = base0 + j * stride;
      __m512 dot = _mm512_setzero_ps();
      for (int64_t v = 0; v < num_vecs; ++v) {
        dot = _mm512_fmadd_ps(q[v], LoadRow<kHalf>(cache.k, base + v * 16, mask_of(v)), dot);
      }
      scores[j] = _mm512_reduce_add_ps(dot);
      chunk_max = std::max(chunk_max, scores[j]);
    }
    const float new_max = std::max(running_max, chunk_max);
    if (new_max > running_max) {
      const float correction = std::exp(running_max - new_max);  // 0 on the first chunk
      denominator *= correction;
      const __m512 c = _mm512_set1_ps(correction);
      for (int64_t v = 0; v < num_vecs; ++v) {
        _mm512_store_ps(acc + v * 16, _mm512_mul_ps(_mm512_load_ps(acc + v * 16), c));
      }
      running_max = new_max;
    }
    for (int64_t j = 0; j < count; ++j) {
      const float weight = std::exp(scores[j] - running_max);
      denominator += weight;
      const __m512 wv = _mm512_set1_ps(weight);
      const int64_t base = base0 + j * stride;
      for (int64_t v = 0; v < num_vecs; ++v) {
        _mm512_store_ps(acc + v * 16,
                        _mm512_fmadd_ps(wv, LoadRow<kHalf>(cache.v, base + v * 16, mask_of(v)),
                                        _mm512_load_ps(acc + v * 16)));
      }
    }
    pos += count;
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / denominator);
  for (int64_t v = 0; v < num_vecs; ++v) {
    _mm512_mask_storeu_ps(task.out + v * 16, mask_of(v),
                          _mm512_mul_ps(_mm512_load_ps(acc + v * 16), inverse));
  }
}

}  // namespace

void AttendAvx512(const KvLayerView& cache, float scale, const AttentionTask& task) {
  if (cache.dtype == KvDtype::kF16) {
    Attend<true>(cache, scale, task);
  } else {
    Attend<false>(cache, scale, task);
  }
}

}  // namespace loom::kernels::cpu::internal
