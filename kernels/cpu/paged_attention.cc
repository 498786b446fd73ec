#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/paged_attention_internal.h"

namespace loom::kernels::cpu {
namespace {

std::atomic<bool> attention_simd{true};
std::atomic<internal::TileMode> tile_mode{internal::TileMode::kAuto};
std::atomic<bool> multi_row_tasks{true};

// Chunks of attention work each thread may claim: tasks differ in length (sequences,
// causal rows), so several per thread balance them. A task's result does not depend on
// the thread that runs it.
constexpr int kChunksPerThread = 4;

absl::Status CheckCache(const KvLayerView& c) {
  if (c.k == nullptr || c.v == nullptr) return absl::InvalidArgumentError("KV cache: null k or v");
  if (c.num_blocks <= 0 || c.block_size <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV cache: num_blocks %d, block_size %d, num_kv_heads %d, head_dim %d must be positive",
        c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim));
  }
  if (IsQuantizedKv(c.dtype) && (c.k_scale == nullptr || c.v_scale == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV cache: %s needs k_scale and v_scale", KvDtypeName(c.dtype)));
  }
  if (c.head_dim > internal::kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrFormat("KV cache: head_dim %d exceeds %d",
                                                      c.head_dim, internal::kMaxHeadDim));
  }
  return absl::OkStatus();
}

absl::Status CheckAttentionParams(const PagedAttentionParams& p) {
  if (absl::Status status = CheckCache(p.cache); !status.ok()) return status;
  if (p.q == nullptr || p.out == nullptr || p.query_start == nullptr ||
      p.context_len == nullptr || p.block_indptr == nullptr || p.block_indices == nullptr) {
    return absl::InvalidArgumentError("PagedAttention: null pointer among q, out and the batch");
  }
  if (p.num_seqs <= 0 || p.num_heads <= 0 ||
      (p.group == 0 && p.num_heads % p.cache.num_kv_heads != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: num_seqs %d, num_heads %d must be positive, num_heads a multiple of "
        "num_kv_heads %d",
        p.num_seqs, p.num_heads, p.cache.num_kv_heads));
  }
  if (p.group != 0) {
    const int64_t first = p.head0 / p.group - p.kv_head0;
    const int64_t last = (p.head0 + p.num_heads - 1) / p.group - p.kv_head0;
    if (p.group < 0 || p.head0 < 0 || first < 0 || last >= p.cache.num_kv_heads) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "PagedAttention: query heads [%d, %d) with group %d read KV heads outside [%d, %d)",
          p.head0, p.head0 + p.num_heads, p.group, p.kv_head0,
          p.kv_head0 + p.cache.num_kv_heads));
    }
  }
  if (!std::isfinite(p.scale)) return absl::InvalidArgumentError("PagedAttention: scale not finite");
  if (!std::isfinite(p.softcap) || p.softcap < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedAttention: softcap %g must be >= 0 (0: none)", p.softcap));
  }
  if (p.window < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedAttention: window %d must be >= 0 (0: none)", p.window));
  }
  if (p.query_start[0] != 0 || p.block_indptr[0] != 0) {
    return absl::InvalidArgumentError("PagedAttention: query_start[0] and block_indptr[0] must be 0");
  }
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t q_len = p.query_start[s + 1] - p.query_start[s];
    const int64_t ctx = p.context_len[s];
    const int64_t num_blocks = p.block_indptr[s + 1] - p.block_indptr[s];
    if (q_len < 0 || num_blocks < 0 || ctx < q_len) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "PagedAttention: sequence %d has %d query tokens, context_len %d, %d blocks", s, q_len,
          ctx, num_blocks));
    }
    const int64_t needed = (ctx + p.cache.block_size - 1) / p.cache.block_size;
    if (num_blocks < needed) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "PagedAttention: sequence %d has %d blocks of %d slots for context_len %d", s,
          num_blocks, p.cache.block_size, ctx));
    }
    for (int64_t i = 0; i < needed; ++i) {
      const int32_t block = p.block_indices[p.block_indptr[s] + i];
      if (block < 0 || block >= p.cache.num_blocks) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "PagedAttention: sequence %d uses block %d outside the pool of %d", s, block,
            p.cache.num_blocks));
      }
    }
  }
  return absl::OkStatus();
}

