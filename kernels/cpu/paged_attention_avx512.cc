// AVX-512 inner loops of PagedAttention and WriteKv (compiled with -mavx512f -mavx512bw
// -mavx512vl -mf16c -mfma, see kernels/CMakeLists.txt); called only after a run-time CPU
// check.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/paged_attention_internal.h"
#include "kernels/cpu/paged_attention_tiled.h"
#include "kernels/cpu/vector_math_avx512.h"

namespace loom::kernels::cpu::internal {
namespace {

// Positions whose scores are reduced, exponentiated and accumulated together; the softmax
// bookkeeping (max, rescale, one exp per lane) is paid once per chunk.
constexpr int64_t kChunk = 32;

// 16 E4M3 codes (sign-extended to 16 bits) as float, 2^-8 of their value: see
// paged_attention_avx2.cc's Fp8ToFloat8.
inline __m512 Fp8ToFloat16(__m128i codes) {
  const __m256i wide = _mm256_cvtepi8_epi16(codes);
  return _mm512_cvtph_ps(
      _mm256_and_si256(_mm256_slli_epi16(wide, 7), _mm256_set1_epi16(static_cast<short>(0xbfff))));
}

// 16 BF16 values as float (exact: the bits become the high half of each lane).
inline __m512 Bf16ToFloat16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

template <KvDtype kDtype>
inline constexpr bool kQuantized = IsQuantizedKv(kDtype);

// Loads 16 (or the masked tail of) K/V elements as float (8-bit codes unscaled).
template <KvDtype kDtype>
inline __m512 LoadRow(const void* base, int64_t index, __mmask16 mask) {
  if constexpr (kDtype == KvDtype::kF16) {
    return _mm512_cvtph_ps(
        _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + index));
  } else if constexpr (kDtype == KvDtype::kBf16) {
    return Bf16ToFloat16(
        _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + index));
  } else if constexpr (kDtype == KvDtype::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + index);
  } else if constexpr (kDtype == KvDtype::kInt8) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, static_cast<const int8_t*>(base) + index)));
  } else {
    return Fp8ToFloat16(_mm_maskz_loadu_epi8(mask, static_cast<const uint8_t*>(base) + index));
  }
}

