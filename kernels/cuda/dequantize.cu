// GGUF block formats -> F32/F16 on the GPU. One thread per output element; the block
// header (scale, min) is re-read per element from L1, which is cheap next to the write.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/dequantize.h"

namespace loom::kernels {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kQuantBlock = 32;  // elements per Q8_0 / Q4_0 / Q4_1 block

__device__ inline float LoadHalf(const uint8_t* p) {
  const uint16_t bits = static_cast<uint16_t>(p[0]) | (static_cast<uint16_t>(p[1]) << 8);
  return __half2float(__ushort_as_half(bits));
}

// Nibble j of a 16-byte Q4 payload: elements 0..15 are the low nibbles, 16..31 the high.
__device__ inline int Nibble(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
}

template <common::GgmlType kType>
__device__ inline float DequantElement(const uint8_t* src, int64_t i) {
  if constexpr (kType == common::GgmlType::kF16) {
    return LoadHalf(src + 2 * i);
  } else {
    const int64_t block = i / kQuantBlock;
    const int j = static_cast<int>(i % kQuantBlock);
    if constexpr (kType == common::GgmlType::kQ8_0) {
      const uint8_t* b = src + block * 34;  // half d, int8 qs[32]
      return __fmul_rn(LoadHalf(b), static_cast<float>(static_cast<int8_t>(b[2 + j])));
    } else if constexpr (kType == common::GgmlType::kQ4_0) {
      const uint8_t* b = src + block * 18;  // half d, uint8 qs[16]
      return __fmul_rn(LoadHalf(b), static_cast<float>(Nibble(b + 2, j) - 8));
    } else {
      const uint8_t* b = src + block * 20;  // half d, half m, uint8 qs[16]
      // (d * q) + m rounded twice, as the reference does: no fused multiply-add.
      return __fadd_rn(__fmul_rn(LoadHalf(b), static_cast<float>(Nibble(b + 4, j))),
                       LoadHalf(b + 2));
    }
  }
}

template <common::GgmlType kType, typename Out>
__global__ void DequantizeKernel(const uint8_t* __restrict__ src, Out* __restrict__ dst,
                                 int64_t num_elements) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_elements;
       i += stride) {
    const float value = DequantElement<kType>(src, i);
    if constexpr (sizeof(Out) == 2) {
      dst[i] = __float2half_rn(value);
    } else {
      dst[i] = value;
    }
  }
}

template <common::GgmlType kType>
void Launch(const DequantizeParams& p, cudaStream_t stream) {
  const int64_t wanted = (p.num_elements + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int grid = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);
  const auto* src = static_cast<const uint8_t*>(p.src);
  if (p.dst_type == DequantOutputType::kF16) {
    DequantizeKernel<kType, __half><<<grid, kThreadsPerBlock, 0, stream>>>(
        src, static_cast<__half*>(p.dst), p.num_elements);
  } else {
    DequantizeKernel<kType, float><<<grid, kThreadsPerBlock, 0, stream>>>(
        src, static_cast<float*>(p.dst), p.num_elements);
  }
}

}  // namespace

absl::Status LaunchDequantize(const DequantizeParams& params, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(CheckDequantizeParams(params));
  switch (params.src_type) {
    case common::GgmlType::kF16: Launch<common::GgmlType::kF16>(params, stream); break;
    case common::GgmlType::kQ8_0: Launch<common::GgmlType::kQ8_0>(params, stream); break;
    case common::GgmlType::kQ4_0: Launch<common::GgmlType::kQ4_0>(params, stream); break;
    case common::GgmlType::kQ4_1: Launch<common::GgmlType::kQ4_1>(params, stream); break;
    default: return absl::InternalError("dequantize: dispatch out of sync with the check");
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return absl::InternalError(
        absl::StrFormat("dequantize: kernel launch failed: %s", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace loom::kernels