// Reads element `index` of a K or V pool as float (`scales`: the pool's, 8-bit dtypes).
inline float LoadKv(const void* base, const uint16_t* scales, const KvLayerView& cache,
                    int64_t index) {
  switch (cache.dtype) {
    case KvDtype::kF16:
      return internal::HalfToFloat(static_cast<const uint16_t*>(base)[index]);
    case KvDtype::kBf16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[index]);
    case KvDtype::kF32:
      return static_cast<const float*>(base)[index];
    default:
      return DequantizeKv(cache.dtype, base, index, Bf16ToFloat(scales[index / cache.head_dim]));
  }
}
inline float LoadK(const KvLayerView& c, int64_t index) { return LoadKv(c.k, c.k_scale, c, index); }
inline float LoadV(const KvLayerView& c, int64_t index) { return LoadKv(c.v, c.v_scale, c, index); }

bool SimdEnabled() {
  static const bool avx512 = internal::IsaSupported(internal::MatmulIsaChoice::kAvx512);
  return avx512 && attention_simd.load(std::memory_order_relaxed);
}

void FloatToHalfScalar(const float* src, int64_t count, uint16_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = FloatToHalf(src[i]);
}

void FloatToBf16Scalar(const float* src, int64_t count, uint16_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = FloatToBf16(src[i]);
}

// RotateKvRow on `count` rows of n floats (AVX2 where the CPU has it: the same bits).
void RotateRows(float* rows, int64_t count, int64_t n) {
  static const bool avx2 = internal::IsaSupported(internal::MatmulIsaChoice::kAvx2);
  if (avx2 && n >= 8 && attention_simd.load(std::memory_order_relaxed)) {
    return internal::RotateRowsAvx2(rows, count, n);
  }
  for (int64_t r = 0; r < count; ++r) RotateKvRow(rows + r * n, n);
}

// An 8-bit cache that stores K and V rotated (RotatesKv): the step's queries rotated into
// that basis (params().q, per-thread scratch), and the outputs rotated back.
class KvRotation {
 public:
  explicit KvRotation(const PagedAttentionParams& p) : params_(p) {
    const int64_t d = p.cache.head_dim;
    if (!RotatesKv(p.cache.dtype, d)) return;
    rows_ = p.query_start[p.num_seqs] * p.num_heads;
    thread_local std::vector<float> q;
    q.assign(p.q, p.q + rows_ * d);
    RotateRows(q.data(), rows_, d);
    params_.q = q.data();
  }
  const PagedAttentionParams& params() const { return params_; }
  void RotateOutputBack() {
    const int64_t d = params_.cache.head_dim;
    RotateRows(params_.out, rows_, d);
  }

 private:
  PagedAttentionParams params_;
  int64_t rows_ = 0;  // 0: not rotated
};

// A run of consecutive local query heads that read one KV head: one task per token.
struct HeadRun {
  int64_t first_head;
  int64_t num_heads;
  int64_t kv_head;
};

// Cuts the query heads into runs that share a KV head, splitting each KV head's heads
// into as few near-equal runs of at most max_heads as it takes.
void CutHeadRuns(const PagedAttentionParams& p, int64_t max_heads, std::vector<HeadRun>& runs) {
  runs.clear();
  for (int64_t h = 0; h < p.num_heads;) {
    const int64_t kv_head = internal::KvHeadOf(p, h);
    int64_t end = h + 1;
    while (end < p.num_heads && internal::KvHeadOf(p, end) == kv_head) ++end;
    const int64_t pieces = (end - h + max_heads - 1) / max_heads;
    for (int64_t i = 0; i < pieces; ++i) {
      const int64_t first = h + (end - h) * i / pieces;
      const int64_t last = h + (end - h) * (i + 1) / pieces;
      runs.push_back({first, last - first, kv_head});
    }
    h = end;
  }
}

// The task of `num_rows` consecutive tokens of sequence `seq` from step token
// `first_token`, for the heads of `run`.
internal::AttentionTask TaskOf(const PagedAttentionParams& p, int64_t seq, int64_t first_token,
                               int64_t num_rows, const HeadRun& run) {
  const int64_t d = p.cache.head_dim;
  const int64_t q_len = p.query_start[seq + 1] - p.query_start[seq];
  internal::AttentionTask task;
  task.q = p.q + (first_token * p.num_heads + run.first_head) * d;
  task.out = p.out + (first_token * p.num_heads + run.first_head) * d;
  task.token_stride = p.num_heads * d;
  task.blocks = p.block_indices + p.block_indptr[seq];
  task.kv_head = run.kv_head;
  task.num_heads = run.num_heads;
  task.num_rows = num_rows;
  task.attend_len = p.context_len[seq] - q_len + (first_token - p.query_start[seq]) + 1;
  task.window = p.window;
  task.softcap = p.softcap;
  task.sinks = p.sinks == nullptr ? nullptr : p.sinks + run.first_head;
  return task;
}

}  // namespace

