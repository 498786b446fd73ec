#include "kernels/cpu/kv_dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace loom::kernels::cpu {
namespace {

bool IsFp8Nan(uint8_t code) { return (code & 0x7f) == 0x7f; }

// The flag values name every type and back; anything else is no type.
TEST(KvDtypeNameTest, NamesEveryTypeAndReadsItBack) {
  for (KvDtype dtype :
       {KvDtype::kF16, KvDtype::kBf16, KvDtype::kF32, KvDtype::kInt8, KvDtype::kFp8E4m3}) {
    EXPECT_EQ(KvDtypeFromName(KvDtypeName(dtype)), dtype) << KvDtypeName(dtype);
  }
  EXPECT_EQ(KvDtypeName(KvDtype::kBf16), std::string_view("bf16"));
  for (const char* other : {"", "auto", "bfloat16", "fp8", "F16"}) {
    EXPECT_FALSE(KvDtypeFromName(other).has_value()) << other;
  }
}

TEST(Fp8E4m3Test, DecodesTheFormatsLandmarks) {
  EXPECT_EQ(Fp8E4m3ToFloat(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(Fp8E4m3ToFloat(0x80)));
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4m3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(Fp8E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0xff)));
}

TEST(Fp8E4m3Test, EncodesEveryCodeBackAndRoundsToNearestEven) {
  for (int code = 0; code < 256; ++code) {
    if (IsFp8Nan(static_cast<uint8_t>(code))) continue;
    EXPECT_EQ(FloatToFp8E4m3(Fp8E4m3ToFloat(static_cast<uint8_t>(code))), code) << code;
  }
  // Between each pair of adjacent positive codes: just below the midpoint goes down, just
  // above goes up, the midpoint itself to the even code.
  for (int code = 0; code < 0x7e; ++code) {
    const float low = Fp8E4m3ToFloat(static_cast<uint8_t>(code));
    const float high = Fp8E4m3ToFloat(static_cast<uint8_t>(code + 1));
    const float mid = (low + high) / 2;
    EXPECT_EQ(FloatToFp8E4m3(std::nextafter(mid, 0.0f)), code) << code;
    EXPECT_EQ(FloatToFp8E4m3(std::nextafter(mid, 1e9f)), code + 1) << code;
    EXPECT_EQ(FloatToFp8E4m3(mid), code % 2 == 0 ? code : code + 1) << code;
    EXPECT_EQ(FloatToFp8E4m3(-mid), 0x80 | (code % 2 == 0 ? code : code + 1)) << code;
  }
  EXPECT_EQ(FloatToFp8E4m3(1e6f), 0x7e);  // saturates, never NaN
  EXPECT_EQ(FloatToFp8E4m3(-500.0f), 0xfe);
  EXPECT_EQ(FloatToFp8E4m3(INFINITY), 0x7e);
  EXPECT_TRUE(IsFp8Nan(FloatToFp8E4m3(NAN)));
}

TEST(QuantizeKvRowTest, CodesStayInRangeAndReconstructWithinHalfAStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (KvDtype dtype : {KvDtype::kInt8, KvDtype::kFp8E4m3}) {
    for (float magnitude : {1e-6f, 1e-2f, 1.0f, 30.0f, 1e5f}) {
      std::vector<float> x(64);
      for (float& value : x) value = normal(rng) * magnitude;
      x[17] = 4 * magnitude;  // a clear maximum
      std::vector<uint8_t> codes(x.size());
      uint16_t scale_bits;
      QuantizeKvRow(dtype, x.data(), 64, codes.data(), &scale_bits);
      const float scale = Bf16ToFloat(scale_bits);
      const float qmax = dtype == KvDtype::kInt8 ? 127.0f : 448.0f;
      EXPECT_GE(scale * qmax, 4 * magnitude);            // rounded up: nothing saturates
      EXPECT_LE(scale * qmax, 4 * magnitude * 1.0079f);  // by at most one BF16 step
      for (size_t i = 0; i < x.size(); ++i) {
        const float back = DequantizeKv(dtype, codes.data(), static_cast<int64_t>(i), scale);
        // int8: half a step; E4M3: half a step of its 3-bit mantissa (2^-4 relative), or
        // half a subnormal step (2^-10 of the scale).
        const float bound = dtype == KvDtype::kInt8
                                ? scale * 0.5f
                                : std::fabs(x[i]) / 16 + scale * std::ldexp(1.0f, -10);
        EXPECT_LE(std::fabs(back - x[i]), bound * 1.0001f)
            << KvDtypeName(dtype) << " magnitude " << magnitude << " i " << i;
        if (dtype == KvDtype::kInt8) {
          EXPECT_NE(codes[i], 0x80);  // -128 never used
        }
      }
    }
    std::vector<float> zeros(16, 0.0f);
    std::vector<uint8_t> codes(16, 0xff);
    uint16_t scale_bits = 1;
    QuantizeKvRow(dtype, zeros.data(), 16, codes.data(), &scale_bits);
    EXPECT_EQ(scale_bits, 0);
    EXPECT_EQ(codes, std::vector<uint8_t>(16, 0));
  }
}

TEST(RotateKvRowTest, IsOrthogonalAndItsOwnInverse) {
  EXPECT_TRUE(RotatesKv(KvDtype::kInt8, 64));
  EXPECT_TRUE(RotatesKv(KvDtype::kFp8E4m3, 128));
  EXPECT_FALSE(RotatesKv(KvDtype::kInt8, 80));  // not a power of two: stored as is
  EXPECT_FALSE(RotatesKv(KvDtype::kF16, 64));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {2, 8, 64, 128}) {
    std::vector<float> x(n), y(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = normal(rng);
      y[i] = normal(rng);
    }
    double dot = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      dot += x[i] * y[i];
      norm += x[i] * x[i];
    }
    std::vector<float> hx = x, hy = y;
    RotateKvRow(hx.data(), n);
    RotateKvRow(hy.data(), n);
    double hdot = 0, hnorm = 0;
    for (int64_t i = 0; i < n; ++i) {
      hdot += hx[i] * hy[i];
      hnorm += hx[i] * hx[i];
    }
    EXPECT_NEAR(hdot, dot, 1e-4 * n) << n;  // dot products survive
    EXPECT_NEAR(hnorm, norm, 1e-4 * n) << n;
    EXPECT_NE(hx, x);
    RotateKvRow(hx.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(hx[i], x[i], 1e-5) << n;  // H H = I
  }
  // A one-hot row (an outlier channel) spreads over every channel equally.
  std::vector<float> spike(64, 0.0f);
  spike[5] = 8.0f;
  RotateKvRow(spike.data(), 64);
  for (float value : spike) EXPECT_EQ(std::fabs(value), 1.0f);
}

}  // namespace
}  // namespace loom::kernels::cpu
