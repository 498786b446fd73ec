#pragma once

// Internal to kernels/cpu: the per-ISA inner loops of PagedAttention and WriteKv.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/paged_attention.h"

namespace loom::kernels::cpu::internal {

/// The cache's KV head that local query head `h` reads (see PagedAttentionParams::group).
inline int64_t KvHeadOf(const PagedAttentionParams& p, int64_t h) {
  if (p.group == 0) return h / (p.num_heads / p.cache.num_kv_heads);
  return (p.head0 + h) / p.group - p.kv_head0;
}

/// Head dims up to kMaxHeadDim.
inline constexpr int64_t kMaxHeadDim = 1024;
/// A task holds at most kMaxTaskHeads query heads and kMaxTaskFloats accumulator floats
/// (num_heads * head_dim), which bounds the stack it uses.
inline constexpr int64_t kMaxTaskHeads = 8;
inline constexpr int64_t kMaxTaskFloats = 2048;

/// The longest run of query heads one task may take at this head dim (>= 2).
inline int64_t MaxTaskHeads(int64_t head_dim) {
  const int64_t by_floats = kMaxTaskFloats / head_dim;
  return by_floats < kMaxTaskHeads ? by_floats : kMaxTaskHeads;
}

/// A BF16 pool's element: a type of its own, so that the kernels' per-element-type overloads
/// tell it from F16's uint16_t.
struct Bf16Bits {
  uint16_t bits;
};
static_assert(sizeof(Bf16Bits) == 2);

/// Consecutive query heads that read the same KV head, of num_rows consecutive tokens of
/// one sequence; row r attends to KV positions [0, attend_len + r). Grouping them lets each
/// K/V row be loaded (and converted from F16) once for all of them. The unit of work of
/// the per-token kernels (more than one row only for AttendAvx512, TaskRows, whose rows
/// give the bits one-row tasks give) and of the tiles (TileRows, paged_attention_tiled.h).
struct AttentionTask {
  const float* q = nullptr;         // row 0: [num_heads, head_dim]; row r at q + r * token_stride
  float* out = nullptr;             // the same layout as q
  int64_t token_stride = 0;         // floats between consecutive tokens (rows > 1)
  const int32_t* blocks = nullptr;  // the sequence's block ids
  int64_t kv_head = 0;
  int64_t num_heads = 1;   // 1 .. MaxTaskHeads(head_dim)
  int64_t num_rows = 1;    // 1 .. TaskRows(num_heads, head_dim), or TileRows(num_heads)
  int64_t attend_len = 0;  // row 0's, >= 1
  int64_t window = 0;      // > 0: row r attends only to [LowerLimit(r), attend_len + r)
  float softcap = 0.0f;    // > 0: scores soft-capped (PagedAttentionParams::softcap)
  const float* sinks = nullptr;  // [num_heads]: the task's heads' sinks, or nullptr (none)
};

/// A softmax denominator `sum` (of exp(score - max)) of the task's head `head` with its
/// attention sink joined (PagedAttentionParams::sinks); `sum` as is without sinks. A sink
/// far above every score sends it to infinity: the head's output becomes 0, its limit.
inline float WithSink(const AttentionTask& task, int64_t head, float sum, float max) {
  return task.sinks == nullptr ? sum : sum + std::exp(task.sinks[head] - max);
}

/// The first position row `row` of `task` attends to: 0, or with a sliding window the
/// window's first.
inline int64_t LowerLimit(const AttentionTask& task, int64_t row) {
  const int64_t lo = task.attend_len + row - task.window;
  return task.window > 0 && lo > 0 ? lo : 0;
}

/// A multi-row task holds at most kMaxTaskQueries query vectors (rows x heads), and at
/// most kMaxTaskFloats accumulator floats (query vectors x head_dim rounded up to 16).
inline constexpr int64_t kMaxTaskQueries = 24;

/// Rows per AVX-512 task for runs of `num_heads` heads of `head_dim` (>= 1).
inline int64_t TaskRows(int64_t num_heads, int64_t head_dim) {
  const int64_t by_floats = kMaxTaskFloats / ((head_dim + 15) / 16 * 16);
  const int64_t queries = by_floats < kMaxTaskQueries ? by_floats : kMaxTaskQueries;
  return queries / num_heads < 1 ? 1 : queries / num_heads;
}

/// A tile holds at most kMaxTileQueries query vectors (rows x heads) and kMaxTileRows rows.
inline constexpr int64_t kMaxTileQueries = 64;
inline constexpr int64_t kMaxTileRows = 32;

/// Rows per tile for runs of `num_heads` query heads: as many as fit kMaxTileQueries.
inline int64_t TileRows(int64_t num_heads) {
  const int64_t rows = kMaxTileQueries / num_heads;
  return rows < 1 ? 1 : rows > kMaxTileRows ? kMaxTileRows : rows;
}

/// FlashAttention-style tiles (paged_attention_tiled.h), for head dims that are a multiple
/// of the ISA's lanes (16 for AVX-512, 8 for AVX2; others take the per-token tasks).
void AttendTileAvx512(const KvLayerView& cache, float scale, const AttentionTask& tile);
void AttendTileAvx2(const KvLayerView& cache, float scale, const AttentionTask& tile);

/// The tiles with both products on AMX-BF16 (paged_attention_amx.cc) for --activations bf16:
/// F16 or F32 KV, head dims a multiple of 16. They take kAmxKvTile positions at a time from
/// a multiple of it, and round each softmax weight relative to the running max so far.
inline constexpr int64_t kAmxKvTile = 32;
void AttendTileAmxBf16(const KvLayerView& cache, float scale, const AttentionTask& tile);
/// The tile configuration AttendTileAmxBf16 computes under, loaded once for a run of tiles on
/// a thread (LDTILECFG costs about what a short decode tile's products do), and its release.
void BeginAmxBf16Tiles();
void EndAmxBf16Tiles();
/// Whether PagedAttention runs `p` on AttendTileAmxBf16 (PagedAttentionParams::activations).
bool RunsAmxBf16Tiles(const PagedAttentionParams& p);
/// Bench hook: false keeps --activations bf16's attention in float (as before the AMX tiles;
/// PagedAttentionReference follows it).
void SetAmxBf16AttentionForTesting(bool enabled);

/// Online-softmax attention of one task (float accumulation).
void AttendScalar(const KvLayerView& cache, float scale, const AttentionTask& task);
void AttendAvx512(const KvLayerView& cache, float scale, const AttentionTask& task);
/// AVX2 + FMA + F16C (one head at a time; head dims not a multiple of 8 run AttendScalar).
void AttendAvx2(const KvLayerView& cache, float scale, const AttentionTask& task);

/// dst[i] = FloatToHalf(src[i]) for i < count, bit for bit (NaNs stay NaNs, their payload
/// aside), with AVX-512 F16C conversions.
void FloatToHalfAvx512(const float* src, int64_t count, uint16_t* dst);
/// The same with AVX2's F16C conversions.
void FloatToHalfAvx2(const float* src, int64_t count, uint16_t* dst);
/// dst[i] = FloatToBf16(src[i]) (half.h) for i < count, bit for bit, in AVX2 integer lanes.
void FloatToBf16Avx2(const float* src, int64_t count, uint16_t* dst);

/// RotateKvRow (kv_dtype.h) on `count` rows of n floats each, n a power of two >= 8, with
/// AVX2 + FMA: the same additions and subtractions in the same order, so the same bits.
void RotateRowsAvx2(float* rows, int64_t count, int64_t n);

/// QuantizeKvRow (kv_dtype.h) for n a multiple of 8, with AVX2: the same codes and scale.
void QuantizeKvRowAvx2(KvDtype dtype, const float* x, int64_t n, void* codes, uint16_t* scale);

/// Calls f(std::integral_constant<KvDtype, dtype>{}): the one place a run-time KV type
/// becomes a kernel's template argument.
template <typename F>
void WithKvDtype(KvDtype dtype, F&& f) {
  switch (dtype) {
    case KvDtype::kF16:
      return f(std::integral_constant<KvDtype, KvDtype::kF16>{});
    case KvDtype::kBf16:
      return f(std::integral_constant<KvDtype, KvDtype::kBf16>{});
    case KvDtype::kF32:
      return f(std::integral_constant<KvDtype, KvDtype::kF32>{});
    case KvDtype::kInt8:
      return f(std::integral_constant<KvDtype, KvDtype::kInt8>{});
    case KvDtype::kFp8E4m3:
      return f(std::integral_constant<KvDtype, KvDtype::kFp8E4m3>{});
  }
}

/// Test hook: false forces the scalar paths of WriteKv and PagedAttention even where
/// AVX-512 or AVX2 is available.
void SetAttentionSimdForTesting(bool enabled);

/// Which tokens run in tiles. Every token of a step runs the same kind of kernel, so a
/// token's result never depends on the step it is in (batch, prefill chunk, prefix-cache
/// remainder, speculative verify): the tiles and the per-token loop round differently.
enum class TileMode {
  kOff,   // the per-token kernel everywhere
  kAuto,  // the default: tiles on AVX2 (they beat its per-token loop at decode too); on
          // AVX-512 the per-token kernel, whose multi-row tasks (TaskRows tokens share each
          // K/V row) match the tiles at prefill and whose one-row decode the tiles do not
          // (about 2x slower at one sequence: 3 of 16 lanes busy for SmolLM2's 3 heads per
          // KV head, or a transpose of K per tile in their few-query path)
  kOn,    // tiles wherever the ISA has them (AVX-512 too; tests and benchmarks)
};

/// Test/bench hook (kAuto restores the default).
void SetTileModeForTesting(TileMode mode);

/// Bench hook: false gives AVX-512's per-token kernel one-row tasks (the same bits, each
/// K/V row read once per token instead of once per TaskRows tokens).
void SetMultiRowTasksForTesting(bool enabled);

}  // namespace loom::kernels::cpu::internal