namespace internal {

void SetAttentionSimdForTesting(bool enabled) { attention_simd.store(enabled); }
void SetTileModeForTesting(TileMode mode) { tile_mode.store(mode); }
void SetMultiRowTasksForTesting(bool enabled) { multi_row_tasks.store(enabled); }

void AttendScalar(const KvLayerView& cache, float scale, const AttentionTask& task) {
  const int64_t d = cache.head_dim, bs = cache.block_size;
  for (int64_t h = 0; h < task.num_heads; ++h) {
    const float* q = task.q + h * d;
    float acc[kMaxHeadDim];
    std::fill(acc, acc + d, 0.0f);
    float running_max = -std::numeric_limits<float>::infinity();
    float denominator = 0.0f;
    constexpr int64_t kChunk = 32;
    float scores[kChunk];
    for (int64_t pos = LowerLimit(task, 0); pos < task.attend_len;) {
      const int64_t block = task.blocks[pos / bs];
      const int64_t count = std::min({kChunk, bs - pos % bs, task.attend_len - pos});
      const int64_t slot0 = block * bs + pos % bs;
      float chunk_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < count; ++j) {
        const int64_t base = ((slot0 + j) * cache.num_kv_heads + task.kv_head) * d;
        float dot = 0.0f;
        for (int64_t i = 0; i < d; ++i) dot += q[i] * LoadK(cache, base + i);
        scores[j] = dot * scale;
        if (task.softcap > 0.0f) scores[j] = task.softcap * std::tanh(scores[j] / task.softcap);
        chunk_max = std::max(chunk_max, scores[j]);
      }
      const float new_max = std::max(running_max, chunk_max);
      const float correction = std::exp(running_max - new_max);  // 0 on the first chunk
      denominator *= correction;
      for (int64_t i = 0; i < d; ++i) acc[i] *= correction;
      for (int64_t j = 0; j < count; ++j) {
        const float weight = std::exp(scores[j] - new_max);
        denominator += weight;
        const int64_t base = ((slot0 + j) * cache.num_kv_heads + task.kv_head) * d;
        for (int64_t i = 0; i < d; ++i) acc[i] += weight * LoadV(cache, base + i);
      }
      running_max = new_max;
      pos += count;
    }
    const float inverse = 1.0f / WithSink(task, h, denominator, running_max);
    for (int64_t i = 0; i < d; ++i) task.out[h * d + i] = acc[i] * inverse;
  }
}

}  // namespace internal

absl::Status WriteKv(const KvLayerView& cache, const float* k, const float* v,
                     const int32_t* slots, int64_t num_tokens) {
  if (absl::Status status = CheckCache(cache); !status.ok()) return status;
  if (num_tokens < 0 || (num_tokens > 0 && (k == nullptr || v == nullptr || slots == nullptr))) {
    return absl::InvalidArgumentError("WriteKv: null k, v or slots, or negative num_tokens");
  }
  const int64_t num_slots = cache.num_blocks * cache.block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0 || slots[t] >= num_slots) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "WriteKv: token %d has slot %d outside the pool of %d slots", t, slots[t], num_slots));
    }
  }
  // A pool whose values are its keys (multi-head latent attention) is written once.
  const bool shared = cache.v == cache.k;
  if (shared && v != k) {
    return absl::InvalidArgumentError("WriteKv: a pool whose values are its keys takes v = k");
  }
  const int64_t row = cache.num_kv_heads * cache.head_dim;
  static const bool avx2 = internal::IsaSupported(internal::MatmulIsaChoice::kAvx2);
  const bool simd = attention_simd.load(std::memory_order_relaxed);
  const auto to_16bit = cache.dtype == KvDtype::kBf16
                            ? (avx2 && simd ? internal::FloatToBf16Avx2 : FloatToBf16Scalar)
                        : SimdEnabled() ? internal::FloatToHalfAvx512
                        : avx2 && simd  ? internal::FloatToHalfAvx2
                                        : FloatToHalfScalar;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t offset = static_cast<int64_t>(slots[t]) * row;
    if (IsQuantizedKv(cache.dtype)) {
      const int64_t d = cache.head_dim;
      const bool rotate = RotatesKv(cache.dtype, d);
      const auto quantize =
          avx2 && d % 8 == 0 && simd ? internal::QuantizeKvRowAvx2 : QuantizeKvRow;
      float rotated[internal::kMaxHeadDim];
      for (int64_t h = 0; h < cache.num_kv_heads; ++h) {
        const int64_t head = static_cast<int64_t>(slots[t]) * cache.num_kv_heads + h;
        const std::tuple<const float*, void*, uint16_t*> pools[] = {
            {k + t * row + h * d, cache.k, cache.k_scale},
            {v + t * row + h * d, cache.v, cache.v_scale}};
        for (const auto& [src, codes, scale] : absl::MakeConstSpan(pools, shared ? 1 : 2)) {
          const float* x = src;
          if (rotate) {
            std::copy(src, src + d, rotated);
            RotateRows(rotated, 1, d);
            x = rotated;
          }
          quantize(cache.dtype, x, d, static_cast<uint8_t*>(codes) + offset + h * d, scale + head);
        }
      }
    } else if (cache.dtype == KvDtype::kF32) {
      std::copy(k + t * row, k + (t + 1) * row, static_cast<float*>(cache.k) + offset);
      if (!shared) std::copy(v + t * row, v + (t + 1) * row, static_cast<float*>(cache.v) + offset);
    } else {
      to_16bit(k + t * row, row, static_cast<uint16_t*>(cache.k) + offset);
      if (!shared) to_16bit(v + t * row, row, static_cast<uint16_t*>(cache.v) + offset);
    }
  }
  return absl::OkStatus();
}

