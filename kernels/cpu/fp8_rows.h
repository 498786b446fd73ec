#pragma once

#include <cstdint>

#include "kernels/cpu/kv_dtype.h"  // kFp8E4m3Max, FloatToFp8E4m3

namespace loom::kernels::cpu {

/// Rows of `values` [rows, cols] as FP8 E4M3FN codes with one F32 scale per row (code x scale
/// approximates the value), into codes [rows, cols] and scales [rows]. Each row's scale is
/// `row_scales[r]` where given: an FP8 checkpoint's own scale of the row, whose values are its
/// codes times that scale rounded to a wider format (F16 as Loom dequantizes them), so every
/// code comes back exactly (a value within F16's relative rounding of code x scale divides back
/// to within 2^-10 of the code, far inside E4M3's half spacing; only values F16 holds as
/// subnormals, below 2^-14, keep just F16's absolute precision, 2^-24, so the smallest codes of
/// scales under about 2^-15 can move). Else the row's largest
/// magnitude over 448 (1 for a row of zeros or with a non-finite maximum). Codes round to
/// nearest even and saturate at +-448 (FloatToFp8E4m3).
void QuantizeRowsToFp8(const float* values, int64_t rows, int64_t cols, const float* row_scales,
                       uint8_t* codes, float* scales);

}  // namespace loom::kernels::cpu