// Lane j of the result is the sum of the 16 lanes of rows[j]: a transpose-and-add tree
// (31 shuffles, 15 adds) instead of 16 separate horizontal sums.
inline __m512 TransposeSum16(const __m512* rows) {
  __m512 level1[8], level2[4], level3[2];
  for (int i = 0; i < 8; ++i) {  // 256-bit halves: [rows[2i] partials, rows[2i+1] partials]
    const __m512 x = rows[2 * i], y = rows[2 * i + 1];
    level1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit block k: 4 partials of rows[4i + k]
    const __m512 x = level1[2 * i], y = level1[2 * i + 1];
    level2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int i = 0; i < 2; ++i) {  // block k: 2 partials of rows[8i + k], 2 of rows[8i + 4 + k]
    const __m512 x = level2[2 * i], y = level2[2 * i + 1];
    level3[i] = _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Block k: sums of rows[k], rows[4 + k], rows[8 + k], rows[12 + k]; lane 4k + m holds
  // rows[4m + k], which the permutation puts back at lane 4m + k.
  const __m512 sums =
      _mm512_add_ps(_mm512_shuffle_ps(level3[0], level3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm512_shuffle_ps(level3[0], level3[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}

// Shape of one task: vectors of 16 per head row, the last one masked to head_dim.
struct RowShape {
  int64_t num_vecs;
  __mmask16 tail;
  __mmask16 MaskOf(int64_t vec) const { return vec == num_vecs - 1 ? tail : __mmask16{0xffff}; }
};

// The mask of vector `vec` of a row of kVecs vectors: all lanes but in the last one, a
// constant the compiler folds away once the loop over vec is unrolled.
template <int kVecs>
inline __mmask16 MaskOf(int vec, __mmask16 tail) {
  return vec == kVecs - 1 ? tail : __mmask16{0xffff};
}

// acc[h] = acc[h] * correction[h] + sum_j weights[h][j] V[rows[j]], for kHeads heads with
// rows of kVecs vectors (the last masked by `tail`): accumulators stay in registers across
// the chunk, and each V row is loaded and converted once for all kHeads heads.
template <KvDtype kDtype, int kVecs, int kHeads>
void AccumulateTile(const void* v_cache, const int64_t* rows, int64_t count, __mmask16 tail,
                    const float (*weights)[kChunk], const float* correction, float* acc,
                    int64_t acc_stride) {
  __m512 sums[kHeads][kVecs];
  for (int h = 0; h < kHeads; ++h) {
    const __m512 c = _mm512_set1_ps(correction[h]);
    for (int v = 0; v < kVecs; ++v) {
      sums[h][v] = _mm512_mul_ps(_mm512_load_ps(acc + h * acc_stride + v * 16), c);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 row[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      row[v] = LoadRow<kDtype>(v_cache, rows[j] + v * 16, MaskOf<kVecs>(v, tail));
    }
    for (int h = 0; h < kHeads; ++h) {
      const __m512 w = _mm512_set1_ps(weights[h][j]);
      for (int v = 0; v < kVecs; ++v) sums[h][v] = _mm512_fmadd_ps(w, row[v], sums[h][v]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVecs; ++v) _mm512_store_ps(acc + h * acc_stride + v * 16, sums[h][v]);
  }
}

// AccumulateTile for a run-time head count 1 <= num_heads <= kMaxHeads.
template <KvDtype kDtype, int kVecs, int kMaxHeads>
void AccumulateHeads(int64_t num_heads, const void* v_cache, const int64_t* rows, int64_t count,
                     __mmask16 tail, const float (*weights)[kChunk], const float* correction,
                     float* acc, int64_t acc_stride) {
  if constexpr (kMaxHeads > 1) {
    if (num_heads < kMaxHeads) {
      return AccumulateHeads<kDtype, kVecs, kMaxHeads - 1>(num_heads, v_cache, rows, count, tail,
                                                           weights, correction, acc, acc_stride);
    }
  }
  AccumulateTile<kDtype, kVecs, kMaxHeads>(v_cache, rows, count, tail, weights, correction, acc,
                                           acc_stride);
}

// The same for any head dim and head count, accumulators in memory: each V row is
// converted once into `row` ([16 * shape.num_vecs], scratch), then added to every head.
template <KvDtype kDtype>
void AccumulateAny(const void* v_cache, const int64_t* rows, int64_t count, RowShape shape,
                   int64_t num_heads, const float (*weights)[kChunk], const float* correction,
                   float* acc, int64_t acc_stride, float* row) {
  for (int64_t h = 0; h < num_heads; ++h) {
    const __m512 c = _mm512_set1_ps(correction[h]);
    for (int64_t v = 0; v < shape.num_vecs; ++v) {
      float* a = acc + h * acc_stride + v * 16;
      _mm512_store_ps(a, _mm512_mul_ps(_mm512_load_ps(a), c));
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t v = 0; v < shape.num_vecs; ++v) {
      _mm512_store_ps(row + v * 16, LoadRow<kDtype>(v_cache, rows[j] + v * 16, shape.MaskOf(v)));
    }
    for (int64_t h = 0; h < num_heads; ++h) {
      const __m512 w = _mm512_set1_ps(weights[h][j]);
      for (int64_t v = 0; v < shape.num_vecs; ++v) {
        float* a = acc + h * acc_stride + v * 16;
        _mm512_store_ps(a, _mm512_fmadd_ps(w, _mm512_load_ps(row + v * 16), _mm512_load_ps(a)));
      }
    }
  }
}

// kVecs > 0: head_dim in (16 * (kVecs - 1), 16 * kVecs], K/V rows held in registers and V
// accumulated in register tiles of query vectors; 0: any head dim up to kMaxHeadDim, rows
// staged through memory.
//
// A task's query vectors are its rows (consecutive tokens of one sequence) x its heads,
// qv = row * num_heads + head; row r reads positions [0, attend_len + r). Every K/V row is
// loaded (and converted) once for all of them. Each query vector's arithmetic is that of a
// one-row task (chunks of kChunk positions from position 0, its own count in the last
// one; rows past their limit skip the chunk), whatever else shares the task: a token's
// result is the same bits in a decode step, a prefill of any chunking, or a verify step.
template <KvDtype kDtype, int kVecs>
void Attend(const KvLayerView& cache, float scale, const AttentionTask& task) {
  const int64_t d = cache.head_dim, bs = cache.block_size;
  const RowShape shape{(d + 15) / 16, d % 16 == 0 ? __mmask16{0xffff}
                                                  : static_cast<__mmask16>((1u << (d % 16)) - 1)};
  const int64_t num_heads = task.num_heads;
  const int64_t num_q = task.num_rows * num_heads;
  const int64_t acc_stride = shape.num_vecs * 16;
  alignas(64) float acc[kMaxTaskFloats + 16 * kMaxTaskQueries];  // [num_q, acc_stride]
  std::fill(acc, acc + num_q * acc_stride, 0.0f);
  float running_max[kMaxTaskQueries], correction[kMaxTaskQueries];
  __m512 denominator[kMaxTaskQueries];  // per-lane partial sums of the softmax weights
  for (int64_t qv = 0; qv < num_q; ++qv) {
    running_max[qv] = -std::numeric_limits<float>::infinity();
    denominator[qv] = _mm512_setzero_ps();
  }
  alignas(64) __m512 dots[kMaxTaskQueries][16];  // [query vector][position]: unsummed dots
  alignas(64) float weights[kMaxTaskQueries][kChunk];
  int64_t rows[kChunk];  // element offset of each position's K/V row
  // 8-bit KV: per position, the score scale x its K scale and its V scale (the tiled
  // kernel's file comment says why the scales act there).
  alignas(64) float k_scales[kChunk], v_scales[kChunk];
  const float decode = KvDecodeFactor(kDtype);
  alignas(64) float k_row[kVecs > 0 ? 16 : kMaxHeadDim];  // generic path: a K or V row as float
  const auto q_of = [&](int64_t qv) {
    return task.q + (qv / num_heads) * task.token_stride + (qv % num_heads) * d;
  };
  // Register path: the queries zero-padded to whole vectors, so that their loads need no
  // mask and fold into the FMAs.
  alignas(64) float q[kVecs > 0 ? kMaxTaskQueries * kVecs * 16 : 16];
  if constexpr (kVecs > 0) {
    for (int64_t qv = 0; qv < num_q; ++qv) {
      for (int v = 0; v < kVecs; ++v) {
        _mm512_store_ps(q + (qv * kVecs + v) * 16,
                        _mm512_maskz_loadu_ps(MaskOf<kVecs>(v, shape.tail), q_of(qv) + v * 16));
      }
    }
  }

  const int64_t kv_row = cache.num_kv_heads * d;
  const int64_t last_len = task.attend_len + task.num_rows - 1;  // the last row's
  // Chunks sit at multiples of kChunk from position 0; with a sliding window the first is
  // the one holding row 0's first position (each row's chunks are those a task of its own
  // would take).
  const int64_t start = LowerLimit(task, 0) / kChunk * kChunk;
  int64_t block = start / bs, offset = start % bs;
  for (int64_t pos = start; pos < last_len; pos += kChunk) {
    const int64_t count = std::min(kChunk, last_len - pos);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t slot = static_cast<int64_t>(task.blocks[block]) * bs + offset;
      rows[j] = slot * kv_row + task.kv_head * d;
      if constexpr (kQuantized<kDtype>) {
        const int64_t head = slot * cache.num_kv_heads + task.kv_head;
        k_scales[j] = scale * (decode * Bf16ToFloat(cache.k_scale[head]));
        v_scales[j] = decode * Bf16ToFloat(cache.v_scale[head]);
      }
      if (++offset == bs) {
        offset = 0;
        ++block;
      }
    }
    // The next chunk's K/V rows start coming into L2 while this one is computed (the
    // task's blocks are scattered, which hardware prefetchers do not follow; see the
    // tiled kernel's prefetch for why L2 and not L1).
    for (int64_t next = pos + count; next < std::min(last_len, pos + count + kChunk); ++next) {
      const int64_t row =
          (static_cast<int64_t>(task.blocks[next / bs]) * bs + next % bs) * kv_row +
          task.kv_head * d;
      constexpr int64_t kBytes = KvElementBytes(kDtype);
      for (int64_t byte = 0; byte < d * kBytes; byte += 64) {
        __builtin_prefetch(static_cast<const char*>(cache.k) + row * kBytes + byte,
                           /*rw=*/0, /*locality=*/2);
        __builtin_prefetch(static_cast<const char*>(cache.v) + row * kBytes + byte,
                           /*rw=*/0, /*locality=*/2);
      }
    }
    // Rows before first_row attend to positions < pos only: they are done.
    const int64_t first_row = std::max<int64_t>(0, pos - task.attend_len + 1);
    const int64_t qv0 = first_row * num_heads;
    // With a sliding window, rows from end_row on start after this chunk: not yet begun.
    const int64_t end_row =
        task.window > 0
            ? std::clamp<int64_t>(pos + count - task.attend_len + task.window, 0, task.num_rows)
            : task.num_rows;
    const int64_t qv_end = end_row * num_heads;
    // Positions of this chunk query vector qv reads (1 .. count for qv >= qv0): the first
    // count_of(qv), less the first below_of(qv) (before its window).
    const auto count_of = [&](int64_t qv) {
      return std::min(count, task.attend_len + qv / num_heads - pos);
    };
    const auto below_of = [&](int64_t qv) {
      return std::max<int64_t>(0, LowerLimit(task, qv / num_heads) - pos);
    };
    // Scores, 16 positions at a time: each K row is loaded once for all query vectors.
    __m512 scores[kMaxTaskQueries][kChunk / 16];
    for (int64_t half = 0; half * 16 < count; ++half) {
      const int64_t n = std::min<int64_t>(16, count - half * 16);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = rows[half * 16 + j];
        if constexpr (kVecs > 0) {
          __m512 k[kVecs];
          for (int v = 0; v < kVecs; ++v) {
            k[v] = LoadRow<kDtype>(cache.k, row + v * 16, MaskOf<kVecs>(v, shape.tail));
          }
          for (int64_t qv = qv0; qv < qv_end; ++qv) {
            const float* qq = q + qv * kVecs * 16;
            __m512 dot = _mm512_mul_ps(_mm512_load_ps(qq), k[0]);
            for (int v = 1; v < kVecs; ++v)
              dot = _mm512_fmadd_ps(_mm512_load_ps(qq + v * 16), k[v], dot);
            dots[qv][j] = dot;
          }
        } else {
          for (int64_t v = 0; v < shape.num_vecs; ++v) {
            _mm512_store_ps(k_row + v * 16,
                            LoadRow<kDtype>(cache.k, row + v * 16, shape.MaskOf(v)));
          }
          for (int64_t qv = qv0; qv < qv_end; ++qv) {
            __m512 dot = _mm512_setzero_ps();
            for (int64_t v = 0; v < shape.num_vecs; ++v) {
              dot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(shape.MaskOf(v), q_of(qv) + v * 16),
                                    _mm512_load_ps(k_row + v * 16), dot);
            }
            dots[qv][j] = dot;
          }
        }
      }
      // Lane j of TransposeSum16 reads only dots[qv][j]: positions past a row's own count
      // do not touch its valid lanes, which the masks below keep.
      for (int64_t qv = qv0; qv < qv_end; ++qv) {
        for (int64_t j = n; j < 16; ++j) dots[qv][j] = _mm512_setzero_ps();
        const __m512 score_scale =
            kQuantized<kDtype>
                ? _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), k_scales + half * 16)
                : _mm512_set1_ps(scale);
        scores[qv][half] = _mm512_mul_ps(TransposeSum16(dots[qv]), score_scale);
      }
    }
    // Online softmax per query vector: new max, rescale factor, weights for its count.
    for (int64_t qv = qv0; qv < qv_end; ++qv) {
      const int64_t own = count_of(qv), below = below_of(qv);
      const int64_t num_halves = (own + 15) / 16;
      __mmask16 valid[kChunk / 16];
      __m512 chunk_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int64_t half = 0; half < num_halves; ++half) {
        const int64_t n = std::min<int64_t>(16, own - half * 16);
        const int64_t skip = std::clamp<int64_t>(below - half * 16, 0, 16);
        valid[half] = static_cast<__mmask16>(((1u << n) - 1) & ~((1u << skip) - 1));
        chunk_max = _mm512_mask_max_ps(chunk_max, valid[half], chunk_max, scores[qv][half]);
      }
      const float new_max = std::max(running_max[qv], _mm512_reduce_max_ps(chunk_max));
      correction[qv] = 1.0f;
      if (new_max > running_max[qv]) {
        correction[qv] = std::exp(running_max[qv] - new_max);  // 0 on the first chunk
        running_max[qv] = new_max;
      }
      const __m512 max = _mm512_set1_ps(new_max);
      __m512 total = _mm512_mul_ps(denominator[qv], _mm512_set1_ps(correction[qv]));
      for (int64_t half = 0; half < num_halves; ++half) {
        const __m512 w =
            _mm512_maskz_mov_ps(valid[half], Exp512(_mm512_sub_ps(scores[qv][half], max)));
        total = _mm512_add_ps(total, w);
        if constexpr (kQuantized<kDtype>) {
          _mm512_store_ps(
              weights[qv] + half * 16,
              _mm512_mul_ps(w, _mm512_maskz_loadu_ps(valid[half], v_scales + half * 16)));
        } else {
          _mm512_store_ps(weights[qv] + half * 16, w);
        }
      }
      denominator[qv] = total;
    }
    // Weighted V rows, for runs of consecutive query vectors with the same count (rows
    // differ only in the chunk that holds their limits).
    for (int64_t qv = qv0; qv < qv_end;) {
      const int64_t own = count_of(qv);
      int64_t end = qv + 1;
      while (end < qv_end && count_of(end) == own) ++end;
      if constexpr (kVecs > 0) {
        // Query vectors per register tile: kTile * kVecs accumulators and a row fit in the
        // 32 registers.
        constexpr int kTile = kVecs <= 4 ? 4 : kVecs <= 6 ? 3 : 2;
        for (int64_t q0 = qv; q0 < end; q0 += kTile) {
          AccumulateHeads<kDtype, kVecs, kTile>(std::min<int64_t>(kTile, end - q0), cache.v, rows,
                                                own, shape.tail, weights + q0, correction + q0,
                                                acc + q0 * acc_stride, acc_stride);
        }
      } else {
        AccumulateAny<kDtype>(cache.v, rows, own, shape, end - qv, weights + qv, correction + qv,
                              acc + qv * acc_stride, acc_stride, k_row);
      }
      qv = end;
    }
  }
  for (int64_t qv = 0; qv < num_q; ++qv) {
    const __m512 inverse =
        _mm512_set1_ps(1.0f / WithSink(task, qv % num_heads, _mm512_reduce_add_ps(denominator[qv]),
                                       running_max[qv]));
    float* out = task.out + (qv / num_heads) * task.token_stride + (qv % num_heads) * d;
    for (int64_t v = 0; v < shape.num_vecs; ++v) {
      _mm512_mask_storeu_ps(out + v * 16, shape.MaskOf(v),
                            _mm512_mul_ps(_mm512_load_ps(acc + qv * acc_stride + v * 16), inverse));
    }
  }
}

template <KvDtype kDtype>
void AttendDispatched(const KvLayerView& cache, float scale, const AttentionTask& task) {
  switch ((cache.head_dim + 15) / 16) {
    case 4:  // head_dim 49..64
      return Attend<kDtype, 4>(cache, scale, task);
    case 5:  // 65..80
      return Attend<kDtype, 5>(cache, scale, task);
    case 6:  // 81..96
      return Attend<kDtype, 6>(cache, scale, task);
    case 8:  // 113..128
      return Attend<kDtype, 8>(cache, scale, task);
    default:
      return Attend<kDtype, 0>(cache, scale, task);
  }
}

// The vector ISA of paged_attention_tiled.h: 16 lanes, 32 registers.
struct Avx512Vectors {
  static constexpr int kLanes = 16;
  static constexpr int kQkVecs = 4;       // scores: 4 x 4 accumulators,
  static constexpr int kQkPositions = 4;  // 4 loads and 4 broadcasts per 16 FMAs
  static constexpr int kPvQueries = 6;    // outputs: 6 x 4 accumulators and 4 V vectors,
  static constexpr int kPvVecs = 4;       // 4 loads and 6 broadcasts per 24 FMAs
  using Vec = __m512;
  static Vec Zero() { return _mm512_setzero_ps(); }
  static Vec Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Vec x) { _mm512_storeu_ps(p, x); }
  static Vec Set1(float x) { return _mm512_set1_ps(x); }
  static Vec Broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Vec Fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec Max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec Exp(Vec x) { return Exp512(x); }
  static __m512i LoadLimit(const int32_t* p) { return _mm512_loadu_si512(p); }
  // Lanes whose limit <= position or whose lower > position take `fill`.
  static Vec MaskOutside(Vec x, __m512i lower, __m512i limit, int64_t position, Vec fill) {
    return MaskOutside16(x, lower, limit, position, fill);
  }
  // r[i][j] becomes r[j][i] (vector_math_avx512.h).
  static void Transpose(Vec* r) { Transpose16x16(r); }
  static Vec LoadHalf(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Vec LoadBf16(const uint16_t* p) {
    return Bf16ToFloat16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Vec LoadInt8(const int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static Vec LoadFp8(const uint8_t* p) {
    return Fp8ToFloat16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

}  // namespace

void AttendTileAvx512(const KvLayerView& cache, float scale, const AttentionTask& tile) {
  WithKvDtype(cache.dtype, [&](auto dtype) {
    tiled::TileKernel<Avx512Vectors, decltype(dtype)::value>::Run(cache, scale, tile);
  });
}

void AttendAvx512(const KvLayerView& cache, float scale, const AttentionTask& task) {
  WithKvDtype(cache.dtype,
              [&](auto dtype) { AttendDispatched<decltype(dtype)::value>(cache, scale, task); });
}

void FloatToHalfAvx512(const float* src, int64_t count, uint16_t* dst) {
  constexpr int kRounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRounding));
  }
  if (i < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, tail,
                             _mm512_cvtps_ph(_mm512_maskz_loadu_ps(tail, src + i), kRounding));
  }
}

}  // namespace loom::kernels::cpu::internal
