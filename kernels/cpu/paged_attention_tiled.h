#pragma once

// Internal to kernels/cpu: the FlashAttention-style tile loop of PagedAttention's prefill
// path, written once over a vector-ISA traits type and instantiated by
// paged_attention_avx2.cc (8 lanes) and paged_attention_avx512.cc (16 lanes). Include only
// from those translation units (they are compiled with the ISA's flags).
//
// A tile is up to 64 query vectors (rows of one sequence x the query heads of one KV head)
// against the sequence's KV, taken kKvTile = 2 x lanes positions at a time:
//   S^T[j][qv] = k_j . q_qv   vectors run over query vectors (Q transposed once per tile),
//                             each K element broadcast: no horizontal sums;
//   online softmax            running max, rescale factor and sum per query vector, all
//                             lane-wise (the max over j is an element-wise max);
//   O[qv] = O[qv] c + sum_j p[j][qv] V[j]   register tiles of query vectors x head-dim
//                             vectors, each V row loaded once per register tile.
// Causal masking happens only in the KV tiles that reach past the first row's limit (and,
// with a sliding window, in those that start before the last row's first position; tiles
// start at the one holding row 0's first position).
// A tile of few query vectors (a decode token: one row x the heads of one KV head) would
// fill few lanes that way; it takes positions as lanes instead (FewScores / FewSoftmax:
// K transposed in registers, the softmax's max and sum folded lane by lane in position
// order), every operation the same as the query-lane path's, so the same bits. It reads
// F16 and 8-bit K and V straight from the cache (converted in registers, exactly); the
// query-lane path, which loads each V row once per register tile, converts a KV tile once
// into scratch.
//
// 8-bit KV (kv_dtype.h) is dequantized inside the loop without a multiply per element:
// a position's K scale joins the softmax scale (score_j = (q . code_j) x scale x s_k[j])
// and its V scale joins its softmax weight (w_j x s_v[j]) after the weight has been added
// to the running sum, so the codes enter the FMAs as they are (converted to float).
//
// Each query vector's arithmetic (the order of every sum, the KV tile boundaries at
// absolute positions 0, kKvTile, 2 kKvTile, ...) depends only on that vector and its
// sequence's cache, never on the other rows or heads that share its tile: a token's result
// is bit for bit the same whatever tile, chunk split or batch it is computed in (a KV tile
// wholly past a row's limit rescales by exactly 1 and adds exactly 0). Positions past a
// row's limit inside its diagonal tile contribute 0 x V, exact for finite V.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/kv_dtype.h"
#include "kernels/cpu/paged_attention_internal.h"

namespace loom::kernels::cpu::internal::tiled {

/// Per-thread scratch of one tile, grown on demand.
struct Scratch {
  std::vector<float> qt;    // [head_dim][qs]: the queries, transposed
  std::vector<float> p;     // [kv_tile][qs]: scores, then softmax weights
  std::vector<float> o;     // [num_q][head_dim]: unnormalized outputs
  std::vector<float> kv;    // [2][kv_tile][head_dim]: 16-bit or 8-bit K and V rows as float
  std::vector<float> zero;  // [head_dim] zeros: the K row of a position past the tile's end
  std::vector<float> m, l, corr;  // [qs]: running max, running sum, this tile's rescale
  std::vector<int32_t> limit;     // [qs]: a query vector attends to positions < limit
  std::vector<int32_t> lower;     // [qs]: ... and >= lower (0 without a sliding window)
  float pt[8 * 32];               // few query vectors: [qv][kv_tile] scores, then weights
  float ks[32], vs[32];           // 8-bit KV: [kv_tile] score scale x K scale, V scale
};

/// V: the ISA traits (see paged_attention_avx512.cc / _avx2.cc): kLanes, Vec, Zero, Load,
/// LoadHalf (F16 to float), LoadBf16, LoadInt8, LoadFp8 (8-bit codes to float, see KvDecodeFactor),
/// Store, Set1, Broadcast (from memory), Fmadd, Mul, Add, Sub, Max (the second operand where either
/// is NaN), Exp, and MaskOutside(x, lower, limit, position, fill): lanes whose limit <= position or
/// whose lower > position take fill. kQkVecs x kQkPositions accumulators for S, kPvQueries x
/// kPvVecs for O.
template <class V, KvDtype kDtype>
class TileKernel {
 public:
  static constexpr int kLanes = V::kLanes;
  static constexpr int64_t kKvTile = 2 * kLanes;
  static constexpr bool kQuantized = IsQuantizedKv(kDtype);
  // Tiles of up to this many query vectors take positions as lanes (FewScores): the
  // transpose of K costs about as much as kLanes / 2 query vectors' score FMAs.
  static constexpr int kMaxFew = kLanes / 2;
  using Element = std::conditional_t<
      kDtype == KvDtype::kF16, uint16_t,
      std::conditional_t<
          kDtype == KvDtype::kBf16, Bf16Bits,
          std::conditional_t<kDtype == KvDtype::kF32, float,
                             std::conditional_t<kDtype == KvDtype::kInt8, int8_t, uint8_t>>>>;
  static constexpr int64_t kElementBytes = sizeof(Element);

