#pragma once

// Internal to kernels/cuda (.cu files only): the 8-bit KV types on the device, each step
// as kernels/cpu/kv_dtype.cc computes it (the write kernel's codes and scales equal
// cpu::QuantizeKvRow's for the same F32 rows). Code types: int8_t for int8, uint8_t for
// fp8 E4M3FN.

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

namespace loom::kernels::cuda::internal {

template <typename Code>
inline constexpr bool kIsKvCode = std::is_same_v<Code, int8_t> || std::is_same_v<Code, uint8_t>;

// The largest code magnitude: max|x| / kQMax is the row's scale.
template <typename Code>
inline constexpr float kKvCodeMax = std::is_same_v<Code, int8_t> ? 127.0f : 448.0f;

// E4M3 codes decode through F16 bits (sign, then the 7 exponent and mantissa bits moved
// into the F16 layout): exact, but 2^-8 of the code's value; this factor folds into the
// row's scale (cpu::KvDecodeFactor).
template <typename Code>
inline constexpr float kKvDecodeFactor = std::is_same_v<Code, uint8_t> ? 256.0f : 1.0f;

__device__ __forceinline__ float Bf16BitsToFloat(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// One code as a float, times 1 / kKvDecodeFactor for fp8. E4M3's NaN codes (0x7f, 0xff:
// what the write kernel stores for a NaN element) decode to NaN, as the CPU table does;
// shifted into F16 they would read as a finite 1.875 * 2^-8.
template <typename Code>
__device__ __forceinline__ float DecodeKvCode(uint32_t byte) {
  if constexpr (std::is_same_v<Code, int8_t>) {
    return static_cast<float>(static_cast<int8_t>(byte & 0xffu));
  } else {
    const bool nan = (byte & 0x7fu) == 0x7fu;
    const unsigned short half_bits = static_cast<unsigned short>(
        nan ? 0x7e00u : ((byte & 0x80u) << 8) | ((byte & 0x7fu) << 7));
    return __half2float(__ushort_as_half(half_bits));
  }
}

// Eight consecutive codes (8 bytes, the first in the low byte of raw.x), decoded.
template <typename Code>
__device__ __forceinline__ void DecodeCodes8(const uint2& raw, float (&values)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    values[i] = DecodeKvCode<Code>(raw.x >> (8 * i));
    values[4 + i] = DecodeKvCode<Code>(raw.y >> (8 * i));
  }
}

// Eight consecutive codes from an 8-byte aligned global address, decoded.
template <typename Code>
__device__ __forceinline__ void LoadCodes8(const Code* address, float (&values)[8]) {
  DecodeCodes8<Code>(__ldg(reinterpret_cast<const uint2*>(address)), values);
}

// x = H x over a row of 32 * E elements spread over a warp, lane l holding elements
// [l E, l E + E): the stages of cpu::RotateKvRow (distances 1, 2, 4, ... in order; the
// lower element of a pair becomes a + b, the upper a - b), without its final
// normalization. Every lane of the warp takes part.
template <int E>
__device__ __forceinline__ void WarpHadamard(float (&x)[E], int lane) {
#pragma unroll
  for (int h = 1; h < E; h *= 2) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      if ((i & h) == 0) {
        const float a = x[i], b = x[i + h];
        x[i] = a + b;
        x[i + h] = a - b;
      }
    }
  }
  // Element distance h * E: the pair's other element sits in lane l ^ h, same index.
#pragma unroll
  for (int h = 1; h < 32; h *= 2) {
    const bool upper = (lane & h) != 0;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const float other = __shfl_xor_sync(0xffffffffu, x[i], h);
      x[i] = upper ? other - x[i] : x[i] + other;
    }
  }
}

// cpu::KvRowScale: amax / qmax rounded up to BF16 bits (0 for amax 0 or NaN; the largest
// finite BF16 when the quotient overflows).
__device__ __forceinline__ uint16_t KvRowScaleBits(float amax, float qmax) {
  if (!(amax > 0.0f)) return 0;
  const float exact = amax / qmax;
  if (!isfinite(exact)) return 0x7f7f;
  uint32_t bits = __float_as_uint(exact);
  if ((bits & 0xffffu) != 0) bits += 0x10000u;
  return static_cast<uint16_t>(bits >> 16);
}

// cpu::FloatToFp8E4m3: round to nearest even, saturating at +-448, NaN to 0x7f.
__device__ __forceinline__ uint8_t FloatToFp8E4m3Bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;
  if (abs >= 0x43e00000u) return sign | 0x7e;
  if (abs < 0x3c800000u) {
    return sign | static_cast<uint8_t>(rintf(__uint_as_float(abs) * 512.0f));
  }
  const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t code = (rounded >> 20) - (120u << 3);
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

// cpu::QuantizeKvRow's code of x given the row's 1 / scale (0 for a zero scale).
template <typename Code>
__device__ __forceinline__ uint8_t QuantizeKvCode(float x, float inverse) {
  float q = x * inverse;
  if constexpr (std::is_same_v<Code, int8_t>) {
    q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q == q ? q : 0.0f;
    return static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(q)));
  } else {
    return FloatToFp8E4m3Bits(q);
  }
}

}  // namespace loom::kernels::cuda::internal
