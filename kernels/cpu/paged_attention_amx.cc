// PagedAttention's tiles with both products on AMX-BF16, for --activations bf16
// (PagedAttentionParams::activations; Intel Sapphire Rapids and later). Compiled with the
// AVX-512 flags plus -mamx-tile -mamx-bf16 -mavx512bf16 (kernels/CMakeLists.txt) and only
// called when ActivationPrecisionStatus(kBf16) is OK.
//
// What it computes: FlashAttention's online softmax in which the queries, the keys, the values
// and the softmax weights exp(score - running max) enter the two products rounded to BF16
// (nearest even), as the bf16 mode's matmuls take their inputs; the products are exact in F32
// and summed in F32 by TDPBF16PS. The scores' scale and mask, the running max, the sum of the
// (unrounded) weights, the rescaling of the output and its division stay F32, the same
// operations as the AVX-512 tiles' (paged_attention_tiled.h). PagedAttentionReference rounds
// the same values (with the final max in place of the running one).
//
// How, per tile (up to 64 query vectors: rows of one sequence x the query heads of one KV head,
// as the AVX-512 tiles cut them), KV_TILE = 32 positions at a time:
//   S^T = K Q^T   A = the positions' K rows as BF16 (the cache's own layout: converted per KV
//                 tile from F16 / F32, loaded from the pool as they are from a BF16 cache whose
//                 rows fill whole tile rows (DirectK); 16 positions an A tile), B = Q^T as B
//                 tiles (built once per tile, 16 query vectors a tile): scores come out with
//                 query vectors in lanes, so the softmax runs lane-wise as the AVX-512 tiles'
//                 does, without horizontal sums;
//   O = O c + P V A = the weights P as 16 query vectors x 32 positions (the score rows turned
//                 into B-layout pairs, then one 16 x 16 transpose of 32-bit pairs), B = V as B
//                 tiles (two positions' rows interleaved: converted, or from BF16 only
//                 interleaved, 16 head dims a tile); O, rescaled by
//                 c in memory, is the C tile the product accumulates into.
// KV tiles start at multiples of 32, at the one holding the tile's first position.
//
// Batch invariance: an element of an AMX product sums its own row of A and column of B in
// one order, so a query vector's scores, weights and output depend only on its own query and
// its sequence's cache, never on the other query vectors in its tile or their number: a token
// gives the same bits in a decode step, a prefill chunk, a batch or a speculative verify. A
// KV tile wholly past a query vector's limit (its tile's later rows reach further) rescales its
// output by exactly 1 and adds products of exact zeros; TDPBF16PS's flush of subnormal results
// cannot move it either, as every product step leaves a normal number or zero.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/bf16_pairs_avx512.h"
#include "kernels/cpu/paged_attention_internal.h"
#include "kernels/cpu/vector_math_avx512.h"

namespace loom::kernels::cpu::internal {
namespace {

constexpr int64_t kKvTile = kAmxKvTile;  // positions per KV tile: two A tiles of K, a P tile's k
static_assert(kKvTile == 32);
constexpr int64_t kLanes = 16;  // query vectors per Q^T / P tile; head dims per V / O tile
constexpr int64_t kTileK = 32;  // BF16 values in a 64-byte tile row
constexpr int64_t kTileValues = 16 * kTileK;  // BF16 values in a tile

// 64-byte aligned storage: tile rows and vectors on whole cache lines (a row split across two
// lines costs two).
template <typename T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <typename U>
  explicit LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const LineAllocator&) const { return true; }
};
template <typename T>
using LineVector = std::vector<T, LineAllocator<T>>;