  static void Run(const KvLayerView& cache, float scale, const AttentionTask& tile) {
    thread_local Scratch s;
    const int64_t d = cache.head_dim;
    const int64_t num_q = tile.num_rows * tile.num_heads;
    const int64_t num_vecs = (num_q + kLanes - 1) / kLanes;
    const int64_t qs = num_vecs * kLanes;
    s.qt.resize(d * qs);
    s.p.resize(kKvTile * qs);
    s.o.assign(num_q * d, 0.0f);
    s.kv.resize(2 * kKvTile * d);
    s.zero.assign(d, 0.0f);
    s.m.assign(qs, -std::numeric_limits<float>::infinity());
    s.l.assign(qs, 0.0f);
    s.corr.resize(qs);
    s.limit.resize(qs);
    s.lower.resize(qs);
    // Query vector qv = row * num_heads + head; padding lanes get zero queries and no limit.
    const bool few = num_q <= kMaxFew;
    const float* q_rows[kMaxFew];
    for (int64_t qv = 0; qv < qs; ++qv) {
      const int64_t row = qv / tile.num_heads, head = qv % tile.num_heads;
      if (qv < num_q) {
        const float* q = tile.q + row * tile.token_stride + head * d;
        if (few) {
          q_rows[qv] = q;
        } else {
          for (int64_t i = 0; i < d; ++i) s.qt[i * qs + qv] = q[i];
        }
        s.limit[qv] = static_cast<int32_t>(tile.attend_len + row);
        s.lower[qv] = static_cast<int32_t>(LowerLimit(tile, row));
      } else {
        if (!few) {
          for (int64_t i = 0; i < d; ++i) s.qt[i * qs + qv] = 0.0f;
        }
        s.limit[qv] = std::numeric_limits<int32_t>::max();
        s.lower[qv] = 0;
      }
    }
    const int64_t end = tile.attend_len + tile.num_rows - 1;  // the last row's limit
    const int64_t kv_row = cache.num_kv_heads * d, bs = cache.block_size;
    // Zero bytes are a zero of every element type (F16, F32, the 8-bit codes).
    const Element* zero = reinterpret_cast<const Element*>(s.zero.data());
    const float decode_scale = KvDecodeFactor(kDtype);
    const Element* k_src[kKvTile];  // in the cache
    const Element* v_src[kKvTile];
    const float* k_rows[kKvTile];   // as float (the query-lane path)
    const float* v_rows[kKvTile];
    // A query vector's KV tiles are those a tile of its own would take: a tile wholly
    // before its window leaves its state as it was (Softmax's NaN guard).
    const int64_t start = LowerLimit(tile, 0) / kKvTile * kKvTile;
    const int64_t last_lower = LowerLimit(tile, tile.num_rows - 1);
    for (int64_t kv0 = start; kv0 < end; kv0 += kKvTile) {
      const int64_t n = std::min(kKvTile, end - kv0);
      for (int64_t j = 0; j < kKvTile; ++j) {
        if (j >= n) {
          k_src[j] = v_src[j] = zero;
          if constexpr (kQuantized) s.ks[j] = s.vs[j] = 0.0f;
          continue;
        }
        const int64_t pos = kv0 + j;
        const int64_t slot = static_cast<int64_t>(tile.blocks[pos / bs]) * bs + pos % bs;
        const int64_t element = slot * kv_row + tile.kv_head * d;
        k_src[j] = static_cast<const Element*>(cache.k) + element;
        v_src[j] = static_cast<const Element*>(cache.v) + element;
        if constexpr (kQuantized) {
          const int64_t head = slot * cache.num_kv_heads + tile.kv_head;
          s.ks[j] = scale * (decode_scale * Bf16ToFloat(cache.k_scale[head]));
          s.vs[j] = decode_scale * Bf16ToFloat(cache.v_scale[head]);
        }
      }
      if (!few) {
        for (int64_t j = 0; j < kKvTile; ++j) {
          if constexpr (kDtype != KvDtype::kF32) {
            float* k = s.kv.data() + j * d;
            float* v = s.kv.data() + (kKvTile + j) * d;
            for (int64_t i = 0; i < d; i += kLanes) {
              V::Store(k + i, LoadRow(k_src[j] + i));
              V::Store(v + i, LoadRow(v_src[j] + i));
            }
            k_rows[j] = k;
            v_rows[j] = v;
          } else {
            k_rows[j] = k_src[j];
            v_rows[j] = v_src[j];
          }
        }
      }
      // The next KV tile's rows start coming from memory while this one is computed (its
      // blocks are scattered, which hardware prefetchers do not follow). Into L2
      // (prefetcht1), not L1: a 64-sequence decode step's KV (100+ MB over 30 layers) comes
      // from DRAM, and its attention ran 1.35x faster on AVX2 with prefetcht1 than with
      // prefetcht0 (5.4 -> 7.3 GB/s of KV; L1's few miss buffers are likely what the
      // tile's own loads waited for).
      for (int64_t pos = kv0 + kKvTile; pos < std::min(end, kv0 + 2 * kKvTile); ++pos) {
        const int64_t element =
            (static_cast<int64_t>(tile.blocks[pos / bs]) * bs + pos % bs) * kv_row +
            tile.kv_head * d;
        for (int64_t byte = 0; byte < d * kElementBytes; byte += 64) {
          __builtin_prefetch(static_cast<const char*>(cache.k) + element * kElementBytes + byte,
                             /*rw=*/0, /*locality=*/2);
          __builtin_prefetch(static_cast<const char*>(cache.v) + element * kElementBytes + byte,
                             /*rw=*/0, /*locality=*/2);
        }
      }
      const bool diagonal = kv0 + kKvTile > tile.attend_len || kv0 < last_lower;
      if (few) {
        FewScores<kMaxFew>(num_q, d, q_rows, k_src, s.pt);
        if (diagonal) {
          FewSoftmax<true>(scale, kv0, n, qs, num_q, s);
        } else {
          FewSoftmax<false>(scale, kv0, n, qs, num_q, s);
        }
        Accumulate(d, qs, num_q, n, v_src, s);
      } else {
        Scores(d, qs, num_vecs, k_rows, s.qt.data(), s.p.data());
        if (diagonal) {
          Softmax<true>(scale, kv0, n, qs, num_vecs, s);
        } else {
          Softmax<false>(scale, kv0, n, qs, num_vecs, s);
        }
        Accumulate(d, qs, num_q, n, v_rows, s);
      }
    }
    for (int64_t qv = 0; qv < num_q; ++qv) {
      const int64_t row = qv / tile.num_heads, head = qv % tile.num_heads;
      float* out = tile.out + row * tile.token_stride + head * d;
      const typename V::Vec inverse = V::Set1(1.0f / WithSink(tile, head, s.l[qv], s.m[qv]));
      for (int64_t i = 0; i < d; i += kLanes) {
        V::Store(out + i, V::Mul(V::Load(s.o.data() + qv * d + i), inverse));
      }
    }
  }