namespace internal {

namespace {
std::atomic<bool> amx_bf16_attention{true};
}  // namespace

void SetAmxBf16AttentionForTesting(bool enabled) {
  amx_bf16_attention.store(enabled, std::memory_order_relaxed);
}

bool RunsAmxBf16Tiles(const PagedAttentionParams& p) {
  return p.activations == ActivationPrecision::kBf16 &&
         amx_bf16_attention.load(std::memory_order_relaxed) && p.softcap <= 0.0f &&
         (p.cache.dtype == KvDtype::kF16 || p.cache.dtype == KvDtype::kBf16 ||
          p.cache.dtype == KvDtype::kF32) &&
         p.cache.head_dim % 16 == 0 && p.cache.v != p.cache.k;
}

}  // namespace internal

absl::Status PagedAttention(const PagedAttentionParams& params, ThreadPool& pool) {
  if (absl::Status status = CheckAttentionParams(params); !status.ok()) return status;
  if (absl::Status status = ActivationPrecisionStatus(params.activations); !status.ok()) {
    return status;
  }
  const int64_t num_tokens = params.query_start[params.num_seqs];
  if (num_tokens == 0) return absl::OkStatus();
  KvRotation rotation(params);
  const PagedAttentionParams& p = rotation.params();
  static const bool avx2 = internal::IsaSupported(internal::MatmulIsaChoice::kAvx2);
  const bool simd = attention_simd.load(std::memory_order_relaxed);
  // Soft-capped scores (Gemma 2) have the scalar kernel only.
  const bool softcap = p.softcap > 0.0f;
  const auto attend = softcap         ? internal::AttendScalar
                      : SimdEnabled() ? internal::AttendAvx512
                      : avx2 && simd  ? internal::AttendAvx2
                                      : internal::AttendScalar;
  const int64_t d = p.cache.head_dim;
  // Where tiles are on (TileMode) and the ISA has a tile kernel for this head dim, every
  // sequence runs as FlashAttention-style tiles (a decode token is a one-row tile);
  // elsewhere as per-token tasks. A token's result does not depend on how its sequence is cut into tiles
  // (paged_attention_tiled.h), so it is the same bits whatever the batch, the prefill
  // chunk split, the prefix-cache hit or the speculative step it is computed in.
  void (*attend_tile)(const KvLayerView&, float, const internal::AttentionTask&) = nullptr;
  const internal::TileMode mode = tile_mode.load(std::memory_order_relaxed);
  if (internal::RunsAmxBf16Tiles(p)) {
    attend_tile = internal::AttendTileAmxBf16;
  } else if (softcap) {
    // per-token tasks only
  } else if (mode == internal::TileMode::kOn && SimdEnabled() && d % 16 == 0) {
    attend_tile = internal::AttendTileAvx512;
  } else if (mode != internal::TileMode::kOff && avx2 && simd && !SimdEnabled() && d % 8 == 0) {
    attend_tile = internal::AttendTileAvx2;
  }
  const auto tiled = [&](int64_t s) {
    return attend_tile != nullptr && p.query_start[s + 1] > p.query_start[s];
  };

  // Tiles: (sequence, run of query heads on one KV head, TileRows consecutive tokens).
  struct Tile {
    int32_t seq;
    int32_t first_token;  // within the step
    int32_t num_rows;
    int32_t run;
  };
  thread_local std::vector<HeadRun> tile_runs;
  thread_local std::vector<Tile> tiles;
  tiles.clear();
  if (attend_tile != nullptr) {
    // Runs of heads are not split for parallelism as the per-token tasks' are: a tile's
    // score work does not shrink with fewer heads (they share its vectors' lanes).
    CutHeadRuns(p, internal::MaxTaskHeads(d), tile_runs);
    for (int64_t s = 0; s < p.num_seqs; ++s) {
      if (!tiled(s)) continue;
      for (size_t r = 0; r < tile_runs.size(); ++r) {
        const int64_t rows = internal::TileRows(tile_runs[r].num_heads);
        for (int64_t t = p.query_start[s]; t < p.query_start[s + 1]; t += rows) {
          tiles.push_back({static_cast<int32_t>(s), static_cast<int32_t>(t),
                           static_cast<int32_t>(std::min<int64_t>(rows, p.query_start[s + 1] - t)),
                           static_cast<int32_t>(r)});
        }
      }
    }
  }

  // Per-token tasks for the other sequences' tokens: runs of up to task_rows consecutive
  // tokens of a sequence (AVX-512; one token elsewhere), each K/V row read once for them.
  const bool multi_row =
      attend == internal::AttendAvx512 && multi_row_tasks.load(std::memory_order_relaxed);
  struct RowBlock {
    int32_t seq;
    int32_t first_token;  // within the step
    int32_t num_rows;
  };
  thread_local std::vector<RowBlock> row_blocks;
  row_blocks.clear();
  int64_t num_task_tokens = 0;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    if (!tiled(s)) num_task_tokens += p.query_start[s + 1] - p.query_start[s];
  }
  if (num_task_tokens > 0) {
    // Each task takes all the query heads of its tokens that share a KV head, so a K/V row
    // is read once for the group. With too few tokens to keep the threads busy (small-batch
    // decode), the runs are halved until there are two tasks per thread.
    thread_local std::vector<HeadRun> runs;
    int64_t max_heads = internal::MaxTaskHeads(d);
    CutHeadRuns(p, max_heads, runs);
    while (max_heads > 1 &&
           num_task_tokens * static_cast<int64_t>(runs.size()) < 2 * pool.num_threads()) {
      max_heads = (max_heads + 1) / 2;
      CutHeadRuns(p, max_heads, runs);
    }
    const int64_t task_rows = multi_row ? internal::TaskRows(max_heads, d) : 1;
    for (int64_t s = 0; s < p.num_seqs; ++s) {
      if (tiled(s)) continue;
      for (int64_t t = p.query_start[s]; t < p.query_start[s + 1]; t += task_rows) {
        row_blocks.push_back({static_cast<int32_t>(s), static_cast<int32_t>(t),
                              static_cast<int32_t>(std::min<int64_t>(task_rows, p.query_start[s + 1] - t))});
      }
    }
    const HeadRun* run_of = runs.data();
    const RowBlock* block_of = row_blocks.data();
    const int64_t num_runs = static_cast<int64_t>(runs.size());
    const int64_t num_items = static_cast<int64_t>(row_blocks.size()) * num_runs;
    // Items (row block, run) are dealt zigzag (first, last, second, second to last, ...) so
    // that contiguous chunks mix early causal tokens (short) with late ones (long); several
    // chunks per thread even out sequences of different lengths.
    pool.ParallelFor(
        num_items, 2,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const int64_t item = i % 2 == 0 ? i / 2 : num_items - 1 - i / 2;
            const RowBlock& rb = block_of[item / num_runs];
            const internal::AttentionTask task =
                TaskOf(p, rb.seq, rb.first_token, rb.num_rows, run_of[item % num_runs]);
            attend(p.cache, p.scale, task);
          }
        },
        kChunksPerThread);
  }
  if (!tiles.empty()) {
    // Zigzag too: a sequence's first tiles attend to few positions, its last to all.
    const Tile* tile_of = tiles.data();
    const HeadRun* run_of = tile_runs.data();
    const int64_t num_items = static_cast<int64_t>(tiles.size());
    const bool amx = attend_tile == internal::AttendTileAmxBf16;
    pool.ParallelFor(
        num_items, 1,
        [&](int64_t begin, int64_t end) {
          if (amx) internal::BeginAmxBf16Tiles();
          for (int64_t i = begin; i < end; ++i) {
            const Tile& item = tile_of[i % 2 == 0 ? i / 2 : num_items - 1 - i / 2];
            const internal::AttentionTask tile =
                TaskOf(p, item.seq, item.first_token, item.num_rows, run_of[item.run]);
            attend_tile(p.cache, p.scale, tile);
          }
          if (amx) internal::EndAmxBf16Tiles();
        },
        kChunksPerThread);
  }
  rotation.RotateOutputBack();
  return absl::OkStatus();
}

