#pragma once

// Internal to kernels/cuda (.cu files only): the rotary embedding's arithmetic, shared by
// LaunchRope and LaunchRopeWriteKv so that both rotate with the same float operations.

#include <cstdint>

namespace loom::kernels::cuda::internal {

/// One token's cosines and sines into shared memory (cosines [0, half), sines [half, 2 half)):
/// the float angle position * inv_freq[i], sincosf, times attention_factor. Every thread of the
/// block takes part; the caller synchronizes before reading.
__device__ __forceinline__ void FillRopeTable(float position, const float* __restrict__ inv_freq,
                                              int half, float attention_factor, float* table) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float sine, cosine;
    sincosf(position * inv_freq[i], &sine, &cosine);
    table[half + i] = sine * attention_factor;
    table[i] = cosine * attention_factor;
  }
}

/// The rotated pair (x0 cos - x1 sin, x0 sin + x1 cos).
__device__ __forceinline__ float2 RotatePair(float x0, float x1, float cosine, float sine) {
  return make_float2(x0 * cosine - x1 * sine, x0 * sine + x1 * cosine);
}

/// Element d (< rope_dim) of a head's pairs: its partner's offset, its pair's index and whether
/// it is the pair's first element. Pairs (2i, 2i + 1), or with neox (i, i + rope_dim / 2).
struct RopePairOf {
  int first, second, pair;
  __device__ __forceinline__ RopePairOf(int d, int half, bool neox) {
    pair = neox ? (d < half ? d : d - half) : d / 2;
    first = neox ? pair : 2 * pair;
    second = neox ? pair + half : 2 * pair + 1;
  }
};

}  // namespace loom::kernels::cuda::internal