 private:
  using Vec = typename V::Vec;

  // A cache row's vector as float: F16 converts exactly.
  static Vec LoadRow(const float* p) { return V::Load(p); }
  static Vec LoadRow(const uint16_t* p) { return V::LoadHalf(p); }
  static Vec LoadRow(const Bf16Bits* p) { return V::LoadBf16(&p->bits); }
  // 8-bit codes: exact, the scale applied outside (see the file comment).
  static Vec LoadRow(const int8_t* p) { return V::LoadInt8(p); }
  static Vec LoadRow(const uint8_t* p) { return V::LoadFp8(p); }

  // p[j][qv] = q_qv . k_j for j < kKvTile, kVecs query vectors from `vec` and kPositions
  // positions from j0 in registers.
  template <int kVecs, int kPositions>
  static void ScoreBlock(int64_t d, int64_t qs, int64_t vec, int64_t j0, const float* const* k_rows,
                         const float* qt, float* p) {
    Vec acc[kVecs][kPositions];
    for (int a = 0; a < kVecs; ++a) {
      for (int b = 0; b < kPositions; ++b) acc[a][b] = V::Zero();
    }
    const float* k[kPositions];
    for (int b = 0; b < kPositions; ++b) k[b] = k_rows[j0 + b];
    for (int64_t i = 0; i < d; ++i) {
      Vec q[kVecs];
      for (int a = 0; a < kVecs; ++a) q[a] = V::Load(qt + i * qs + (vec + a) * kLanes);
      for (int b = 0; b < kPositions; ++b) {
        const Vec kb = V::Broadcast(k[b] + i);
        for (int a = 0; a < kVecs; ++a) acc[a][b] = V::Fmadd(q[a], kb, acc[a][b]);
      }
    }
    for (int a = 0; a < kVecs; ++a) {
      for (int b = 0; b < kPositions; ++b) V::Store(p + (j0 + b) * qs + (vec + a) * kLanes, acc[a][b]);
    }
  }

