// The K-quants packed natively (kernels/cpu/kquant_weights.cc): no value changes, the fused
// matrices of a Q4_K_M file widen without loss, and Matmul over them matches the reference
// on every ISA, AVX2 and AVX-512 to the bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/weights.h"
#include "tests/kernels/kquant_test_util.h"

namespace loom::kernels::cpu {
namespace {

using common::GgmlType;
using internal::MatmulIsaChoice;
using testing_util::RandomKQuantBlocks;

std::vector<float> Unpack(const PackedWeight& w) {
  std::vector<float> out(w.rows * w.cols, std::nanf(""));
  DequantizeRows(w, 0, w.rows, out.data());
  return out;
}

PackedWeight PackOrDie(GgmlType type, const std::vector<uint8_t>& blocks, int64_t rows,
                       int64_t cols) {
  absl::StatusOr<PackedWeight> packed = PackWeight(type, blocks.data(), rows, cols);
  EXPECT_TRUE(packed.ok()) << packed.status();
  return packed.ok() ? *std::move(packed) : PackedWeight{};
}

std::vector<float> GgufValues(GgmlType type, const std::vector<uint8_t>& blocks, int64_t n) {
  std::vector<float> values(n);
  EXPECT_TRUE(common::DequantizeToF32(type, blocks.data(), n, values.data()).ok());
  return values;
}

class KQuantPackTest : public testing::TestWithParam<GgmlType> {};

// Every value is the one `gguf` dequantizes (bit for bit; Q3_K's d * (q - 4) as
// (q + 4) * scale - 4 * scale gives +0 where gguf's product of a negative scale and 0 is -0,
// the same value).
TEST_P(KQuantPackTest, PacksWithoutChangingAnyValue) {
  const GgmlType type = GetParam();
  uint32_t seed = 40;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 256}, {37, 512}, {64, 768}}) {
    const std::vector<uint8_t> blocks = RandomKQuantBlocks(type, rows * cols, ++seed);
    const std::vector<float> expected = GgufValues(type, blocks, rows * cols);
    const PackedWeight packed = PackOrDie(type, blocks, rows, cols);
    ASSERT_TRUE(packed.f32_scaled());
    const bool int8 = type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
    EXPECT_EQ(packed.format, int8 ? WeightFormat::kInt8 : WeightFormat::kInt4);
    EXPECT_EQ(packed.group_size, type == GgmlType::kQ4_K || type == GgmlType::kQ5_K ? 32 : 16);
    EXPECT_NE(packed.source.find("lossless"), std::string::npos) << packed.source;
    const std::vector<float> got = Unpack(packed);
    if (type == GgmlType::kQ3_K) {
      int differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] != expected[i];
      EXPECT_EQ(differ, 0) << "rows " << rows << " cols " << cols;
    } else {
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
          << "rows " << rows << " cols " << cols;
    }
    // q in 4 or 8 bits, an F32 scale and min per group, rows padded to 16.
    const int64_t padded = (rows + 15) / 16 * 16;
    EXPECT_EQ(packed.bytes(), padded * cols / (int8 ? 1 : 2) + padded * cols / packed.group_size * 8);
  }
}

INSTANTIATE_TEST_SUITE_P(KQuants, KQuantPackTest,
                         testing::Values(GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                         GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const testing::TestParamInfo<GgmlType>& info) {
                           return common::RawGgmlTypeName(static_cast<uint32_t>(info.param));
                         });

