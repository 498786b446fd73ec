// AVX2 inner loop of PagedAttention (compiled with -mavx2 -mfma -mf16c, see
// kernels/CMakeLists.txt); called only after a run-time CPU check, for head dims that are
// a multiple of 8 (others take the scalar loop). The scalar loop's online softmax, one
// head at a time, with the q·k dot products and the V accumulation on 8-lane FMAs.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/paged_attention_internal.h"

namespace loom::kernels::cpu::internal {
namespace {

constexpr int64_t kChunk = 32;

template <bool kHalf>
inline __m256 Load8(const void* base, int64_t index) {
  if constexpr (kHalf) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index)));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

template <bool kHalf>
void Attend(const KvLayerView& cache, float scale, const AttentionTask& task) {
  const int64_t d = cache.head_dim, bs = cache.block_size, vecs = d / 8;
  for (int64_t h = 0; h < task.num_heads; ++h) {
    const float* q = task.q + h * d;
    alignas(32) float acc[kMaxHeadDim];
    std::fill(acc, acc + d, 0.0f);
    float running_max = -std::numeric_limits<float>::infinity();
    float denominator = 0.0f;
    float scores[kChunk];
    for (int64_t pos = 0; pos < task.attend_len;) {
      const int64_t block = task.blocks[pos / bs];
      const int64_t count = std::min({kChunk, bs - pos % bs, task.attend_len - pos});
      const int64_t slot0 = block * bs + pos % bs;
      float chunk_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < count; ++j) {
        const int64_t base = ((slot0 + j) * cache.num_kv_heads + task.kv_head) * d;
        __m256 dot0 = _mm256_setzero_ps(), dot1 = _mm256_setzero_ps();
        int64_t v = 0;
        for (; v + 2 <= vecs; v += 2) {
          dot0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + v * 8), Load8<kHalf>(cache.k, base + v * 8), dot0);
          dot1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + v * 8 + 8),
                                 Load8<kHalf>(cache.k, base + v * 8 + 8), dot1);
        }
        if (v < vecs) {
          dot0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + v * 8), Load8<kHalf>(cache.k, base + v * 8), dot0);
        }
        scores[j] = HorizontalSum(_mm256_add_ps(dot0, dot1)) * scale;
        chunk_max = std::max(chunk_max, scores[j]);
      }
      const float new_max = std::max(running_max, chunk_max);
      const float correction = std::exp(running_max - new_max);  // 0 on the first chunk
      denominator *= correction;
      const __m256 correction8 = _mm256_set1_ps(correction);
      for (int64_t v = 0; v < vecs; ++v) {
        _mm256_store_ps(acc + v * 8, _mm256_mul_ps(_mm256_load_ps(acc + v * 8), correction8));
      }
      for (int64_t j = 0; j < count; ++j) {
        const float weight = std::exp(scores[j] - new_max);
        denominator += weight;
        const __m256 weight8 = _mm256_set1_ps(weight);
        const int64_t base = ((slot0 + j) * cache.num_kv_heads + task.kv_head) * d;
        for (int64_t v = 0; v < vecs; ++v) {
          _mm256_store_ps(acc + v * 8, _mm256_fmadd_ps(weight8, Load8<kHalf>(cache.v, base + v * 8),
                                                       _mm256_load_ps(acc + v * 8)));
        }
      }
      running_max = new_max;
      pos += count;
    }
    const __m256 inverse = _mm256_set1_ps(1.0f / denominator);
    for (int64_t v = 0; v < vecs; ++v) {
      _mm256_storeu_ps(task.out + h * d + v * 8, _mm256_mul_ps(_mm256_load_ps(acc + v * 8), inverse));
    }
  }
}

}  // namespace

void AttendAvx2(const KvLayerView& cache, float scale, const AttentionTask& task) {
  if (cache.head_dim % 8 != 0) {
    AttendScalar(cache, scale, task);
  } else if (cache.dtype == KvDtype::kF16) {
    Attend<true>(cache, scale, task);
  } else {
    Attend<false>(cache, scale, task);
  }
}

}  // namespace loom::kernels::cpu::internal