  template <int kVecs>
  static void ScoreVecs(int64_t d, int64_t qs, int64_t vec, const float* const* k_rows,
                        const float* qt, float* p) {
    for (int64_t j0 = 0; j0 < kKvTile; j0 += V::kQkPositions) {
      ScoreBlock<kVecs, V::kQkPositions>(d, qs, vec, j0, k_rows, qt, p);
    }
  }

  static void Scores(int64_t d, int64_t qs, int64_t num_vecs, const float* const* k_rows,
                     const float* qt, float* p) {
    constexpr int kStep = V::kQkVecs;
    int64_t vec = 0;
    for (; vec + kStep <= num_vecs; vec += kStep) ScoreVecs<kStep>(d, qs, vec, k_rows, qt, p);
    switch (num_vecs - vec) {  // kQkVecs <= 4
      case 3:
        if constexpr (kStep > 3) ScoreVecs<3>(d, qs, vec, k_rows, qt, p);
        break;
      case 2:
        if constexpr (kStep > 2) ScoreVecs<2>(d, qs, vec, k_rows, qt, p);
        break;
      case 1:
        if constexpr (kStep > 1) ScoreVecs<1>(d, qs, vec, k_rows, qt, p);
        break;
      default:
        break;
    }
  }

  // Scales and masks the scores of positions kv0 .. kv0 + n, updates the running max and
  // sum of each query vector, and turns the scores into weights (0 where masked).
  template <bool kMasked>
  static void Softmax(float scale, int64_t kv0, int64_t n, int64_t qs, int64_t num_vecs,
                      Scratch& s) {
    const Vec scale_v = V::Set1(scale);
    const Vec minus_inf = V::Set1(-std::numeric_limits<float>::infinity());
    for (int64_t vec = 0; vec < num_vecs; ++vec) {
      const int64_t lane0 = vec * kLanes;
      const auto limit = V::LoadLimit(s.limit.data() + lane0);
      const auto lower = V::LoadLimit(s.lower.data() + lane0);
      Vec tile_max = minus_inf;
      for (int64_t j = 0; j < n; ++j) {
        Vec x =
            V::Mul(V::Load(s.p.data() + j * qs + lane0), kQuantized ? V::Set1(s.ks[j]) : scale_v);
        if constexpr (kMasked) x = V::MaskOutside(x, lower, limit, kv0 + j, minus_inf);
        V::Store(s.p.data() + j * qs + lane0, x);
        tile_max = V::Max(tile_max, x);
      }
      const Vec old_max = V::Load(s.m.data() + lane0);
      const Vec new_max = V::Max(old_max, tile_max);
      // exp(0) = 1 exactly where the max held; exp(-inf) = 0 on the first tile.
      // A query vector with nothing seen yet and nothing in this tile (before its window) has
      // -inf - -inf = NaN here: Max turns it into -inf, so corr is 0 and its state (all
      // zeros) stays as it was.
      const Vec corr = V::Exp(V::Max(V::Sub(old_max, new_max), minus_inf));
      Vec sum = V::Zero();
      for (int64_t j = 0; j < n; ++j) {
        Vec w = V::Exp(V::Sub(V::Load(s.p.data() + j * qs + lane0), new_max));
        if constexpr (kMasked) w = V::MaskOutside(w, lower, limit, kv0 + j, V::Zero());
        V::Store(s.p.data() + j * qs + lane0, kQuantized ? V::Mul(w, V::Set1(s.vs[j])) : w);
        sum = V::Add(sum, w);
      }
      V::Store(s.m.data() + lane0, new_max);
      V::Store(s.corr.data() + lane0, corr);
      V::Store(s.l.data() + lane0, V::Fmadd(V::Load(s.l.data() + lane0), corr, sum));
    }
  }

