#pragma once

#include <cstdint>
#include <string_view>

namespace loom::kernels::cuda {

/// Element type of a device tensor the CUDA kernels read or write.
enum class DataType { kF32, kF16, kBF16 };

/// Bytes per element: 4 or 2.
int64_t ElementBytes(DataType type);

/// "F32", "F16" or "BF16", for messages.
std::string_view DataTypeName(DataType type);

/// IEEE binary32 -> bfloat16, round to nearest even (as CUDA's __float2bfloat16); NaN stays NaN.
uint16_t FloatToBf16(float value);

/// bfloat16 -> binary32 (exact).
float Bf16ToFloat(uint16_t value);

/// Host-side conversion of `count` floats into `type` (F16/BF16 rounded to nearest even);
/// dst holds count * ElementBytes(type) bytes. For uploads and test references.
void ConvertFromFloat(DataType type, const float* src, int64_t count, void* dst);

/// Host-side conversion of `count` elements of `type` to float (exact).
void ConvertToFloat(DataType type, const void* src, int64_t count, float* dst);

}  // namespace loom::kernels::cuda