// A Q4_K_M file fuses Q4_K Q/K with a Q6_K V (and Q4_0/Q8_0 beside K-quants elsewhere):
// ConcatRows widens every part to INT8 g16 with F32 scales, no value changed.
TEST(KQuantWeightsTest, ConcatRowsWidensMixedIntegerPartsWithoutLoss) {
  const int64_t cols = 512;
  const std::vector<uint8_t> q = RandomKQuantBlocks(GgmlType::kQ4_K, 40 * cols, 1);
  const std::vector<uint8_t> k = RandomKQuantBlocks(GgmlType::kQ4_K, 8 * cols, 2);
  const std::vector<uint8_t> v = RandomKQuantBlocks(GgmlType::kQ6_K, 8 * cols, 3);
  const PackedWeight pq = PackOrDie(GgmlType::kQ4_K, q, 40, cols);
  const PackedWeight pk = PackOrDie(GgmlType::kQ4_K, k, 8, cols);
  const PackedWeight pv = PackOrDie(GgmlType::kQ6_K, v, 8, cols);
  std::vector<float> values = Unpack(pq);
  for (const PackedWeight* part : {&pk, &pv}) {
    const std::vector<float> more = Unpack(*part);
    values.insert(values.end(), more.begin(), more.end());
  }
  absl::StatusOr<PackedWeight> fused = ConcatRows({&pq, &pk, &pv});
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(fused->format, WeightFormat::kInt8);
  EXPECT_EQ(fused->group_size, 16);
  EXPECT_TRUE(fused->f32_scaled());
  EXPECT_EQ(Unpack(*fused), values);
  EXPECT_NE(fused->source.find("Q6_K"), std::string::npos) << fused->source;

  // F16-scaled INT4 (Q4_0-style) and INT8 beside each other: INT8 with F32 mins.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> dense(24 * 64);
  for (float& x : dense) x = normal(rng);
  absl::StatusOr<PackedWeight> a = PackFromF32(dense.data(), 8, 64, WeightFormat::kInt4, 32);
  absl::StatusOr<PackedWeight> b =
      PackFromF32(dense.data() + 8 * 64, 16, 64, WeightFormat::kInt8, 64);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> want = Unpack(*a);
  const std::vector<float> more = Unpack(*b);
  want.insert(want.end(), more.begin(), more.end());
  absl::StatusOr<PackedWeight> mixed = ConcatRows({&*a, &*b});
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->format, WeightFormat::kInt8);
  EXPECT_EQ(mixed->group_size, 32);
  EXPECT_EQ(Unpack(*mixed), want);

  // Float beside integer parts stays refused (the model loader falls back to F32 there).
  absl::StatusOr<PackedWeight> f16 = PackFromF32(dense.data(), 8, 512, WeightFormat::kF16, 0);
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ(ConcatRows({&pq, &*f16}).status().code(), absl::StatusCode::kInvalidArgument);
}

// The CUDA repack: INT4 keeps F16 scales (F32 ones round there); INT8 keeps F32 scales, and
// mins only where a group has one (Q5_K, not Q6_K), the values exactly.
TEST(KQuantWeightsTest, UnpackQuantizedRoundsInt4ScalesAndKeepsInt8Ones) {
  const std::vector<uint8_t> q4 = RandomKQuantBlocks(GgmlType::kQ4_K, 16 * 256, 7);
  const PackedWeight packed = PackOrDie(GgmlType::kQ4_K, q4, 16, 256);
  absl::StatusOr<NaturalQuantizedWeight> natural = UnpackQuantized(packed);
  ASSERT_TRUE(natural.ok()) << natural.status();
  const std::vector<float> exact = Unpack(packed);
  for (int64_t i = 0; i < 16 * 256; ++i) {
    const int64_t g = i / 32;
    const float scale = internal::HalfToFloat(natural->scales[g]);
    const float min = internal::HalfToFloat(natural->mins[g]);
    // Each of scale and min rounds to F16 by at most half a unit in the 11th bit.
    ASSERT_NEAR(natural->q[i] * scale + min, exact[i],
                std::ldexp(std::fabs(natural->q[i] * scale) + std::fabs(min), -11) + 1e-12)
        << i;
  }
  for (const GgmlType type : {GgmlType::kQ6_K, GgmlType::kQ5_K}) {
    SCOPED_TRACE(static_cast<int>(type));
    const PackedWeight int8 = PackOrDie(type, RandomKQuantBlocks(type, 16 * 256, 8), 16, 256);
    absl::StatusOr<NaturalQuantizedWeight> kept = UnpackQuantized(int8);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_TRUE(kept->scales.empty());
    EXPECT_TRUE(kept->mins.empty());
    EXPECT_EQ(kept->mins_f32.empty(), type == GgmlType::kQ6_K);
    const std::vector<float> values = Unpack(int8);
    const int64_t groups = 256 / int8.group_size;
    ASSERT_EQ(kept->scales_f32.size(), static_cast<size_t>(16 * groups));
    for (int64_t i = 0; i < 16 * 256; ++i) {
      const int64_t g = i / int8.group_size;  // rows are 256 wide: row * groups + column group
      const float min = kept->mins_f32.empty() ? -0.0f : kept->mins_f32[g];
      ASSERT_EQ(static_cast<float>(kept->q[i]) * kept->scales_f32[g] + min, values[i]) << i;
    }
  }
  EXPECT_EQ(PackWeight(GgmlType::kQ4_K, q4.data(), 32, 128).status().code(),
            absl::StatusCode::kInvalidArgument);  // 128 columns: not whole super-blocks
}