// Per-thread scratch of one tile, grown on demand.
struct Scratch {
  LineVector<uint16_t> qt;  // [query blocks][d steps] B tiles: row r, lane c = dims 2r, 2r+1
  LineVector<uint16_t> k;   // [kKvTile][d_pad] BF16 K rows (A tiles), columns past d zero
  LineVector<uint16_t> zero;  // [kLanes][d_pad] zeros, never written: DirectK's A tile past
                              // the end
  LineVector<uint16_t> v;   // [d / 16] B tiles: row r, lane c = positions 2r, 2r+1 of dim c
  LineVector<uint16_t> p;        // [query blocks][16][kKvTile] BF16 weights (A tiles)
  LineVector<float> st;          // [kKvTile][qs] scores, then F32 weights (0 where masked)
  LineVector<float> o;           // [qs][d] unnormalized outputs (the PV product's C tiles)
  LineVector<float> m, l, corr;  // [qs]: running max, running sum, this KV tile's rescale
  LineVector<int32_t> limit;     // [qs]: a query vector attends to positions < limit
  LineVector<int32_t> lower;     // [qs]: ... and >= lower (0 without a sliding window)
};

// The pool element types: F16 (uint16_t), F32 and BF16 (Bf16Bits, taken as they are).
inline __m512 Load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }

// `count` (a multiple of 16) values from `src` as BF16 in `dst`, padded with zeros to a
// multiple of 32.
template <typename E>
void RowToBf16(const E* src, int64_t count, uint16_t* dst) {
  for (int64_t i = 0; i < count; i += kTileK) {
    const __m512 lo = Load16(src + i);
    const __m512 hi = i + kLanes < count ? Load16(src + i + kLanes) : _mm512_setzero_ps();
    // cvtne2ps_pbh(a, b): elements 0-15 from b, 16-31 from a.
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}
void RowToBf16(const Bf16Bits* src, int64_t count, uint16_t* dst) {
  std::memcpy(dst, src, count * sizeof(uint16_t));
  if (count % kTileK != 0) std::fill(dst + count, dst + count + kLanes, uint16_t{0});
}

// A V tile's B-tile row for head dims i .. i + 16 of two positions' rows (nullptr: past the
// tile's end, zeros): lane c holds dim i + c of `even` and of `odd` as BF16.
template <typename E>
__m512i PairedV(const E* even, const E* odd, int64_t i) {
  return PairUp(even != nullptr ? Load16(even + i) : _mm512_setzero_ps(),
                odd != nullptr ? Load16(odd + i) : _mm512_setzero_ps());
}
__m512i PairedV(const Bf16Bits* even, const Bf16Bits* odd, int64_t i) {
  // permutex2var_epi16(a, idx, b): index bit 5 picks b.
  const __m512i interleave =
      _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                       37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const auto load = [i](const Bf16Bits* row) {
    return row != nullptr ? _mm512_castsi256_si512(
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i)))
                          : _mm512_setzero_si512();
  };
  return _mm512_permutex2var_epi16(load(even), interleave, load(odd));
}