  // pt[qv][j] = q_qv . k_j for j < kKvTile and kQ query vectors, positions in lanes: each
  // lane is the same FMA chain over i from zero as ScoreBlock's.
  template <int kQ, typename E>
  static void FewScoresOf(int64_t d, const float* const* q_rows, const E* const* k_rows,
                          float* pt) {
    for (int64_t j0 = 0; j0 < kKvTile; j0 += kLanes) {
      Vec acc[kQ];
      for (int a = 0; a < kQ; ++a) acc[a] = V::Zero();
      for (int64_t i0 = 0; i0 < d; i0 += kLanes) {
        Vec kt[kLanes];  // kt[c]: element i0 + c of positions j0 .. j0 + kLanes
        for (int r = 0; r < kLanes; ++r) kt[r] = LoadRow(k_rows[j0 + r] + i0);
        V::Transpose(kt);
        for (int c = 0; c < kLanes; ++c) {
          for (int a = 0; a < kQ; ++a) acc[a] = V::Fmadd(V::Broadcast(q_rows[a] + i0 + c), kt[c], acc[a]);
        }
      }
      for (int a = 0; a < kQ; ++a) V::Store(pt + a * kKvTile + j0, acc[a]);
    }
  }

  // FewScoresOf for a run-time count 1 <= num_q <= kQ.
  template <int kQ, typename E>
  static void FewScores(int64_t num_q, int64_t d, const float* const* q_rows,
                        const E* const* k_rows, float* pt) {
    if constexpr (kQ > 1) {
      if (num_q < kQ) return FewScores<kQ - 1, E>(num_q, d, q_rows, k_rows, pt);
    }
    FewScoresOf<kQ, E>(d, q_rows, k_rows, pt);
  }

  // max as V::Max computes it lane-wise (the second operand unless a > b).
  static float MaxLikeVector(float a, float b) { return a > b ? a : b; }

  // Softmax for the few-query-vector layout: the same operations per query vector, in the
  // same order (max and sum folded over j < n), weights written to p[j][qv] for Accumulate.
  template <bool kMasked>
  static void FewSoftmax(float scale, int64_t kv0, int64_t n, int64_t qs, int64_t num_q,
                         Scratch& s) {
    constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
    const Vec scale_v = V::Set1(scale);
    for (int64_t qv = 0; qv < num_q; ++qv) {
      float* x = s.pt + qv * kKvTile;
      for (int64_t j0 = 0; j0 < kKvTile; j0 += kLanes) {
        V::Store(x + j0, V::Mul(V::Load(x + j0), kQuantized ? V::Load(s.ks + j0) : scale_v));
      }
      const int64_t limit = s.limit[qv], lower = s.lower[qv];
      float tile_max = kMinusInf;
      for (int64_t j = 0; j < n; ++j) {
        if (kMasked && (limit <= kv0 + j || lower > kv0 + j)) x[j] = kMinusInf;
        tile_max = MaxLikeVector(tile_max, x[j]);
      }
      const float old_max = s.m[qv];
      const float new_max = MaxLikeVector(old_max, tile_max);
      float lanes[kLanes];
      V::Store(lanes, V::Exp(V::Max(V::Set1(old_max - new_max), V::Set1(kMinusInf))));
      const float corr = lanes[0];
      const Vec max_v = V::Set1(new_max);
      for (int64_t j0 = 0; j0 < kKvTile; j0 += kLanes) V::Store(x + j0, V::Exp(V::Sub(V::Load(x + j0), max_v)));
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float w = kMasked && (limit <= kv0 + j || lower > kv0 + j) ? 0.0f : x[j];
        s.p[j * qs + qv] = kQuantized ? w * s.vs[j] : w;
        sum += w;
      }
      s.m[qv] = new_max;
      s.corr[qv] = corr;
      s.l[qv] = std::fma(s.l[qv], corr, sum);
    }
  }

