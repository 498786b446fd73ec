#include "kernels/cpu/fp8_rows.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/kv_dtype.h"

namespace loom::kernels::cpu {

void QuantizeRowsToFp8(const float* values, int64_t rows, int64_t cols, const float* row_scales,
                       uint8_t* codes, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = values + r * cols;
    float scale = 1.0f;
    if (row_scales != nullptr) {
      scale = row_scales[r];
    } else {
      float amax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::abs(in[c]));
      // The row's largest magnitude lands on E4M3's largest.
      if (amax > 0.0f && std::isfinite(amax)) scale = amax / kFp8E4m3Max;
    }
    scales[r] = scale;
    uint8_t* out = codes + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = FloatToFp8E4m3(in[c] / scale);
  }
}

}  // namespace loom::kernels::cpu
