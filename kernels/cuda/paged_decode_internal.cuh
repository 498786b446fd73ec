#pragma once

// Internal to kernels/cuda: what the two decode kernels (paged_attention.cu's, and
// paged_decode_mma.cu's on tensor cores) share: their arguments, the positions a block
// attends, the online softmax's exp and attention sink, and the epilogue that merges a
// block's warps.

#include <cmath>
#include <cstdint>

#include "kernels/cuda/kv_cache.h"
#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda::internal {

struct DecodeArgs {
  const void* q;
  void* out;
  void* out_low;  // out rounded to F16 (BF16 with out_low_bf16), or null
  bool out_low_bf16;
  const void* k_cache;
  const void* v_cache;
  const int32_t* context_len;
  const int32_t* block_indptr;
  const int32_t* block_indices;
  const uint16_t* k_scale;  // 8-bit caches: [slots, num_kv_heads] BF16 bits
  const uint16_t* v_scale;
  float* partial_acc;  // [num_seqs, num_heads, num_splits, head_dim]
  float* partial_max;  // [num_seqs, num_heads, num_splits]
  float* partial_sum;  // [num_seqs, num_heads, num_splits]
  int64_t q_stride;
  int num_heads;
  int num_kv_heads;
  int group;        // num_heads / num_kv_heads
  int head_chunks;  // ceil(group / kGroup)
  int block_size;
  int num_blocks;
  int partition;  // tokens per split (the last split runs to context_len)
  int window;     // > 0: attend to the last `window` positions only
  float scale;
  float softcap;  // > 0: scores become softcap * tanh(score / softcap)
  // [num_heads] attention sinks or null; this kernel adds them with one split only (the
  // reduction does with several).
  const float* sinks;
};

/// The positions block (split, ., seq) attends, [begin, end): the splits cut the attended
/// positions [first, context) (with a window the positions before it are never read: their
/// blocks may be freed), the last running to the context's end; in tiles of `tile` tokens.
struct DecodeSpan {
  int begin, end, num_tiles;
  int table_begin, table_len;  // the sequence's block-table entries
};

__device__ __forceinline__ DecodeSpan DecodeSpanOf(const DecodeArgs& args, int seq, int split,
                                                   int num_splits, int tile) {
  const int context = args.context_len[seq];
  const int first = args.window > 0 ? max(0, context - args.window) : 0;
  DecodeSpan span;
  span.begin = first + split * args.partition;
  span.end = split == num_splits - 1 ? context : min(context, span.begin + args.partition);
  span.num_tiles = span.end > span.begin ? (span.end - span.begin + tile - 1) / tile : 0;
  span.table_begin = args.block_indptr[seq];
  span.table_len = args.block_indptr[seq + 1] - span.table_begin;
  return span;
}

/// Tile rows to cache rows for the decode kernels: thread `row` < the tile resolves row `row`
/// of each of the span's tiles in turn, with one block-table load per row (not per 16-byte
/// copy); its position's block-table index and offset are worked out with one division and
/// then advanced by a tile's positions per tile.
class TileRowResolver {
 public:
  /// For the row at `position` of the first tile, with tiles of `tile` positions.
  __device__ __forceinline__ TileRowResolver(int position, int block_size, int tile)
      : index_(position / block_size),
        offset_(position - index_ * block_size),
        step_blocks_(tile / block_size),
        step_offset_(tile - step_blocks_ * block_size) {}

  /// This row's cache row in the next tile: kNoCacheRow past the span's end (`in_span` false)
  /// or where the table has no valid entry (which sets `bad`).
  __device__ __forceinline__ uint32_t Next(const DecodeArgs& args, const DecodeSpan& span,
                                           bool in_span, int kv_head, bool& bad) {
    uint32_t row = kNoCacheRow;
    if (in_span) {
      const int block =
          index_ < span.table_len ? args.block_indices[span.table_begin + index_] : -1;
      if (block >= 0 && block < args.num_blocks) {
        row = (static_cast<uint32_t>(block) * args.block_size + offset_) * args.num_kv_heads +
              kv_head;
      } else {
        bad = true;
      }
    }
    index_ += step_blocks_;
    offset_ += step_offset_;
    if (offset_ >= args.block_size) {
      offset_ -= args.block_size;
      ++index_;
    }
    return row;
  }

 private:
  int index_, offset_;
  int step_blocks_, step_offset_;
};

// exp(x - base) where base is -inf when nothing was attended yet (then 0, not NaN).
__device__ __forceinline__ float ExpFrom(float x, float max) {
  return expf(x - (max == -INFINITY ? 0.0f : max));
}

// Adds an attention sink to a finished softmax: `numerator` and `denominator` are
// relative to `max`; afterwards both are relative to max(max, sink) (so exp never
// overflows, a dominant sink just drives the output to 0) and the denominator holds
// exp(sink) too. Nothing attended (max -inf, sums 0) stays 0 / exp(0).
__device__ __forceinline__ void AddSink(float sink, float max, float& numerator,
                                        float& denominator) {
  const float new_max = fmaxf(max, sink);
  const float rescale = ExpFrom(max, new_max);
  numerator *= rescale;
  denominator = denominator * rescale + ExpFrom(sink, new_max);
}

/// Where a decode block's results go: with one split the normalized output (out, of the
/// query's type), with several the block's partial result in the workspace (acc
/// [seqs, heads, splits, head_dim], max and sum [seqs, heads, splits]).
struct DecodeOutput {
  void* out;
  float* partial_acc;
  float* partial_max;
  float* partial_sum;
  const float* sinks;  // [num_heads] or null
  int head_dim;
  int split;
  int num_splits;
  void* out_low;  // DecodeArgs' (with one split; the reduction writes it otherwise)
  bool out_low_bf16;
};

/// Element d of query head `head` (global; `row` = seq * num_heads + head) from the kWarps
/// warps' partial softmax results: warp w's max and sum at maxes[w * stride] and
/// sums[w * stride], its unnormalized output element at values[w * value_stride]. Merged,
/// then normalized with the head's sink (one split) or left unnormalized for the split
/// reduction; NaN for a bad block table, even when nothing was attended.
template <typename Q, int kWarps>
__device__ __forceinline__ void StoreDecodeElement(const float* maxes, const float* sums,
                                                   int stride, const float* values,
                                                   int value_stride, bool bad_table,
                                                   const DecodeOutput& o, int64_t row, int head,
                                                   int d) {
  float block_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, maxes[w * stride]);
  float total = 0.0f, sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float weight = ExpFrom(maxes[w * stride], block_max);
    total += values[w * value_stride] * weight;
    sum += sums[w * stride] * weight;
  }
  if (bad_table) total = NAN;
  if (o.num_splits == 1) {
    // Split contexts get the sink once, in the split reduction.
    if (o.sinks != nullptr) AddSink(o.sinks[head], block_max, total, sum);
    const float value = bad_table ? NAN : (sum != 0.0f ? total / sum : 0.0f);
    static_cast<Q*>(o.out)[row * o.head_dim + d] = FromFloat<Q>(value);
    if (o.out_low != nullptr) StoreLow(o.out_low, o.out_low_bf16, row * o.head_dim + d, value);
  } else {
    const int64_t partial = row * o.num_splits + o.split;
    o.partial_acc[partial * o.head_dim + d] = total;
    if (d == 0) {
      o.partial_max[partial] = block_max;
      o.partial_sum[partial] = bad_table ? NAN : sum;
    }
  }
}

}  // namespace loom::kernels::cuda::internal
