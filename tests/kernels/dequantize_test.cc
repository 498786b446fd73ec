#include "kernels/dequantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cuda_device.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace loom::kernels {
namespace {

using common::GgmlType;

// Random GGUF blocks with finite F16 scales: payload bytes are uniformly random.
std::vector<uint8_t> RandomBlocks(GgmlType type, int64_t num_elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto put_half = [&](uint8_t* p) {
    const uint16_t h = cpu::FloatToHalf(scale(rng));
    std::memcpy(p, &h, 2);
  };
  if (type == GgmlType::kF16) {
    std::vector<uint8_t> out(num_elements * 2);
    for (int64_t i = 0; i < num_elements; ++i) put_half(&out[2 * i]);
    return out;
  }
  const int64_t block_bytes = type == GgmlType::kQ8_0 ? 34 : type == GgmlType::kQ4_0 ? 18 : 20;
  const int header = type == GgmlType::kQ4_1 ? 4 : 2;
  std::vector<uint8_t> out((num_elements / 32) * block_bytes);
  for (size_t b = 0; b < out.size(); b += block_bytes) {
    put_half(&out[b]);
    if (header == 4) put_half(&out[b + 2]);
    for (int64_t j = header; j < block_bytes; ++j) out[b + j] = static_cast<uint8_t>(byte(rng));
  }
  return out;
}

TEST(FloatToHalfTest, RoundsToNearestEvenLikeCuda) {
  EXPECT_EQ(cpu::FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(cpu::FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(cpu::FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(cpu::FloatToHalf(65520.0f), 0x7c00);  // halfway to the next: rounds to Inf
  EXPECT_EQ(cpu::FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(cpu::FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie rounds to even 0
  EXPECT_EQ(cpu::FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even 2
  EXPECT_EQ(cpu::FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(cpu::FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie to even (up)
  EXPECT_EQ(cpu::FloatToHalf(std::nanf("")) & 0x7c00, 0x7c00);
  EXPECT_NE(cpu::FloatToHalf(std::nanf("")) & 0x03ff, 0);
}

TEST(DequantizeTest, RejectsUnsupportedTypeAndRaggedSizesBeforeLaunch) {
  float out[64];
  uint8_t in[256] = {};
  DequantizeParams params{in, out, 64, GgmlType::kQ4_K, DequantOutputType::kF32};
  absl::Status status = CheckDequantizeParams(params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("Q4_K"), std::string::npos) << status;

  params.src_type = GgmlType::kQ4_1;
  params.num_elements = 48;
  status = CheckDequantizeParams(params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("48"), std::string::npos) << status;
  EXPECT_FALSE(LaunchDequantize(params, nullptr).ok());
}

TEST(DequantizeTest, ReferenceF16IsRoundedF32) {
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    const int64_t n = 32 * 37;
    std::vector<uint8_t> blocks = RandomBlocks(type, n, 7);
    std::vector<float> f32(n);
    std::vector<uint16_t> f16(n);
    ASSERT_TRUE(DequantizeReference({blocks.data(), f32.data(), n, type, DequantOutputType::kF32}).ok());
    ASSERT_TRUE(DequantizeReference({blocks.data(), f16.data(), n, type, DequantOutputType::kF16}).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_FALSE(std::isnan(f32[i])) << i;
      ASSERT_EQ(f16[i], cpu::FloatToHalf(f32[i])) << i;
    }
  }
}

TEST(DequantizeCudaTest, MatchesReferenceBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << CudaDeviceDescription(0);
#if LOOM_HAVE_CUDA
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    for (int64_t n : {32, 32 * 5, 32 * 4099, 32 * 70000}) {
      for (DequantOutputType out_type : {DequantOutputType::kF32, DequantOutputType::kF16}) {
        SCOPED_TRACE(testing::Message() << common::RawGgmlTypeName(static_cast<uint32_t>(type))
                                        << " n=" << n << " f16=" << (out_type == DequantOutputType::kF16));
        const size_t out_bytes = n * (out_type == DequantOutputType::kF16 ? 2 : 4);
        std::vector<uint8_t> blocks = RandomBlocks(type, n, static_cast<uint32_t>(n));
        std::vector<uint8_t> expected(out_bytes), actual(out_bytes);
        ASSERT_TRUE(DequantizeReference({blocks.data(), expected.data(), n, type, out_type}).ok());
        void* d_src = nullptr;
        void* d_dst = nullptr;
        ASSERT_EQ(cudaMalloc(&d_src, blocks.size()), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&d_dst, out_bytes), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d_src, blocks.data(), blocks.size(), cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_TRUE(LaunchDequantize({d_src, d_dst, n, type, out_type}, nullptr).ok());
        ASSERT_EQ(cudaMemcpy(actual.data(), d_dst, out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(d_src);
        cudaFree(d_dst);
        ASSERT_EQ(std::memcmp(expected.data(), actual.data(), out_bytes), 0);
      }
    }
  }
#endif
}

}  // namespace
}  // namespace loom::kernels
