#pragma once

// Internal to kernels/cuda: what the decode kernels' online softmax shares
// (paged_attention.cu, paged_decode_mma.cu): its exp, the attention sink, and the epilogue
// that merges a block's warps.

#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda::internal {

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
    static_cast<Q*>(o.out)[row * o.head_dim + d] =
        FromFloat<Q>(bad_table ? NAN : (sum != 0.0f ? total / sum : 0.0f));
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
