#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/formats/ggml_type.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_internal.h"

namespace loom::kernels::cpu {
namespace {

using internal::MatmulIsaChoice;
using Precision = ActivationPrecision;

// Tolerances.
//  * Float activations (F32, F16 weights; INT8, INT4 weights with kF32 activations)
//    against the double reference over the same (dequantized) weights:
//    |y - ref| <= kFloatTol * sum_j |w_ij x_j| + 1e-6 (float accumulation over k <= 2048).
//  * kInt8 activations with INT8/INT4 weights: x quantized to int8 per 32 columns
//    (x ~ s_g * q, |x - s_g q| <= s_g / 2). Checked twice: against the reference on the dequantized activations
//    (float accumulation only: kFloatTol), and against the reference on the exact
//    activations with the worst-case activation quantization error added:
//    sum_j |w_ij| * s_g(j) / 2.
constexpr double kFloatTol = 3e-5;

struct Shape {
  int64_t rows;  // n
  int64_t cols;  // k
};

std::vector<float> RandomWeights(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_real_distribution<float> row_scale(0.05f, 2.0f);
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = row_scale(rng);
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = uniform(rng) * s;
  }
  return w;
}

// Activations with a few outlier channels, as LLM hidden states have.
std::vector<float> RandomActivations(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(m * k);
  for (float& v : x) v = normal(rng);
  for (int64_t t = 0; t < m; ++t) x[t * k + (7 * t + 3) % k] *= 20.0f;
  return x;
}

std::vector<float> Dequantize(const PackedWeight& w) {
  std::vector<float> out(w.rows * w.cols);
  DequantizeRows(w, 0, w.rows, out.data());
  return out;
}

const char* IsaName(MatmulIsaChoice isa) {
  switch (isa) {
    case MatmulIsaChoice::kScalar:
      return "scalar";
    case MatmulIsaChoice::kAvx2:
      return "avx2";
    case MatmulIsaChoice::kAvx512:
      return "avx512";
    default:
      return "auto";
  }
}

class IsaGuard {
 public:
  explicit IsaGuard(MatmulIsaChoice isa) { internal::SetMatmulIsaForTesting(isa); }
  ~IsaGuard() { internal::SetMatmulIsaForTesting(MatmulIsaChoice::kAuto); }
};

struct TestWeight {
  PackedWeight packed;
  std::vector<float> values;  // the packed weight dequantized, [n, k]
};

// Random GGUF blocks of a 4-bit table format, NL4 (or INT8) once packed: IQ4_NL for even
// seeds (F16 scales of both signs), MXFP4 for odd ones (exponents 2^-7 .. 2^-3).
std::vector<uint8_t> RandomTableBlocks(Shape shape, uint32_t seed, common::GgmlType* type) {
  const bool mxfp4 = seed % 2 == 1;
  *type = mxfp4 ? common::GgmlType::kMXFP4 : common::GgmlType::kIQ4_NL;
  const int64_t block_bytes = mxfp4 ? 17 : 18, header = mxfp4 ? 1 : 2;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  std::vector<uint8_t> blocks(shape.rows * shape.cols / 32 * block_bytes);
  for (size_t b = 0; b < blocks.size(); b += block_bytes) {
    if (mxfp4) {
      blocks[b] = static_cast<uint8_t>(121 + byte(rng) % 5);
    } else {
      const uint16_t half = FloatToHalf(scale(rng));
      std::memcpy(&blocks[b], &half, 2);
    }
    for (int64_t i = header; i < block_bytes; ++i) blocks[b + i] = static_cast<uint8_t>(byte(rng));
  }
  return blocks;
}

// A weight of `format`: random values rounded to it, or for NL4 (group 32 only) random
// IQ4_NL or MXFP4 blocks (`as_int8`: their INT8 form, the same values).
TestWeight MakeTestWeight(WeightFormat format, int64_t group, Shape shape, uint32_t seed,
                          bool as_int8 = false) {
  if (format == WeightFormat::kNl4) {
    EXPECT_EQ(group, 32);
    common::GgmlType type;
    const std::vector<uint8_t> blocks = RandomTableBlocks(shape, seed, &type);
    absl::StatusOr<PackedWeight> packed =
        PackWeight(type, blocks.data(), shape.rows, shape.cols, {.table_4bit_as_int8 = as_int8});
    EXPECT_TRUE(packed.ok()) << packed.status();
    EXPECT_EQ(packed->format, as_int8 ? WeightFormat::kInt8 : WeightFormat::kNl4);
    TestWeight weight{*std::move(packed), {}};
    weight.values = Dequantize(weight.packed);
    return weight;
  }
  const std::vector<float> values = RandomWeights(shape.rows, shape.cols, seed);
  absl::StatusOr<PackedWeight> packed =
      PackFromF32(values.data(), shape.rows, shape.cols, format, group);
  EXPECT_TRUE(packed.ok()) << packed.status();
  TestWeight weight{*std::move(packed), {}};
  weight.values = Dequantize(weight.packed);
  return weight;
}

// Runs Matmul on `isa` with `precision` and checks every output against the references.
void CheckMatmul(MatmulIsaChoice isa, const TestWeight& weight, Precision precision, int64_t m,
                 bool with_bias, int threads, uint32_t seed) {
  const PackedWeight& packed = weight.packed;
  const WeightFormat format = packed.format;
  SCOPED_TRACE(testing::Message() << IsaName(isa) << " " << WeightFormatName(format) << " g"
                                  << packed.group_size << " n=" << packed.rows
                                  << " k=" << packed.cols << " m=" << m << " bias=" << with_bias
                                  << " threads=" << threads << " activations="
                                  << (precision == Precision::kF32 ? "f32" : "int8"));
  const int64_t n = packed.rows, k = packed.cols;
  const std::vector<float>& w = weight.values;
  const std::vector<float> x = RandomActivations(m, k, seed + 1);
  std::vector<float> bias(n);
  std::mt19937 rng(seed + 2);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& b : bias) b = uniform(rng);

