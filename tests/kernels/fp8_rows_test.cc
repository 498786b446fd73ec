#include "kernels/cpu/fp8_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/formats/ggml_type.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/kv_dtype.h"

namespace loom::kernels::cpu {
namespace {

// An FP8 checkpoint's values as Loom holds them (each code times its row's scale, rounded once
// to F16) give back every code with the checkpoint's scales: all 254 finite codes at scales
// whose value lies in F16's normal range; a value F16 holds as a subnormal keeps only F16's
// absolute precision (the scale 1e-6 takes the smallest codes to zero).
TEST(Fp8RowsTest, CheckpointScalesGiveBackEveryCode) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) != 0x7f) codes.push_back(static_cast<uint8_t>(c));  // 0x7f, 0xff: NaN
  }
  const int64_t cols = static_cast<int64_t>(codes.size());
  for (const float scale : {0x1p-14f, 3.7e-4f, 2.1e-3f, 0.0137f, 1.0f, 5.5f, 1e-6f}) {
    SCOPED_TRACE(scale);
    std::vector<float> values(cols);
    for (int64_t i = 0; i < cols; ++i) {
      values[i] = common::HalfToFloat(FloatToHalf(Fp8E4m3ToFloat(codes[i]) * scale));
    }
    std::vector<uint8_t> got(cols);
    float got_scale = 0.0f;
    QuantizeRowsToFp8(values.data(), 1, cols, &scale, got.data(), &got_scale);
    EXPECT_EQ(got_scale, scale);
    for (int64_t i = 0; i < cols; ++i) {
      const float original = Fp8E4m3ToFloat(codes[i]) * scale;
      if (std::abs(original) >= 0x1p-14f || original == 0.0f) {
        EXPECT_EQ(got[i], codes[i]) << "code " << int{codes[i]};
      } else {
        // F16's absolute precision there (2^-25 rounding), then E4M3's of the code.
        const float bound =
            0x1p-24f + scale * (std::abs(Fp8E4m3ToFloat(codes[i])) * 0x1p-3f + 0x1p-9f);
        EXPECT_LE(std::abs(Fp8E4m3ToFloat(got[i]) * scale - original), bound)
            << "code " << int{codes[i]};
      }
    }
  }
}

// Without checkpoint scales: each row's largest magnitude maps to 448 (saturating nothing), a
// row of zeros gets scale 1 and zero codes.
TEST(Fp8RowsTest, WithoutCheckpointScalesEachRowsMaximumMapsTo448) {
  const std::vector<float> values = {0.5f, -2.0f, 1.0f, 0.25f,  // max 2
                                     0.0f, 0.0f,  0.0f, 0.0f};
  std::vector<uint8_t> codes(8);
  float scales[2] = {};
  QuantizeRowsToFp8(values.data(), 2, 4, nullptr, codes.data(), scales);
  EXPECT_EQ(scales[0], 2.0f / kFp8E4m3Max);
  EXPECT_EQ(scales[1], 1.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(codes[1]), -448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(codes[0]), 112.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(codes[3]), 56.0f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(Fp8E4m3ToFloat(codes[i]), 0.0f);
}

}  // namespace
}  // namespace loom::kernels::cpu