// S^T[j][qv] = k_j . q_qv (BF16 products, F32 sums) for the 32 positions of the two K A tiles
// (`k_lo`: positions 0-15, `k_hi`: 16-31, rows the strides' bytes apart) and every query block,
// two query blocks at a time: C tiles tmm0-3 (positions 0-15 / 16-31 x two blocks), K in
// tmm4-5, Q^T in tmm6-7. GCC pastes tile numbers into the assembly: literals only.
void Scores(int64_t steps, int64_t blocks, int64_t qs, const uint16_t* k_lo, int64_t lo_stride,
            const uint16_t* k_hi, int64_t hi_stride, Scratch& s) {
  const int64_t st_stride = qs * 4;
  float* const st = s.st.data();
  for (int64_t b = 0; b < blocks; b += 2) {
    const bool two = b + 1 < blocks;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t t = 0; t < steps; ++t) {
      _tile_loadd(4, k_lo + t * kTileK, lo_stride);
      _tile_loadd(5, k_hi + t * kTileK, hi_stride);
      _tile_loadd(6, s.qt.data() + (b * steps + t) * kTileValues, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 5, 6);
      if (two) {
        _tile_loadd(7, s.qt.data() + ((b + 1) * steps + t) * kTileValues, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, st + b * kLanes, st_stride);
    _tile_stored(1, st + kLanes * qs + b * kLanes, st_stride);
    if (two) {
      _tile_stored(2, st + (b + 1) * kLanes, st_stride);
      _tile_stored(3, st + kLanes * qs + (b + 1) * kLanes, st_stride);
    }
  }
}

// Scales and masks the scores of positions kv0 .. kv0 + n, updates each query vector's
// running max and sum, and turns the scores into weights (0 where masked, and at positions
// n .. kKvTile): the AVX-512 tiles' Softmax, lane for lane.
template <bool kMasked>
void Softmax(float scale, int64_t kv0, int64_t n, int64_t qs, int64_t blocks, Scratch& s) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  float* const st = s.st.data();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lane0 = b * kLanes;
    const __m512i limit = _mm512_loadu_si512(s.limit.data() + lane0);
    const __m512i lower = _mm512_loadu_si512(s.lower.data() + lane0);
    __m512 tile_max = minus_inf;
    for (int64_t j = 0; j < n; ++j) {
      __m512 x = _mm512_mul_ps(_mm512_loadu_ps(st + j * qs + lane0), scale_v);
      if constexpr (kMasked) x = MaskOutside16(x, lower, limit, kv0 + j, minus_inf);
      _mm512_storeu_ps(st + j * qs + lane0, x);
      tile_max = _mm512_max_ps(tile_max, x);
    }
    const __m512 old_max = _mm512_loadu_ps(s.m.data() + lane0);
    const __m512 new_max = _mm512_max_ps(old_max, tile_max);
    // exp(0) = 1 where the max held, exp(-inf) = 0 on a query vector's first tile; nothing seen
    // yet and nothing in this tile (before its window): NaN, which max turns into -inf.
    const __m512 corr = Exp512(_mm512_max_ps(_mm512_sub_ps(old_max, new_max), minus_inf));
    for (int64_t j = 0; j < n; ++j) {
      __m512 w = Exp512(_mm512_sub_ps(_mm512_loadu_ps(st + j * qs + lane0), new_max));
      if constexpr (kMasked) w = MaskOutside16(w, lower, limit, kv0 + j, _mm512_setzero_ps());
      _mm512_storeu_ps(st + j * qs + lane0, w);
    }
    for (int64_t j = n; j < kKvTile; ++j)
      _mm512_storeu_ps(st + j * qs + lane0, _mm512_setzero_ps());
    // The weights' sum as a tree over the 32 positions (j + 16, then + 8, + 4, + 2, + 1), the
    // pairing SoftmaxFew's lanes take.
    __m512 half[16];
    for (int j = 0; j < 16; ++j) {
      half[j] = _mm512_add_ps(_mm512_loadu_ps(st + j * qs + lane0),
                              _mm512_loadu_ps(st + (j + 16) * qs + lane0));
    }
    for (int width = 8; width >= 1; width /= 2) {
      for (int j = 0; j < width; ++j) half[j] = _mm512_add_ps(half[j], half[j + width]);
    }
    const __m512 sum = half[0];
    _mm512_storeu_ps(s.m.data() + lane0, new_max);
    _mm512_storeu_ps(s.corr.data() + lane0, corr);
    _mm512_storeu_ps(s.l.data() + lane0,
                     _mm512_fmadd_ps(_mm512_loadu_ps(s.l.data() + lane0), corr, sum));
  }
}

// Softmax for a tile of at most kMaxFew query vectors (one block), with positions in lanes:
// the scores transposed (two 16 x 16 transposes), then per query vector two vectors of 16
// positions instead of 32 vectors of 16 mostly idle query lanes; the weights go straight into
// the P tile's rows (no WeightTiles). The same bits as Softmax: the same element-wise
// operations on the same values, maxima (exact in any order), and the sum's tree.
constexpr int64_t kMaxFew = 8;