class IsaGuard {
 public:
  explicit IsaGuard(MatmulIsaChoice isa) { internal::SetMatmulIsaForTesting(isa); }
  ~IsaGuard() { internal::SetMatmulIsaForTesting(MatmulIsaChoice::kAuto); }
};

// `amx` false keeps AVX-512's int8-activation kernels off AMX (where the CPU has it).
std::vector<float> RunMatmul(MatmulIsaChoice isa, const PackedWeight& w,
                             const std::vector<float>& x, const float* bias, int64_t m,
                             ActivationPrecision activations, int threads, bool amx = true) {
  std::vector<float> y(m * w.rows, std::nanf(""));
  IsaGuard guard(isa);
  internal::SetAmxAllowedForTesting(amx);
  ThreadPool pool(threads);
  const absl::Status status = Matmul({x.data(), &w, bias, y.data(), m, activations}, pool);
  EXPECT_TRUE(status.ok()) << status;
  internal::SetAmxAllowedForTesting(true);
  return y;
}

// Whether this process runs the AMX kernels (the CPU has them, LOOM_CPU_ISA allows them).
bool AmxHere() { return ActiveCpuIsa() >= CpuIsa::kAmx; }

class KQuantMatmulTest : public testing::TestWithParam<GgmlType> {};

// Against the double reference over the packed (= gguf's) values, on every ISA the CPU
// allows, over token counts that take the GEMV, decode and panel tiles and partial row
// blocks; AVX2 and AVX-512 give the same bits. With int8 activations (one scale per 256
// columns, llama.cpp's Q8_K): against the reference over the activations as quantized, the
// same bits on every ISA, scalar included, and on AMX (m >= 16: 16-token tiles, the rest
// on AVX-512) where the CPU has it.
TEST_P(KQuantMatmulTest, MatchesReferenceOnEveryIsa) {
  const GgmlType type = GetParam();
  uint32_t seed = 70;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{40, 256}, {200, 768}}) {
    const std::vector<uint8_t> blocks = RandomKQuantBlocks(type, rows * cols, ++seed);
    const PackedWeight w = PackOrDie(type, blocks, rows, cols);
    const std::vector<float> values = Unpack(w);
    std::vector<float> bias(rows);
    for (int64_t i = 0; i < rows; ++i) bias[i] = 0.01f * static_cast<float>(i % 5);
    for (int64_t m : {1, 3, 8, 17, 32}) {
      std::mt19937 rng(++seed);
      std::normal_distribution<float> normal;
      std::vector<float> x(m * cols);
      for (float& v : x) v = normal(rng);
      std::vector<float> reference(m * rows);
      ASSERT_TRUE(
          MatmulReference({x.data(), &w, bias.data(), reference.data(), m}).ok());
      // The activations int8 kernels multiply: x quantized per 256 columns (Q8_K).
      std::vector<int8_t> xq(m * cols);
      std::vector<float> x_scale(m * cols / 256);
      std::vector<int32_t> x_sum(m * cols / 256);
      internal::QuantizeActivationRowsInGroups(x.data(), m, cols, 256, xq.data(), x_scale.data(),
                                               x_sum.data());
      std::vector<float> x_hat(m * cols);
      for (int64_t i = 0; i < m * cols; ++i) x_hat[i] = xq[i] * x_scale[i / 256];
      std::vector<float> int8_reference(m * rows);
      ASSERT_TRUE(
          MatmulReference({x_hat.data(), &w, bias.data(), int8_reference.data(), m}).ok());
      // Every output within float accumulation of the reference over activations `xs`.
      auto expect_close = [&](const std::vector<float>& got, const std::vector<float>& want,
                              const std::vector<float>& xs, const char* what) {
        for (int64_t t = 0; t < m; ++t) {
          for (int64_t j = 0; j < rows; ++j) {
            double magnitude = 0.0;
            for (int64_t c = 0; c < cols; ++c) {
              magnitude += std::fabs(values[j * cols + c] * xs[t * cols + c]);
            }
            ASSERT_NEAR(got[t * rows + j], want[t * rows + j], 3e-5 * magnitude + 1e-6)
                << what << ", token " << t << " row " << j;
          }
        }
      };
      std::vector<std::vector<float>> simd, int8_results;
      for (MatmulIsaChoice isa :
           {MatmulIsaChoice::kScalar, MatmulIsaChoice::kAvx2, MatmulIsaChoice::kAvx512}) {
        if (!internal::IsaSupported(isa)) continue;
        SCOPED_TRACE(testing::Message() << "isa " << static_cast<int>(isa) << " rows " << rows
                                        << " cols " << cols << " m " << m);
        const std::vector<float> y =
            RunMatmul(isa, w, x, bias.data(), m, ActivationPrecision::kF32, 1 + m % 3);
        expect_close(y, reference, x, "float activations");
        const std::vector<float> int8 =
            RunMatmul(isa, w, x, bias.data(), m, ActivationPrecision::kInt8, 2);
        expect_close(int8, int8_reference, x_hat, "int8 activations");
        int8_results.push_back(int8);
        if (isa == MatmulIsaChoice::kAvx512 && AmxHere()) {  // int8 above ran on AMX
          int8_results.push_back(
              RunMatmul(isa, w, x, bias.data(), m, ActivationPrecision::kInt8, 3, /*amx=*/false));
        }
        if (isa != MatmulIsaChoice::kScalar) simd.push_back(y);
      }
      if (simd.size() == 2) {
        EXPECT_EQ(simd[0], simd[1]) << "AVX2 and AVX-512 differ, m " << m;
      }
      for (size_t i = 1; i < int8_results.size(); ++i) {
        EXPECT_EQ(int8_results[i], int8_results[0]) << "int8 activations: ISA " << i << " differs";
      }
    }
  }
}

