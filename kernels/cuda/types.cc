#include "kernels/cuda/types.h"

#include <cstring>

#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cuda {

int64_t ElementBytes(DataType type) { return type == DataType::kF32 ? 4 : 2; }

std::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kF32:
      return "F32";
    case DataType::kF16:
      return "F16";
    case DataType::kBF16:
      return "BF16";
  }
  return "unknown";
}

uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float Bf16ToFloat(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

void ConvertFromFloat(DataType type, const float* src, int64_t count, void* dst) {
  if (type == DataType::kF32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < count; ++i) {
    out[i] = type == DataType::kF16 ? cpu::FloatToHalf(src[i]) : FloatToBf16(src[i]);
  }
}

void ConvertToFloat(DataType type, const void* src, int64_t count, float* dst) {
  if (type == DataType::kF32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  const auto* in = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = type == DataType::kF16 ? cpu::internal::HalfToFloat(in[i]) : Bf16ToFloat(in[i]);
  }
}

}  // namespace loom::kernels::cuda