  std::vector<float> y(m * n, std::nanf(""));
  {
    IsaGuard guard(isa);
    ThreadPool pool(threads);
    MatmulParams params{x.data(), &packed, with_bias ? bias.data() : nullptr, y.data(), m,
                        precision};
    ASSERT_TRUE(Matmul(params, pool).ok());
  }

  const bool integer =
      format != WeightFormat::kF32 && format != WeightFormat::kF16 && format != WeightFormat::kBf16;
  // The activations the kernels actually multiply, and their quantization step (zero,
  // and x_hat == x, for float activations).
  std::vector<float> x_hat = x;
  std::vector<float> x_step(m * k, 0.0f);
  if (integer && precision == Precision::kInt8) {
    std::vector<int8_t> q(m * k);
    std::vector<float> scale(m * k / internal::kActGroup);
    std::vector<int32_t> sum(m * k / internal::kActGroup);
    internal::QuantizeActivationRows(x.data(), m, k, q.data(), scale.data(), sum.data());
    for (int64_t i = 0; i < m * k; ++i) {
      x_hat[i] = scale[i / internal::kActGroup] * q[i];
      x_step[i] = scale[i / internal::kActGroup];
    }
  }
  int bad = 0;
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = with_bias ? bias[j] : 0.0, seen = exact, magnitude = 0.0, quant_err = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double wv = w[j * k + c];
        exact += wv * x[t * k + c];
        seen += wv * x_hat[t * k + c];
        magnitude += std::fabs(wv * x_hat[t * k + c]);
        quant_err += std::fabs(wv) * x_step[t * k + c] * 0.5;
      }
      const double got = y[t * n + j];
      const double float_tol = kFloatTol * magnitude + 1e-6;
      const bool ok = std::isfinite(got) && std::fabs(got - seen) <= float_tol &&
                      std::fabs(got - exact) <= quant_err * (1 + 1e-3) + float_tol;
      if (!ok && bad++ < 5) {
        ADD_FAILURE() << "y[" << t << ", " << j << "] = " << got << ", reference " << seen
                      << " (exact activations " << exact << "), tolerance " << float_tol
                      << " + quantization " << quant_err;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

std::vector<MatmulIsaChoice> AvailableIsas() {
  std::vector<MatmulIsaChoice> isas;
  for (MatmulIsaChoice isa : {MatmulIsaChoice::kScalar, MatmulIsaChoice::kAvx2,
                              MatmulIsaChoice::kAvx512}) {
    if (internal::IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

class MatmulFormatTest : public testing::TestWithParam<std::tuple<WeightFormat, int64_t>> {};

// F32/F16 weights (float activations) and the int8-activation path of INT8/INT4.
TEST_P(MatmulFormatTest, MatchesReferenceOnEveryIsaOverShapeSweep) {
  const auto [format, group] = GetParam();
  const Precision precision =
      format != WeightFormat::kF32 && format != WeightFormat::kF16 && format != WeightFormat::kBf16
          ? Precision::kInt8
          : Precision::kF32;
  const std::vector<Shape> shapes = {{37, 96}, {576, 576}, {1536, 576}, {576, 1536}, {3, 2048}};
  uint32_t seed = 100;
  for (const Shape& shape : shapes) {
    if (group > 32 && shape.cols % group != 0) continue;
    const int64_t g = group == 0 ? 0 : group < 0 ? shape.cols : group;
    const TestWeight weight = MakeTestWeight(format, g, shape, ++seed);
    for (MatmulIsaChoice isa : AvailableIsas()) {
      for (int64_t m : {1, 3, 17, 64}) {
        if (isa == MatmulIsaChoice::kScalar && m * shape.rows * shape.cols > 40'000'000) continue;
        CheckMatmul(isa, weight, precision, m, /*with_bias=*/m % 2 == 1, /*threads=*/2,
                    ++seed);
      }
    }
  }
}

// A (format, group) case's name: F32, INT8_g32, INT8_per_channel (group -1), ...; group 0:
// not grouped.
std::string FormatAndGroupName(
    const testing::TestParamInfo<std::tuple<WeightFormat, int64_t>>& info) {
  const int64_t g = std::get<1>(info.param);
  return std::string(WeightFormatName(std::get<0>(info.param))) + (g == 0 ? ""
                                                                   : g < 0
                                                                       ? "_per_channel"
                                                                       : "_g" + std::to_string(g));
}

INSTANTIATE_TEST_SUITE_P(Formats, MatmulFormatTest,
                         testing::Values(std::make_tuple(WeightFormat::kF32, int64_t{0}),
                                         std::make_tuple(WeightFormat::kF16, int64_t{0}),
                                         std::make_tuple(WeightFormat::kBf16, int64_t{0}),
                                         std::make_tuple(WeightFormat::kInt8, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt8,
                                                         int64_t{-1}),  // per output channel
                                         std::make_tuple(WeightFormat::kInt4, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt4, int64_t{64}),
                                         std::make_tuple(WeightFormat::kInt5, int64_t{32}),
                                         std::make_tuple(WeightFormat::kNl4, int64_t{32})),
                         FormatAndGroupName);

// INT8/INT4/INT5 weights with float activations (the default): dequantized in registers,
// float accumulation, so the float tolerance holds. n = 1000 leaves a partial row block;
// per-channel INT8 has one group over all of k.
class MatmulFloatActivationTest
    : public testing::TestWithParam<std::tuple<WeightFormat, int64_t>> {};

TEST_P(MatmulFloatActivationTest, MatchesReferenceOnEveryIsaOverShapeSweep) {
  const auto [format, group] = GetParam();
  uint32_t seed = 300;
  for (int64_t rows : {16, 576, 1000}) {
    for (int64_t cols : {32, 576, 1536}) {
      if (group > 0 && cols % group != 0) continue;
      const int64_t g = group < 0 ? cols : group;
      const TestWeight weight = MakeTestWeight(format, g, {rows, cols}, ++seed);
      for (MatmulIsaChoice isa : AvailableIsas()) {
        for (int64_t m : {1, 3, 17, 64}) {
          if (isa == MatmulIsaChoice::kScalar && m * rows * cols > 40'000'000) continue;
          CheckMatmul(isa, weight, Precision::kF32, m, /*with_bias=*/m % 2 == 1,
                      /*threads=*/2, ++seed);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MatmulFloatActivationTest,
                         testing::Values(std::make_tuple(WeightFormat::kInt8, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt8,
                                                         int64_t{-1}),  // per output channel
                                         std::make_tuple(WeightFormat::kInt4, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt4, int64_t{64}),
                                         std::make_tuple(WeightFormat::kInt5, int64_t{64}),
                                         std::make_tuple(WeightFormat::kNl4, int64_t{32})),
                         FormatAndGroupName);

// The GEMM kernel for INT8/INT4 weights with float activations (AVX-512: each 32-row
// panel dequantized once per call into a float scratch, then a float microkernel over
// all tokens), forced on for every m, m = 1 included. The sweep covers the token tiles
// (up to 12 tokens, balanced), token panels (k = 4096 splits 130 tokens into 3), column
// chunks that split groups (k = 768 runs as 4 x 192 with g128), odd row-block counts per
// thread (a last panel of one block), partial row blocks (n % 16 != 0), and 1-3 threads.
class F32ActGemmGuard {
 public:
  explicit F32ActGemmGuard(int64_t min_tokens) {
    internal::SetF32ActGemmMinTokensForTesting(min_tokens);
  }
  ~F32ActGemmGuard() { internal::SetF32ActGemmMinTokensForTesting(0); }
};

class MatmulF32ActGemmTest : public testing::TestWithParam<std::tuple<WeightFormat, int64_t>> {};

// AVX-512 and AVX2 (matmul_f32act_gemm_avx2: 16-row panels, tiles of up to 6 tokens after
// a decoding tile of up to 4, token panels from the L2 size) where the CPU has them.
TEST_P(MatmulF32ActGemmTest, MatchesReferenceOverTokenAndShapeSweep) {
  std::vector<MatmulIsaChoice> isas;
  for (MatmulIsaChoice isa : {MatmulIsaChoice::kAvx2, MatmulIsaChoice::kAvx512}) {
    if (internal::IsaSupported(isa)) isas.push_back(isa);
  }
  if (isas.empty()) GTEST_SKIP() << "neither AVX2 nor AVX-512 here";
  const auto [format, group] = GetParam();
  F32ActGemmGuard gemm_for_every_m(1);
  const std::vector<Shape> shapes = {{40, 128}, {200, 384}, {1000, 768}, {33, 4096}};
  uint32_t seed = 500;
  for (const Shape& shape : shapes) {
    const int64_t g = group < 0 ? shape.cols : group;
    const TestWeight weight = MakeTestWeight(format, g, shape, ++seed);
    for (int64_t m : {1, 2, 3, 4, 7, 8, 16, 17, 64, 130}) {
      const int threads = 1 + static_cast<int>(m % 3);
      // Both bias settings, except on the largest shape (alternating there).
      for (bool with_bias : {false, true}) {
        if (shape.rows * shape.cols > 500'000 && with_bias != (m % 2 == 1)) continue;
        for (MatmulIsaChoice isa : isas) {
          CheckMatmul(isa, weight, Precision::kF32, m, with_bias, threads, ++seed);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MatmulF32ActGemmTest,
                         testing::Values(std::make_tuple(WeightFormat::kInt4, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt4, int64_t{64}),
                                         std::make_tuple(WeightFormat::kInt4, int64_t{128}),
                                         std::make_tuple(WeightFormat::kInt5, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt5, int64_t{128}),
                                         std::make_tuple(WeightFormat::kInt8, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt8, int64_t{64}),
                                         std::make_tuple(WeightFormat::kInt8, int64_t{128}),
                                         std::make_tuple(WeightFormat::kInt8,
                                                         int64_t{-1}),  // per output channel
                                         std::make_tuple(WeightFormat::kNl4, int64_t{32})),
                         FormatAndGroupName);

// The AVX2 and AVX-512 GEMM kernels compute each output as one FMA chain over k of the
// same dequantized floats: the same bits, on every shape and batch size.
TEST(MatmulTest, F32ActGemmIsBitIdenticalOnAvx2AndAvx512) {
  if (!internal::IsaSupported(MatmulIsaChoice::kAvx512)) GTEST_SKIP() << "no AVX-512 here";
  uint32_t seed = 900;
  for (WeightFormat format : {WeightFormat::kInt4, WeightFormat::kInt5, WeightFormat::kInt8}) {
    for (Shape shape : {Shape{40, 128}, Shape{1000, 768}}) {
      const TestWeight weight = MakeTestWeight(format, 64, shape, ++seed);
      for (int64_t m : {1, 5, 9, 40}) {
        const std::vector<float> x = RandomActivations(m, shape.cols, ++seed);
        std::vector<float> bias(shape.rows);
        for (int64_t i = 0; i < shape.rows; ++i) bias[i] = 0.01f * static_cast<float>(i % 7);
        std::vector<float> y2(m * shape.rows), y512(m * shape.rows);
        ThreadPool pool(2);
        {
          IsaGuard guard(MatmulIsaChoice::kAvx2);
          ASSERT_TRUE(Matmul({x.data(), &weight.packed, bias.data(), y2.data(), m}, pool).ok());
        }
        {
          IsaGuard guard(MatmulIsaChoice::kAvx512);
          ASSERT_TRUE(Matmul({x.data(), &weight.packed, bias.data(), y512.data(), m}, pool).ok());
        }
        for (int64_t i = 0; i < m * shape.rows; ++i) {
          ASSERT_EQ(y2[i], y512[i])
              << WeightFormatName(format) << " n=" << shape.rows << " m=" << m << " at " << i;
        }
      }
    }
  }
}

// The int8-activation GEMM (matmul_int8act_gemm_avx2.cc: vpmaddubsw + vpmaddwd, INT4 in
// int16 per group; AVX-512: VNNI tiles of 4 tokens x 32 rows), both in token panels sized
// from the L2, forced on for every m, against the reference over the token tiles
// (balanced tiles of <= 2 / 4 tokens), token panels (k = 4096 splits 300 tokens into 2 or more panels on L2 sizes up
// to 2 MiB), partial row blocks and 1-3 threads, under each ISA the CPU allows.
class Int8ActGemmGuard {
 public:
  explicit Int8ActGemmGuard(int64_t min_tokens) {
    internal::SetInt8ActGemmMinTokensForTesting(min_tokens);
  }
  ~Int8ActGemmGuard() { internal::SetInt8ActGemmMinTokensForTesting(0); }
};

// Keeps the AVX-512 int8-activation GEMM off AMX while it lives (allowed = false).
class AmxGuard {
 public:
  explicit AmxGuard(bool allowed) { internal::SetAmxAllowedForTesting(allowed); }
  ~AmxGuard() { internal::SetAmxAllowedForTesting(true); }
};

// The AMX settings to run the AVX-512 kernels under: VNNI alone, and AMX where the CPU
// and LOOM_CPU_ISA allow it (kernels/cpu/matmul_int8act_gemm_amx.cc).
std::vector<bool> AmxSettings(MatmulIsaChoice isa) {
  if (isa != MatmulIsaChoice::kAvx512 || ActiveCpuIsa() < CpuIsa::kAmx) return {false};
  return {false, true};
}

class MatmulInt8ActGemmTest : public testing::TestWithParam<std::tuple<WeightFormat, int64_t>> {
};

TEST_P(MatmulInt8ActGemmTest, MatchesReferenceOverTokenAndShapeSweep) {
  std::vector<MatmulIsaChoice> isas;
  for (MatmulIsaChoice isa : {MatmulIsaChoice::kAvx2, MatmulIsaChoice::kAvx512}) {
    if (internal::IsaSupported(isa)) isas.push_back(isa);
  }
  if (isas.empty()) GTEST_SKIP() << "neither AVX2 nor AVX-512 here";
  const auto [format, group] = GetParam();
  Int8ActGemmGuard gemm_for_every_m(1);
  const std::vector<Shape> shapes = {{40, 128}, {200, 384}, {1000, 768}, {33, 4096}};
  uint32_t seed = 1500;
  for (const Shape& shape : shapes) {
    const int64_t g = group < 0 ? shape.cols : group;
    const TestWeight weight = MakeTestWeight(format, g, shape, ++seed);
    for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 48, 64, 300}) {
      if (m == 300 && shape.cols != 4096) continue;
      const int threads = 1 + static_cast<int>(m % 3);
      for (MatmulIsaChoice isa : isas) {
        for (bool amx : AmxSettings(isa)) {
          AmxGuard amx_guard(amx);
          CheckMatmul(isa, weight, Precision::kInt8, m, /*with_bias=*/m % 2 == 1, threads, ++seed);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MatmulInt8ActGemmTest,
                         testing::Values(std::make_tuple(WeightFormat::kInt4, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt4, int64_t{128}),
                                         std::make_tuple(WeightFormat::kInt5, int64_t{64}),
                                         std::make_tuple(WeightFormat::kInt8, int64_t{32}),
                                         std::make_tuple(WeightFormat::kInt8, int64_t{64}),
                                         std::make_tuple(WeightFormat::kInt8,
                                                         int64_t{-1}),  // per output channel
                                         std::make_tuple(WeightFormat::kNl4, int64_t{32})),
                         FormatAndGroupName);

// With int8 activations every kernel applies the same exact integer group dot products
// with the same float operations: the GEMM and the tile kernels, on AVX2, AVX-512 and AMX
// (16-token tiles, the rest on AVX-512), for every m and thread count, give the same bits. So
// moving Int8ActGemmMinTokens is a speed choice only, and a token's result never depends on its
// batch or on the ISA.
TEST(MatmulTest, Int8ActGemmIsBitIdenticalToTileKernelsOnEveryIsa) {
  std::vector<MatmulIsaChoice> isas;
  for (MatmulIsaChoice isa : {MatmulIsaChoice::kAvx2, MatmulIsaChoice::kAvx512}) {
    if (internal::IsaSupported(isa)) isas.push_back(isa);
  }
  if (isas.empty()) GTEST_SKIP() << "neither AVX2 nor AVX-512 here";
  uint32_t seed = 1900;
  for (WeightFormat format : {WeightFormat::kInt4, WeightFormat::kInt5, WeightFormat::kInt8}) {
    for (Shape shape : {Shape{40, 128}, Shape{1000, 768}}) {
      const TestWeight weight = MakeTestWeight(format, 64, shape, ++seed);
      for (int64_t m : {1, 5, 9, 16, 40, 48}) {
        const std::vector<float> x = RandomActivations(m, shape.cols, ++seed);
        std::vector<float> bias(shape.rows);
        for (int64_t i = 0; i < shape.rows; ++i) bias[i] = 0.01f * static_cast<float>(i % 7);
        std::vector<float> first;
        std::string first_name;
        for (MatmulIsaChoice isa : isas) {
          IsaGuard guard(isa);
          for (int kernel = 0; kernel < 3; ++kernel) {  // tile, gemm, gemm on AMX
            const bool gemm = kernel > 0, amx = kernel == 2;
            if (amx && AmxSettings(isa).size() < 2) continue;
            Int8ActGemmGuard threshold(gemm ? 1 : int64_t{1} << 40);
            AmxGuard amx_guard(amx);
            for (int threads : {1, 3}) {
              ThreadPool pool(threads);
              std::vector<float> y(m * shape.rows);
              ASSERT_TRUE(Matmul({x.data(), &weight.packed, bias.data(), y.data(), m,
                                  Precision::kInt8},
                                 pool)
                              .ok());
              const std::string name = std::string(IsaName(isa)) +
                                       (amx    ? " amx"
                                        : gemm ? " gemm"
                                               : " tile") +
                                       " threads " + std::to_string(threads);
              if (first.empty()) {
                first = y;
                first_name = name;
                continue;
              }
              for (int64_t i = 0; i < m * shape.rows; ++i) {
                ASSERT_EQ(y[i], first[i])
                    << WeightFormatName(format) << " n=" << shape.rows << " m=" << m << " at " << i
                    << ": " << name << " against " << first_name;
              }
            }
          }
        }
      }
    }
  }
}

// NL4 runs the INT8 kernels over its row blocks widened as it goes: the same bits as the same
// blocks packed as INT8, on every ISA, activation precision, kernel (tiles and both GEMMs
// forced on or left at their thresholds), batch and thread count, with partial row blocks
// and rows wide enough (2,880 and 4,096 columns) that a thread widens two blocks at a time.
TEST(MatmulTest, Nl4GivesTheBitsOfItsInt8Form) {
  uint32_t seed = 2100;
  for (Shape shape : {Shape{40, 128}, Shape{1000, 768}, Shape{300, 2880}, Shape{33, 4096}}) {
    ++seed;
    const TestWeight nl4 = MakeTestWeight(WeightFormat::kNl4, 32, shape, seed);
    const TestWeight int8 = MakeTestWeight(WeightFormat::kNl4, 32, shape, seed, /*as_int8=*/true);
    ASSERT_LT(nl4.packed.bytes(), int8.packed.bytes() * 6 / 10);
    for (MatmulIsaChoice isa : AvailableIsas()) {
      IsaGuard isa_guard(isa);
      for (Precision precision : {Precision::kF32, Precision::kInt8}) {
        for (int64_t m : {1, 3, 17, 64}) {
          if (isa == MatmulIsaChoice::kScalar && m > 3) continue;
          const std::vector<float> x = RandomActivations(m, shape.cols, ++seed);
          const int threads = 1 + static_cast<int>(m % 3);
          for (bool gemm : {false, true}) {
            F32ActGemmGuard f32_gemm(gemm ? 1 : 0);
            Int8ActGemmGuard int8_gemm(gemm ? 1 : 0);
            ThreadPool pool(threads);
            std::vector<float> want(m * shape.rows), got(m * shape.rows);
            ASSERT_TRUE(
                Matmul({x.data(), &int8.packed, nullptr, want.data(), m, precision}, pool).ok());
            ASSERT_TRUE(
                Matmul({x.data(), &nl4.packed, nullptr, got.data(), m, precision}, pool).ok());
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << IsaName(isa) << " n=" << shape.rows << " k=" << shape.cols << " m=" << m
                << (precision == Precision::kInt8 ? " int8" : " f32") << (gemm ? " gemm" : "");
          }
        }
      }
    }
  }
}

// Batch invariance: a token's output is the same bits whether it runs alone or with
// others, on any thread count (seeded sampling must not depend on the batch), on every
// ISA the CPU (and LOOM_CPU_ISA) allows.
TEST(MatmulTest, EachTokensResultIsIndependentOfTheBatch) {
  for (MatmulIsaChoice isa : AvailableIsas()) {
    IsaGuard isa_guard(isa);
    for (WeightFormat format : {WeightFormat::kInt8, WeightFormat::kInt4, WeightFormat::kInt5,
                                WeightFormat::kNl4, WeightFormat::kF16, WeightFormat::kBf16}) {
      const bool integer = format != WeightFormat::kF16 && format != WeightFormat::kBf16;
      const TestWeight weight = MakeTestWeight(format, integer ? 32 : 0, {200, 576}, 21);
      // 21: an AMX tile of 16 tokens and 5 on AVX-512 where the CPU has AMX; the subsets of
      // 17 start at other tokens, so a token changes tile position and kernel.
      const int64_t m = 21;
      const std::vector<float> x = RandomActivations(m, 576, 22);
      std::vector<float> batched(m * 200);
      ThreadPool pool2(2), pool3(3);
      for (Precision precision : {Precision::kF32, Precision::kInt8}) {
        if (precision == Precision::kInt8 && !integer) continue;
        ASSERT_TRUE(
            Matmul({x.data(), &weight.packed, nullptr, batched.data(), m, precision}, pool2)
                .ok());
        for (int64_t t = 0; t < m; ++t) {
          for (int64_t subset : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{17}}) {
            if (t + subset > m) continue;
            if (subset == 17 && t % 2 == 1) continue;  // starts 0, 2, 4 suffice
            std::vector<float> alone(subset * 200);
            ThreadPool& pool = subset == 2 ? pool3 : pool2;
            ASSERT_TRUE(Matmul({x.data() + t * 576, &weight.packed, nullptr, alone.data(),
                                subset, precision},
                               pool)
                            .ok());
            for (int64_t i = 0; i < subset * 200; ++i) {
              ASSERT_EQ(alone[i], batched[t * 200 + i])
                  << IsaName(isa) << " " << WeightFormatName(format) << " token " << t << " row "
                  << i << " batch " << subset << " activations "
                  << ActivationPrecisionName(precision);
            }
          }
        }
      }
    }
  }
}

// BF16 weights run the float kernels' sums in their order: the same bits as an F32 weight
// holding the same values, on every ISA, for GEMV and GEMM tiles, odd and even widths.
TEST(MatmulTest, Bf16WeightsGiveTheBitsOfF32WeightsWithTheSameValues) {
  for (int64_t k : {77, 96, 576}) {
    std::vector<float> values = RandomWeights(40, k, 31);
    for (float& v : values) v = RoundToBf16(v);
    absl::StatusOr<PackedWeight> f32 = PackFromF32(values.data(), 40, k, WeightFormat::kF32, 0);
    absl::StatusOr<PackedWeight> bf16 = PackFromF32(values.data(), 40, k, WeightFormat::kBf16, 0);
    ASSERT_TRUE(f32.ok() && bf16.ok());
    for (MatmulIsaChoice isa : AvailableIsas()) {
      IsaGuard guard(isa);
      ThreadPool pool(2);
      for (int64_t m : {1, 3, 9}) {
        const std::vector<float> x = RandomActivations(m, k, 32 + m);
        std::vector<float> want(m * 40), got(m * 40);
        ASSERT_TRUE(Matmul({x.data(), &*f32, nullptr, want.data(), m}, pool).ok());
        ASSERT_TRUE(Matmul({x.data(), &*bf16, nullptr, got.data(), m}, pool).ok());
        for (int64_t i = 0; i < m * 40; ++i) {
          ASSERT_EQ(got[i], want[i]) << IsaName(isa) << " k " << k << " m " << m << " output " << i;
        }
      }
    }
  }
}

TEST(MatmulTest, LmHeadShapeMatchesReferenceOnEveryIsa) {
  uint32_t seed = 7;
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kF16, WeightFormat::kBf16,
                              WeightFormat::kInt8, WeightFormat::kInt4}) {
    const bool integer = format == WeightFormat::kInt8 || format == WeightFormat::kInt4;
    const TestWeight weight = MakeTestWeight(format, integer ? 32 : 0, {49152, 576}, ++seed);
    for (MatmulIsaChoice isa : AvailableIsas()) {
      const int64_t m = isa == MatmulIsaChoice::kScalar ? 1 : 3;
      CheckMatmul(isa, weight, Precision::kF32, m, false, 2, ++seed);
      if (integer) CheckMatmul(isa, weight, Precision::kInt8, m, false, 2, ++seed);
    }
  }
}

TEST(MatmulTest, OneThreadAndThreeThreadsAgreeWithReference) {
  const TestWeight int4 = MakeTestWeight(WeightFormat::kInt4, 32, {200, 320}, 3);
  const TestWeight f32 = MakeTestWeight(WeightFormat::kF32, 0, {200, 321}, 4);
  for (int threads : {1, 3}) {
    CheckMatmul(MatmulIsaChoice::kAuto, int4, Precision::kF32, 5, true, threads, 5);
    CheckMatmul(MatmulIsaChoice::kAuto, int4, Precision::kInt8, 5, true, threads, 5);
    CheckMatmul(MatmulIsaChoice::kAuto, f32, Precision::kF32, 5, true, threads, 6);
  }
}

// Float activations are the default, and they matter: with an outlier channel the int8
// path misses the float tolerance that the default meets.
TEST(MatmulTest, DefaultsToExactFloatActivations) {
  EXPECT_EQ(MatmulParams{}.activations, Precision::kF32);
  const TestWeight weight = MakeTestWeight(WeightFormat::kInt4, 32, {64, 576}, 11);
  const int64_t n = 64, k = 576;
  const std::vector<float> x = RandomActivations(1, k, 12);
  std::vector<float> reference(n), fast(n), int8(n);
  ASSERT_TRUE(MatmulReference({x.data(), &weight.packed, nullptr, reference.data(), 1}).ok());
  ThreadPool pool(1);
  ASSERT_TRUE(Matmul({x.data(), &weight.packed, nullptr, fast.data(), 1}, pool).ok());
  ASSERT_TRUE(
      Matmul({x.data(), &weight.packed, nullptr, int8.data(), 1, Precision::kInt8}, pool).ok());
  int int8_misses = 0;
  for (int64_t j = 0; j < n; ++j) {
    double magnitude = 0.0;
    for (int64_t c = 0; c < k; ++c) magnitude += std::fabs(weight.values[j * k + c] * x[c]);
    const double tolerance = kFloatTol * magnitude + 1e-6;
    EXPECT_NEAR(fast[j], reference[j], tolerance) << j;
    if (std::fabs(int8[j] - reference[j]) > tolerance) ++int8_misses;
  }
  EXPECT_GT(int8_misses, 0) << "the int8 path should not meet the float tolerance";
}

TEST(MatmulTest, RejectsInconsistentParams) {
  ThreadPool pool(1);
  const std::vector<float> values = RandomWeights(16, 64, 1);
  absl::StatusOr<PackedWeight> w = PackFromF32(values.data(), 16, 64, WeightFormat::kInt4, 32);
  ASSERT_TRUE(w.ok());
  std::vector<float> x(64, 1.0f), y(16);
  EXPECT_EQ(Matmul({nullptr, &*w, nullptr, y.data(), 1}, pool).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Matmul({x.data(), &*w, nullptr, y.data(), 0}, pool).code(),
            absl::StatusCode::kInvalidArgument);
  PackedWeight broken = *w;
  broken.data.resize(broken.data.size() - 1);
  EXPECT_EQ(Matmul({x.data(), &broken, nullptr, y.data(), 1}, pool).code(),
            absl::StatusCode::kInvalidArgument);
  broken = *w;
  broken.group_size = 48;
  EXPECT_EQ(Matmul({x.data(), &broken, nullptr, y.data(), 1}, pool).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Matmul({x.data(), &*w, nullptr, y.data(), 1, static_cast<Precision>(7)}, pool).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MatmulTest, SimdActivationQuantizationIsBitIdenticalToScalar) {
  if (!internal::IsaSupported(MatmulIsaChoice::kAvx512)) GTEST_SKIP() << "no AVX-512 here";
  const int64_t m = 5, k = 4096;
  std::vector<float> x = RandomActivations(m, k, 77);
  for (int64_t i = 0; i < 32; ++i) x[i] = 0.0f;                  // an all-zero group
  for (int64_t i = 32; i < 64; ++i) x[i] = (i % 5 - 2) * 63.5f;  // exact .5 ties
  std::vector<int8_t> q1(m * k), q2(m * k);
  std::vector<float> s1(m * k / 32), s2(m * k / 32);
  std::vector<int32_t> z1(m * k / 32), z2(m * k / 32);
  internal::QuantizeActivationRows(x.data(), m, k, q1.data(), s1.data(), z1.data());
  internal::QuantizeActivationRowsAvx512(x.data(), m, k, q2.data(), s2.data(), z2.data());
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(z1, z2);
  for (int64_t i = 0; i < m * k; ++i) {
    ASSERT_NEAR(s1[i / 32] * q1[i], x[i], s1[i / 32] * 0.5f * 1.0001f) << i;
  }
}

TEST(MatmulTest, ReportsTheIsaItUses) {
  const std::string isa = MatmulIsa();
  EXPECT_TRUE(isa == "avx512-vnni+amx" || isa == "avx512-vnni" || isa == "avx2" || isa == "scalar")
      << isa;
  IsaGuard guard(MatmulIsaChoice::kScalar);
  EXPECT_EQ(std::string(MatmulIsa()), "scalar");
}

}  // namespace
}  // namespace loom::kernels::cpu
