#pragma once

// Internal to kernels/cuda (.cu files only): element access for F32/F16/BF16, warp
// reductions and the launch check every launch function ends with.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/types.h"

namespace loom::kernels::cuda::internal {

template <typename T>
__device__ __forceinline__ float ToFloat(T value);
template <>
__device__ __forceinline__ float ToFloat<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half value) {
  return __half2float(value);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float value);
template <>
__device__ __forceinline__ float FromFloat<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float value) {
  return __float2half_rn(value);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}

/// out[i] = value rounded to F16 (or, with bf16, BF16): a kernel's second output in the type
/// a following GEMM reads (the caller checked the type is one of the two).
__device__ __forceinline__ void StoreLow(void* out, bool bf16, int64_t i, float value) {
  if (bf16) {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(value);
  } else {
    static_cast<__half*>(out)[i] = __float2half_rn(value);
  }
}

/// Rounds through T and back: the value a tensor of T would hold.
template <typename T>
__device__ __forceinline__ float RoundThrough(float value) {
  return ToFloat<T>(FromFloat<T>(value));
}

__device__ __forceinline__ float WarpSum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ float WarpMax(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

/// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
/// `scratch` holds 32 floats of shared memory; contains a __syncthreads.
__device__ __forceinline__ float BlockSum(float value, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = WarpSum(value);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  const int num_warps = blockDim.x / 32;
  float total = 0.0f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];
  return total;
}

/// Calls `body.template operator()<T>()` with T the CUDA type of `type`.
template <typename Body>
void DispatchDataType(DataType type, Body&& body) {
  switch (type) {
    case DataType::kF32:
      body.template operator()<float>();
      break;
    case DataType::kF16:
      body.template operator()<__half>();
      break;
    case DataType::kBF16:
      body.template operator()<__nv_bfloat16>();
      break;
  }
}

/// The launch's error (bad configuration, no device, ...) as Internal naming `kernel`.
inline absl::Status CheckLaunch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrFormat("%s: kernel launch failed: %s", kernel, cudaGetErrorString(error)));
}

/// Lets `kKernel` use `bytes` of dynamic shared memory (above 48 KiB a kernel must opt
/// in). The attribute is per device: set once per (kernel, device), so a process that
/// drives several devices (tests, a TP group in one process) opts in on each. Internal
/// naming `name` when the device refuses.
template <auto kKernel>
absl::Status OptInSharedMemory(int bytes, const char* name) {
  static std::atomic<uint64_t> opted_devices{0};  // bit d: done on device d (d < 64)
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (error == cudaSuccess && (bit == 0 || (opted_devices.load() & bit) == 0)) {
    error = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (error == cudaSuccess) opted_devices.fetch_or(bit);
  }
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrFormat("%s: %d bytes of shared memory: %s", name, bytes,
                                             cudaGetErrorString(error)));
}

__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

/// 16 bytes global -> shared, asynchronously (PTX cp.async, bypassing L1), to a shared-space
/// address (SharedAddress) or a generic pointer into shared memory. With src_bytes 0 nothing is
/// read and the 16 bytes are zero-filled. Both addresses 16-byte aligned.
__device__ __forceinline__ void CopyAsync16(uint32_t shared, const void* global, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CopyAsync16(void* shared, const void* global, int src_bytes) {
  CopyAsync16(SharedAddress(shared), global, src_bytes);
}

/// Closes this thread's group of cp.async copies (CopyAsyncWait counts groups).
__device__ __forceinline__ void CopyAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CopyAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// Blocks of `threads` covering `work` items, capped for grid-stride loops.
inline int GridFor(int64_t work, int threads) {
  const int64_t wanted = (work + threads - 1) / threads;
  return static_cast<int>(wanted < 65535 * 16 ? (wanted > 0 ? wanted : 1) : 65535 * 16);
}

}  // namespace loom::kernels::cuda::internal