template <bool kMasked>
void SoftmaxFew(float scale, int64_t kv0, int64_t n, int64_t num_q, Scratch& s) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 zero = _mm512_setzero_ps();
  // After the transposes, lo[qv] / hi[qv]: positions 0-15 / 16-31 (Scores stored all 32 rows;
  // those past n are dropped by the tail masks).
  __m512 lo[16], hi[16];
  for (int j = 0; j < 16; ++j) {
    lo[j] = _mm512_loadu_ps(s.st.data() + j * kLanes);
    hi[j] = _mm512_loadu_ps(s.st.data() + (j + 16) * kLanes);
  }
  Transpose16x16(lo);
  Transpose16x16(hi);
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i pos_lo = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(kv0)));
  const __m512i pos_hi = _mm512_add_epi32(pos_lo, _mm512_set1_epi32(16));
  const __mmask16 tail_lo = n >= 16 ? 0xffff : (1u << n) - 1;
  const __mmask16 tail_hi = n >= 32 ? 0xffff : n <= 16 ? 0 : (1u << (n - 16)) - 1;
  for (int64_t qv = 0; qv < num_q; ++qv) {
    __mmask16 keep_lo = tail_lo, keep_hi = tail_hi;  // positions this query vector attends
    if constexpr (kMasked) {
      const __m512i limit = _mm512_set1_epi32(s.limit[qv]);
      const __m512i lower = _mm512_set1_epi32(s.lower[qv]);
      keep_lo &= _mm512_cmplt_epi32_mask(pos_lo, limit) & _mm512_cmpge_epi32_mask(pos_lo, lower);
      keep_hi &= _mm512_cmplt_epi32_mask(pos_hi, limit) & _mm512_cmpge_epi32_mask(pos_hi, lower);
    }
    const __m512 x_lo = _mm512_mask_mul_ps(minus_inf, keep_lo, lo[qv], scale_v);
    const __m512 x_hi = _mm512_mask_mul_ps(minus_inf, keep_hi, hi[qv], scale_v);
    const __m512 tile_max = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(x_lo, x_hi)));
    const __m512 old_max = _mm512_set1_ps(s.m[qv]);
    const __m512 new_max = _mm512_max_ps(old_max, tile_max);
    const __m512 corr = Exp512(_mm512_max_ps(_mm512_sub_ps(old_max, new_max), minus_inf));
    const __m512 w_lo = _mm512_mask_mov_ps(zero, keep_lo, Exp512(_mm512_sub_ps(x_lo, new_max)));
    const __m512 w_hi = _mm512_mask_mov_ps(zero, keep_hi, Exp512(_mm512_sub_ps(x_hi, new_max)));
    // Softmax's tree: lanes j + 16, + 8, + 4, + 2, + 1.
    __m512 sum = _mm512_add_ps(w_lo, w_hi);
    sum = _mm512_add_ps(sum, _mm512_shuffle_f32x4(sum, sum, _MM_SHUFFLE(3, 2, 3, 2)));
    sum = _mm512_add_ps(sum, _mm512_shuffle_f32x4(sum, sum, _MM_SHUFFLE(1, 1, 1, 1)));
    sum = _mm512_add_ps(sum, _mm512_permute_ps(sum, _MM_SHUFFLE(3, 2, 3, 2)));
    sum = _mm512_add_ps(sum, _mm512_permute_ps(sum, _MM_SHUFFLE(1, 1, 1, 1)));
    s.m[qv] = _mm512_cvtss_f32(new_max);
    s.corr[qv] = _mm512_cvtss_f32(corr);
    s.l[qv] = _mm512_cvtss_f32(
        _mm512_fmadd_ps(_mm512_set1_ps(s.l[qv]), corr, _mm512_set1_ps(_mm512_cvtss_f32(sum))));
    // cvtne2ps_pbh(a, b): elements 0-15 from b, 16-31 from a.
    _mm512_storeu_si512(s.p.data() + qv * kKvTile,
                        reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w_hi, w_lo)));
  }
}