  // o[qv][i0 ..] = o[qv][i0 ..] corr[qv] + sum_{j < n} p[j][qv] v_j[i0 ..] for kQueries
  // query vectors from qv0 and kVecs head-dim vectors from i0, in registers.
  template <int kQueries, int kVecs, typename E>
  static void AccumulateBlock(int64_t d, int64_t qs, int64_t qv0, int64_t i0, int64_t n,
                              const E* const* v_rows, Scratch& s) {
    Vec acc[kQueries][kVecs];
    for (int a = 0; a < kQueries; ++a) {
      const Vec c = V::Set1(s.corr[qv0 + a]);
      for (int b = 0; b < kVecs; ++b) {
        acc[a][b] = V::Mul(V::Load(s.o.data() + (qv0 + a) * d + i0 + b * kLanes), c);
      }
    }
    const float* p = s.p.data() + qv0;
    for (int64_t j = 0; j < n; ++j) {
      Vec v[kVecs];
      for (int b = 0; b < kVecs; ++b) v[b] = LoadRow(v_rows[j] + i0 + b * kLanes);
      for (int a = 0; a < kQueries; ++a) {
        const Vec w = V::Broadcast(p + j * qs + a);
        for (int b = 0; b < kVecs; ++b) acc[a][b] = V::Fmadd(w, v[b], acc[a][b]);
      }
    }
    for (int a = 0; a < kQueries; ++a) {
      for (int b = 0; b < kVecs; ++b) {
        V::Store(s.o.data() + (qv0 + a) * d + i0 + b * kLanes, acc[a][b]);
      }
    }
  }

  template <int kQueries, typename E>
  static void AccumulateQueries(int64_t d, int64_t qs, int64_t qv0, int64_t n,
                                const E* const* v_rows, Scratch& s) {
    constexpr int kStep = V::kPvVecs;
    const int64_t vecs = d / kLanes;
    int64_t vec = 0;
    for (; vec + kStep <= vecs; vec += kStep) {
      AccumulateBlock<kQueries, kStep, E>(d, qs, qv0, vec * kLanes, n, v_rows, s);
    }
    for (; vec < vecs; ++vec) {
      AccumulateBlock<kQueries, 1, E>(d, qs, qv0, vec * kLanes, n, v_rows, s);
    }
  }

  template <int kQueries, typename E>
  static void AccumulateTail(int64_t remaining, int64_t d, int64_t qs, int64_t qv0, int64_t n,
                             const E* const* v_rows, Scratch& s) {
    if constexpr (kQueries > 1) {
      if (remaining < kQueries) {
        return AccumulateTail<kQueries - 1, E>(remaining, d, qs, qv0, n, v_rows, s);
      }
    }
    AccumulateQueries<kQueries, E>(d, qs, qv0, n, v_rows, s);
  }

  // V rows as float (the query-lane path's scratch) or straight from the cache.
  template <typename E>
  static void Accumulate(int64_t d, int64_t qs, int64_t num_q, int64_t n,
                         const E* const* v_rows, Scratch& s) {
    constexpr int kStep = V::kPvQueries;
    int64_t qv = 0;
    for (; qv + kStep <= num_q; qv += kStep) {
      AccumulateQueries<kStep, E>(d, qs, qv, n, v_rows, s);
    }
    if (qv < num_q) AccumulateTail<kStep - 1, E>(num_q - qv, d, qs, qv, n, v_rows, s);
  }
};

}  // namespace loom::kernels::cpu::internal::tiled
