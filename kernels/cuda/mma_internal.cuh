#pragma once

// Internal to kernels/cuda: the tensor-core building blocks the attention kernels share
// (prefill_attention.cu, paged_decode_mma.cu): ldmatrix loads and mma.sync m16n8k16 with F32
// accumulation, in the fragment layouts prefill_attention.cu's header comment spells out.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/launch_internal.cuh"

namespace loom::kernels::cuda::internal {

// The attention kernels' softmax runs in base 2: log2(e) folds into the scores' scale.
inline constexpr float kLog2E = 1.4426950408889634f;

// ldmatrix from a shared-space address (SharedAddress), or from a generic pointer into shared
// memory.
__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address)
               : "memory");
}

__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], const void* shared) {
  LoadMatrixX4(r, SharedAddress(shared));
}

__device__ __forceinline__ void LoadMatrixX4Trans(uint32_t (&r)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address)
               : "memory");
}

__device__ __forceinline__ void LoadMatrixX4Trans(uint32_t (&r)[4], const void* shared) {
  LoadMatrixX4Trans(r, SharedAddress(shared));
}

// d += a * b for one m16n8k16 tile, F32 accumulation.
template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as a b32 pair of T: `low` in the low 16 bits (the lower-indexed element).
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float low, float high) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 pair = __floats2half2_rn(low, high);
    memcpy(&bits, &pair, sizeof(bits));
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    memcpy(&bits, &pair, sizeof(bits));
  }
  return bits;
}

}  // namespace loom::kernels::cuda::internal