// The weights as A tiles: block b's row c holds query vector 16 b + c's 32 weights in
// position order, BF16.
void WeightTiles(int64_t qs, int64_t blocks, Scratch& s) {
  const float* const st = s.st.data();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 rows[16];  // rows[r], lane c: query vector c's weights at positions 2r, 2r + 1
    for (int r = 0; r < 16; ++r) {
      rows[r] =
          reinterpret_cast<__m512>(PairUp(_mm512_loadu_ps(st + 2 * r * qs + b * kLanes),
                                          _mm512_loadu_ps(st + (2 * r + 1) * qs + b * kLanes)));
    }
    Transpose16x16(rows);
    for (int c = 0; c < 16; ++c) {
      _mm512_storeu_si512(s.p.data() + (b * kLanes + c) * kKvTile,
                          reinterpret_cast<__m512i>(rows[c]));
    }
  }
}

// o[qv] = o[qv] corr[qv] + sum_j p[qv][j] v_j (`v`: the V tiles): the rescale in F32 vectors
// of the first `rows` query vectors (those whose outputs are kept; skipped for a block whose
// factors are all exactly 1, as they mostly are once the max has settled: the same bits), then
// one C tile (16 query vectors x 16 head dims) at a time loaded from o, the product added,
// stored back.
void Accumulate(int64_t d, int64_t rows, int64_t blocks, const uint16_t* v, Scratch& s) {
  float* const o = s.o.data();
  for (int64_t b = 0; b < blocks; ++b) {
    if (_mm512_cmpneq_ps_mask(_mm512_loadu_ps(s.corr.data() + b * kLanes), _mm512_set1_ps(1.0f)) ==
        0) {
      continue;
    }
    for (int64_t qv = b * kLanes; qv < std::min((b + 1) * kLanes, rows); ++qv) {
      const __m512 c = _mm512_set1_ps(s.corr[qv]);
      for (int64_t i = 0; i < d; i += kLanes) {
        _mm512_storeu_ps(o + qv * d + i, _mm512_mul_ps(_mm512_loadu_ps(o + qv * d + i), c));
      }
    }
  }
  const int64_t o_stride = d * 4;
  for (int64_t b = 0; b < blocks; ++b) {
    _tile_loadd(4, s.p.data() + b * kLanes * kKvTile, kKvTile * 2);
    for (int64_t i = 0; i < d; i += kLanes) {
      float* const c = o + b * kLanes * d + i;
      _tile_loadd(0, c, o_stride);
      _tile_loadd(6, v + i / kLanes * kTileValues, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_stored(0, c, o_stride);
    }
  }
}

// The pool offsets (elements) of the task's KV-head rows at positions [p0, p1), a block at a
// time (one division per block, not per position).
void RowOffsets(const KvLayerView& cache, const AttentionTask& tile, int64_t p0, int64_t p1,
                int64_t* out) {
  const int64_t bs = cache.block_size, kv_row = cache.num_kv_heads * cache.head_dim;
  const int64_t head = tile.kv_head * cache.head_dim;
  for (int64_t pos = p0; pos < p1;) {
    const int64_t in_block = pos % bs, count = std::min(bs - in_block, p1 - pos);
    const int64_t base =
        (static_cast<int64_t>(tile.blocks[pos / bs]) * bs + in_block) * kv_row + head;
    for (int64_t i = 0; i < count; ++i) out[pos - p0 + i] = base + i * kv_row;
    pos += count;
  }
}

// The KV tile whose `n` positions' rows sit at `rows` (offsets) as BF16 A tiles of K (zero rows
// past n; `k` nullptr: K is read from the pool, DirectK) and B tiles of V (zero values past n:
// their weights are 0, and 0 x a stale row of the pool could be NaN); the `next_n` rows of the
// tile after it (`next`) asked into L2 (their blocks are scattered, which hardware prefetchers
// do not follow).
template <typename E>
void StageKv(const KvLayerView& cache, const int64_t* rows, int64_t n, const int64_t* next,
             int64_t next_n, int64_t d_pad, uint16_t* k, uint16_t* v) {
  const int64_t d = cache.head_dim;
  const E* const k_pool = static_cast<const E*>(cache.k);
  const E* const v_pool = static_cast<const E*>(cache.v);
  const E* v_src[kKvTile] = {};
  for (int64_t j = 0; j < n; ++j) {
    if (k != nullptr) RowToBf16(k_pool + rows[j], d, k + j * d_pad);
    v_src[j] = v_pool + rows[j];
  }
  if (k != nullptr && n < kKvTile) std::fill(k + n * d_pad, k + kKvTile * d_pad, uint16_t{0});
  for (int64_t r = 0; r < kKvTile / 2; ++r) {
    for (int64_t i = 0; i < d; i += kLanes) {
      _mm512_storeu_si512(v + i / kLanes * kTileValues + r * kTileK,
                          PairedV(v_src[2 * r], v_src[2 * r + 1], i));
    }
  }
  const int64_t row_bytes = d * static_cast<int64_t>(sizeof(E));
  for (int64_t j = 0; j < next_n; ++j) {
    const char* const k_row = reinterpret_cast<const char*>(k_pool + next[j]);
    const char* const v_row = reinterpret_cast<const char*>(v_pool + next[j]);
    for (int64_t byte = 0; byte < row_bytes; byte += 64) {
      __builtin_prefetch(k_row + byte, 0, 2);
      __builtin_prefetch(v_row + byte, 0, 2);
    }
  }
}

// Whether K's A tiles load straight from a pool of element E: BF16 rows a whole number of
// tile rows wide (no padding), and blocks of whole 16-position A tiles (a tile's rows are
// consecutive slots of one block, kv_row elements apart). Rows past a tile's end are then the
// pool's stale slots, not zeros: their scores are masked (Softmax<true>) and only padding
// lanes, whose outputs are dropped, see them unmasked.
template <typename E>
bool DirectK(const KvLayerView& cache) {
  return std::is_same_v<E, Bf16Bits> && cache.head_dim % kTileK == 0 &&
         cache.block_size % kLanes == 0;
}

template <typename E>
void Run(const KvLayerView& cache, float scale, const AttentionTask& tile) {
  thread_local Scratch s;
  const int64_t d = cache.head_dim;
  const int64_t steps = (d + kTileK - 1) / kTileK, d_pad = steps * kTileK;
  const int64_t num_q = tile.num_rows * tile.num_heads;
  const int64_t blocks = (num_q + kLanes - 1) / kLanes, qs = blocks * kLanes;
  s.qt.assign(blocks * steps * kTileValues, 0);
  s.k.resize(kKvTile * d_pad);
  s.v.resize(d / kLanes * kTileValues);
  s.p.resize(qs * kKvTile);
  s.st.resize(kKvTile * qs);
  s.o.assign(qs * d, 0.0f);
  s.m.assign(qs, -std::numeric_limits<float>::infinity());
  s.l.assign(qs, 0.0f);
  s.corr.resize(qs);
  s.limit.resize(qs);
  s.lower.resize(qs);
  // Q^T as B tiles: query vector qv = row * num_heads + head is lane qv % 16 of block qv / 16;
  // padding lanes keep zero queries and no limit.
  alignas(64) uint16_t q_bf16[kMaxHeadDim + kTileK];
  uint32_t* const qt = reinterpret_cast<uint32_t*>(s.qt.data());
  for (int64_t qv = 0; qv < qs; ++qv) {
    if (qv >= num_q) {
      s.limit[qv] = std::numeric_limits<int32_t>::max();
      s.lower[qv] = 0;
      continue;
    }
    const int64_t row = qv / tile.num_heads, head = qv % tile.num_heads;
    RowToBf16(tile.q + row * tile.token_stride + head * d, d, q_bf16);
    const int64_t b = qv / kLanes, lane = qv % kLanes;
    for (int64_t pair = 0; pair < d_pad / 2; ++pair) {
      uint32_t both;
      std::memcpy(&both, q_bf16 + 2 * pair, sizeof(both));
      qt[((b * steps + pair / 16) * 16 + pair % 16) * kLanes + lane] = both;
    }
    s.limit[qv] = static_cast<int32_t>(tile.attend_len + row);
    s.lower[qv] = static_cast<int32_t>(LowerLimit(tile, row));
  }

  const int64_t end = tile.attend_len + tile.num_rows - 1;  // the last row's limit
  const int64_t start = LowerLimit(tile, 0) / kKvTile * kKvTile;
  const int64_t last_lower = LowerLimit(tile, tile.num_rows - 1);
  const bool direct = DirectK<E>(cache);
  // SoftmaxFew writes the P rows and rescale factors of real query vectors only: padding rows
  // stay zero, their factors 1 (no rescale on their account).
  const bool few = num_q <= kMaxFew;
  if (few) {
    std::fill(s.p.begin(), s.p.end(), uint16_t{0});
    std::fill(s.corr.begin(), s.corr.end(), 1.0f);
  }
  if (direct && s.zero.size() < static_cast<size_t>(kLanes * d_pad)) s.zero.resize(kLanes * d_pad);
  const int64_t kv_row = cache.num_kv_heads * d;
  // This KV tile's row offsets, and the next one's (computed for its prefetch, then used).
  int64_t offsets[2][kKvTile];
  int64_t* rows = offsets[0];
  int64_t* next = offsets[1];
  RowOffsets(cache, tile, start, std::min(end, start + kKvTile), rows);
  for (int64_t kv0 = start; kv0 < end; kv0 += kKvTile) {
    const int64_t n = std::min(kKvTile, end - kv0);
    const int64_t next_n = std::clamp<int64_t>(end - kv0 - kKvTile, 0, kKvTile);
    RowOffsets(cache, tile, kv0 + kKvTile, kv0 + kKvTile + next_n, next);
    StageKv<E>(cache, rows, n, next, next_n, d_pad, direct ? nullptr : s.k.data(), s.v.data());
    if (direct) {
      // The A tile of 16 positions from j: in the pool (rows kv_row apart), or zeros.
      const auto a_tile = [&](int64_t j) -> std::pair<const uint16_t*, int64_t> {
        if (j >= n) return {s.zero.data(), d_pad * 2};
        return {&static_cast<const Bf16Bits*>(cache.k)[rows[j]].bits, kv_row * 2};
      };
      const auto [lo, lo_stride] = a_tile(0);
      const auto [hi, hi_stride] = a_tile(kLanes);
      Scores(steps, blocks, qs, lo, lo_stride, hi, hi_stride, s);
    } else {
      Scores(steps, blocks, qs, s.k.data(), d_pad * 2, s.k.data() + kLanes * d_pad, d_pad * 2, s);
    }
    const bool masked = kv0 + kKvTile > tile.attend_len || kv0 < last_lower;
    if (few) {
      masked ? SoftmaxFew<true>(scale, kv0, n, num_q, s)
             : SoftmaxFew<false>(scale, kv0, n, num_q, s);
    } else {
      masked ? Softmax<true>(scale, kv0, n, qs, blocks, s)
             : Softmax<false>(scale, kv0, n, qs, blocks, s);
      WeightTiles(qs, blocks, s);
    }
    Accumulate(d, few ? num_q : qs, blocks, s.v.data(), s);
    std::swap(rows, next);
  }
  for (int64_t qv = 0; qv < num_q; ++qv) {
    const int64_t row = qv / tile.num_heads, head = qv % tile.num_heads;
    float* out = tile.out + row * tile.token_stride + head * d;
    const __m512 inverse = _mm512_set1_ps(1.0f / WithSink(tile, head, s.l[qv], s.m[qv]));
    for (int64_t i = 0; i < d; i += kLanes) {
      _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(s.o.data() + qv * d + i), inverse));
    }
  }
}

}  // namespace

void BeginAmxBf16Tiles() { LoadTileConfig(FullTileConfig()); }
void EndAmxBf16Tiles() { _tile_release(); }

void AttendTileAmxBf16(const KvLayerView& cache, float scale, const AttentionTask& tile) {
  if (cache.dtype == KvDtype::kF16) {
    Run<uint16_t>(cache, scale, tile);
  } else if (cache.dtype == KvDtype::kBf16) {
    Run<Bf16Bits>(cache, scale, tile);
  } else {
    Run<float>(cache, scale, tile);
  }
}

}  // namespace loom::kernels::cpu::internal