// A fused matrix of legacy parts widened to F32-scaled INT8 (Q4_0-, Q4_1- and Q8_0-like parts,
// 96 columns: activation scales per 32) with int8 activations: the reference over the
// activations as quantized per 32, the same bits on every ISA (AMX from 16 tokens).
TEST(KQuantWeightsTest, WidenedLegacyMatrixWithInt8ActivationsMatchesReference) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  const int64_t cols = 96;
  std::vector<float> dense(40 * cols);
  for (float& v : dense) v = normal(rng);
  absl::StatusOr<PackedWeight> a = PackFromF32(dense.data(), 24, cols, WeightFormat::kInt4, 32);
  absl::StatusOr<PackedWeight> b =
      PackFromF32(dense.data() + 24 * cols, 16, cols, WeightFormat::kInt8, 32);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<PackedWeight> w = ConcatRows({&*a, &*b});
  ASSERT_TRUE(w.ok() && w->f32_scaled()) << w.status();
  const std::vector<float> values = Unpack(*w);
  for (int64_t m : {1, 5, 21}) {
    std::vector<float> x(m * cols);
    for (float& v : x) v = normal(rng);
    std::vector<int8_t> xq(m * cols);
    std::vector<float> x_scale(m * cols / 32);
    std::vector<int32_t> x_sum(m * cols / 32);
    internal::QuantizeActivationRows(x.data(), m, cols, xq.data(), x_scale.data(), x_sum.data());
    std::vector<float> x_hat(m * cols);
    for (int64_t i = 0; i < m * cols; ++i) x_hat[i] = xq[i] * x_scale[i / 32];
    std::vector<float> want(m * 40);
    ASSERT_TRUE(MatmulReference({x_hat.data(), &*w, nullptr, want.data(), m}).ok());
    std::vector<std::vector<float>> results;
    for (MatmulIsaChoice isa :
         {MatmulIsaChoice::kScalar, MatmulIsaChoice::kAvx2, MatmulIsaChoice::kAvx512}) {
      if (!internal::IsaSupported(isa)) continue;
      for (bool amx : {true, false}) {
        if (!amx && (isa != MatmulIsaChoice::kAvx512 || !AmxHere())) continue;
        const std::vector<float> y =
            RunMatmul(isa, *w, x, nullptr, m, ActivationPrecision::kInt8, 2, amx);
        for (int64_t t = 0; t < m; ++t) {
          for (int64_t j = 0; j < 40; ++j) {
            double magnitude = 0.0;
            for (int64_t c = 0; c < cols; ++c)
              magnitude += std::fabs(values[j * cols + c] * x_hat[t * cols + c]);
            ASSERT_NEAR(y[t * 40 + j], want[t * 40 + j], 3e-5 * magnitude + 1e-6)
                << "isa " << static_cast<int>(isa) << " token " << t << " row " << j;
          }
        }
        results.push_back(y);
      }
    }
    for (size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]);
  }
}

INSTANTIATE_TEST_SUITE_P(KQuants, KQuantMatmulTest,
                         testing::Values(GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                         GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const testing::TestParamInfo<GgmlType>& info) {
                           return common::RawGgmlTypeName(static_cast<uint32_t>(info.param));
                         });

}  // namespace
}  // namespace loom::kernels::cpu