absl::Status PagedAttentionReference(const PagedAttentionParams& params) {
  if (absl::Status status = CheckAttentionParams(params); !status.ok()) return status;
  KvRotation rotation(params);
  const PagedAttentionParams& p = rotation.params();
  const KvLayerView& c = p.cache;
  const int64_t d = c.head_dim;
  // The AMX-BF16 tiles' inputs: q, K, V and the weights rounded to BF16 (below).
  const bool bf16 = internal::RunsAmxBf16Tiles(p);
  const auto round = [bf16](double x) -> double {
    return bf16 ? RoundToBf16(static_cast<float>(x)) : x;
  };
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t q_len = p.query_start[s + 1] - p.query_start[s];
    const int32_t* blocks = p.block_indices + p.block_indptr[s];
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t t = p.query_start[s] + j;
      const int64_t len = p.context_len[s] - q_len + j + 1;
      const int64_t first = p.window > 0 && len > p.window ? len - p.window : 0;
      for (int64_t h = 0; h < p.num_heads; ++h) {
        const float* q = p.q + (t * p.num_heads + h) * d;
        // Gather this head's K and V rows in position order.
        std::vector<int64_t> bases(len);
        for (int64_t pos = 0; pos < len; ++pos) {
          const int64_t slot = static_cast<int64_t>(blocks[pos / c.block_size]) * c.block_size +
                               pos % c.block_size;
          bases[pos] = (slot * c.num_kv_heads + internal::KvHeadOf(p, h)) * d;
        }
        std::vector<double> scores(len);
        double max_score = -std::numeric_limits<double>::infinity();
        // Positions before the window's first get score -inf: weight 0.
        for (int64_t pos = 0; pos < first; ++pos) scores[pos] = max_score;
        for (int64_t pos = first; pos < len; ++pos) {
          double dot = 0.0;
          for (int64_t i = 0; i < d; ++i) dot += round(q[i]) * round(LoadK(c, bases[pos] + i));
          scores[pos] = dot * p.scale;
          if (p.softcap > 0.0f) scores[pos] = p.softcap * std::tanh(scores[pos] / p.softcap);
          max_score = std::max(max_score, scores[pos]);
        }
        // The weights exp(s - max). The AMX-BF16 tiles round exp(s - m) instead, m the running
        // max of the kAmxKvTile-position tiles seen so far, and scale by exp(m - max) later.
        std::vector<double> weights(len, 0.0);
        double running = -std::numeric_limits<double>::infinity();
        for (int64_t t0 = first / internal::kAmxKvTile * internal::kAmxKvTile; t0 < len;
             t0 += internal::kAmxKvTile) {
          const int64_t t1 = std::min(len, t0 + internal::kAmxKvTile);
          for (int64_t pos = std::max(t0, first); pos < t1; ++pos)
            running = std::max(running, scores[pos]);
          for (int64_t pos = std::max(t0, first); pos < t1; ++pos) {
            weights[pos] =
                bf16 ? round(std::exp(scores[pos] - running)) * std::exp(running - max_score)
                     : std::exp(scores[pos] - max_score);
          }
        }
        double total = p.sinks == nullptr ? 0.0 : std::exp(p.sinks[h] - max_score);
        for (int64_t pos = first; pos < len; ++pos) total += std::exp(scores[pos] - max_score);
        for (int64_t i = 0; i < d; ++i) {
          double value = 0.0;
          for (int64_t pos = first; pos < len; ++pos)
            value += weights[pos] * round(LoadV(c, bases[pos] + i));
          p.out[(t * p.num_heads + h) * d + i] = static_cast<float>(value / total);
        }
      }
    }
  }
  rotation.RotateOutputBack();
  return absl::OkStatus();
}

}  // namespace loom::kernels::cpu
