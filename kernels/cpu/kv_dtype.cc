#include "kernels/cpu/kv_dtype.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace loom::kernels::cpu {
namespace {

constexpr float kInt8Max = 127.0f;

std::array<float, 256> Fp8Table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const int exponent = (code >> 3) & 15, mantissa = code & 7;
    float magnitude;
    if (exponent == 15 && mantissa == 7) {
      magnitude = std::numeric_limits<float>::quiet_NaN();
    } else if (exponent == 0) {
      magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m x 2^-9
    } else {
      magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
    }
    table[code] = (code & 0x80) ? -magnitude : magnitude;
  }
  return table;
}

// x rounded to the nearest integer, ties to even, for |x| < 2^22: adding and subtracting
// 1.5 x 2^23 leaves the integer (the addition rounds in the FPU's default mode). No libm
// call, unlike std::nearbyint without SSE4.1.
inline float RoundToInt(float x) {
  constexpr float kMagic = 12582912.0f;
  return (x + kMagic) - kMagic;
}

}  // namespace

uint16_t KvRowScale(KvDtype dtype, float amax) {
  if (!(amax > 0.0f)) return 0;
  const float exact = amax / (dtype == KvDtype::kInt8 ? kInt8Max : kFp8E4m3Max);
  uint32_t bits;
  std::memcpy(&bits, &exact, sizeof(bits));
  if (!std::isfinite(exact)) return 0x7f7f;  // the largest finite BF16
  if ((bits & 0xffffu) != 0) bits += 0x10000u;
  return static_cast<uint16_t>(bits >> 16);
}

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kInt8:
      return "int8";
    case KvDtype::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "?";
}

std::optional<KvDtype> KvDtypeFromName(std::string_view name) {
  for (KvDtype dtype :
       {KvDtype::kF16, KvDtype::kBf16, KvDtype::kF32, KvDtype::kInt8, KvDtype::kFp8E4m3}) {
    if (name == KvDtypeName(dtype)) return dtype;
  }
  return std::nullopt;
}

float Fp8E4m3ToFloat(uint8_t code) {
  static const std::array<float, 256> table = Fp8Table();
  return table[code];
}

uint8_t FloatToFp8E4m3(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;   // NaN
  if (abs >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and infinity) saturates
  if (abs < 0x3c800000u) {  // below 2^-6: subnormal steps of 2^-9 (8 x 2^-9 is the smallest normal)
    float a;
    std::memcpy(&a, &abs, sizeof(a));
    return sign | static_cast<uint8_t>(RoundToInt(a * 512.0f));
  }
  // Round the 23-bit mantissa to 3 bits, to nearest even (a carry moves into the exponent),
  // then rebias the exponent from 127 to 7.
  const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t code = (rounded >> 20) - (120u << 3);
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

void RotateKvRow(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= norm;
}

void QuantizeKvRow(KvDtype dtype, const float* x, int64_t n, void* codes, uint16_t* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;  // NaN is skipped
  }
  *scale = KvRowScale(dtype, amax);
  const float s = Bf16ToFloat(*scale);
  const float inverse = s > 0.0f ? 1.0f / s : 0.0f;
  if (dtype == KvDtype::kInt8) {
    int8_t* out = static_cast<int8_t*>(codes);
    for (int64_t i = 0; i < n; ++i) {
      float q = x[i] * inverse;
      q = q > kInt8Max ? kInt8Max : q < -kInt8Max ? -kInt8Max : q == q ? q : 0.0f;
      out[i] = static_cast<int8_t>(RoundToInt(q));
    }
  } else {
    uint8_t* out = static_cast<uint8_t*>(codes);
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToFp8E4m3(x[i] * inverse);
  }
}

float DequantizeKv(KvDtype dtype, const void* codes, int64_t index, float scale) {
  if (dtype == KvDtype::kInt8) return static_cast<const int8_t*>(codes)[index] * scale;
  return Fp8E4m3ToFloat(static_cast<const uint8_t*>(codes)[index]) * scale;
}

}  // namespace loom::kernels::cpu
