#include "common/formats/hf_quantization.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<HfQuantization> Parse(const std::string& text) {
  return ParseHfQuantization(nlohmann::json::parse(text));
}

TEST(HfQuantizationTest, ParsesAwqAndGptqConfigs) {
  EXPECT_EQ(Parse("{}")->method, HfQuantization::Method::kNone);
  EXPECT_EQ(Parse(R"({"quantization_config": null})")->method, HfQuantization::Method::kNone);
  absl::StatusOr<HfQuantization> awq = Parse(
      R"({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
          "zero_point": true, "version": "GEMM"}})");
  ASSERT_TRUE(awq.ok()) << awq.status();
  EXPECT_EQ(awq->method, HfQuantization::Method::kAwq);
  EXPECT_EQ(awq->group_size, 128);
  absl::StatusOr<HfQuantization> gptq = Parse(
      R"({"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": -1,
          "desc_act": true, "sym": true}})");
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  EXPECT_EQ(gptq->bits, 8);
  EXPECT_TRUE(gptq->desc_act);
  EXPECT_TRUE(gptq->zeros_plus_one);  // checkpoint_format "gptq" (v1) by default
  EXPECT_FALSE(Parse(R"({"quantization_config": {"quant_method": "gptq",
                         "checkpoint_format": "gptq_v2"}})")
                   ->zeros_plus_one);
}

// FP8's block size: the `fp8` method's weight_block_size (DeepSeek-V3, Qwen3-FP8) and
// compressed-tensors' block_structure; none for per-tensor and per-channel scales; refused
// when it is not two positive integers.
TEST(HfQuantizationTest, ReadsTheFp8BlockSize) {
  absl::StatusOr<HfQuantization> fp8 = Parse(
      R"({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
          "activation_scheme": "dynamic", "weight_block_size": [128, 64]}})");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(fp8->method, HfQuantization::Method::kFp8);
  EXPECT_EQ(fp8->fp8_block_rows, 128);
  EXPECT_EQ(fp8->fp8_block_cols, 64);
  EXPECT_EQ(Parse(R"({"quantization_config": {"quant_method": "fp8"}})")->fp8_block_rows, 0);
  absl::StatusOr<HfQuantization> block = Parse(
      R"({"quantization_config": {"quant_method": "compressed-tensors",
          "format": "float-quantized", "config_groups": {"group_0": {"weights":
          {"type": "float", "num_bits": 8, "strategy": "block",
           "block_structure": [128, 128]}}}}})");
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->fp8_block_rows, 128);
  EXPECT_EQ(block->fp8_block_cols, 128);
  for (const char* bad : {"[128]", "[0, 128]", "[128, \"x\"]", "128"}) {
    absl::StatusOr<HfQuantization> parsed = Parse(absl::StrCat(
        R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": )", bad, "}}"));
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("weight_block_size")) << bad;
  }
}

TEST(HfQuantizationTest, RefusesWhatItDoesNotServeByName) {
  for (const auto& [config, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"quant_method": "bitsandbytes"})", "'bitsandbytes'"},
           {R"({"quant_method": "awq", "version": "gemv"})", "'gemv'"},
           {R"({"quant_method": "awq", "bits": 8})", "8 bits"},
           {R"({"quant_method": "awq", "zero_point": false})", "zero points"},
           {R"({"quant_method": "gptq", "bits": 3})", "3 bits"},
           {R"({"quant_method": "gptq", "checkpoint_format": "marlin"})", "'marlin'"}}) {
    absl::StatusOr<HfQuantization> parsed = Parse(R"({"quantization_config": )" + config + "}");
    ASSERT_FALSE(parsed.ok()) << config;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnimplemented) << config;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(needle)) << config;
  }
}

// Little-endian bytes of `values`.
template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// One AWQ word per (input row, 8 output columns): nibble k holds output column kOrder[k].
TEST(HfQuantizationTest, AwqNibblesLandInTheirOutputColumns) {
  const int64_t in = 32, out = 8;
  std::vector<uint32_t> qweight(in);  // [in, out / 8]
  for (int64_t i = 0; i < in; ++i) {
    uint32_t word = 0;
    for (uint32_t k = 0; k < 8; ++k) word |= ((k + i) & 15u) << (4 * k);
    qweight[i] = word;
  }
  const std::vector<uint32_t> qzeros = {0};         // [1, 1]: every zero point 0
  const std::vector<uint16_t> scales(out, 0x3c00);  // [1, 8]: 1.0
  const std::vector<uint8_t> qw = Bytes(qweight), qz = Bytes(qzeros), sc = Bytes(scales);
  QuantizedLinearTensors tensors{qw, qz, sc, {}, {32, 1}, {1, 1}, {1, 8}};
  HfQuantization awq{HfQuantization::Method::kAwq, 4, 32, false, false};
  absl::StatusOr<std::vector<OwnedTensor>> converted = ConvertQuantizedLinear(awq, "w", tensors);
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_EQ(converted->size(), 3u);
  const OwnedTensor& q4 = (*converted)[0];
  EXPECT_EQ(q4.name, "w.q4");
  EXPECT_EQ(q4.shape, (std::vector<uint64_t>{16, 8}));
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int k = 0; k < 8; ++k) {
    const int64_t o = order[k];
    for (int64_t i = 0; i < in; ++i) {
      const uint8_t byte = q4.bytes[(o * in + i) / 2];
      EXPECT_EQ(i % 2 == 0 ? byte & 15 : byte >> 4, (k + i) & 15) << o << "," << i;
    }
  }
}

// Symmetric 8-bit GPTQ (stored zero 127, +1 in the v1 format) packs into INT8 q - 128 with the
// scales transposed to [out][groups]; a zero point other than 128 is served as F16 values.
TEST(HfQuantizationTest, SymmetricGptq8IsInt8AndAsymmetricIsF16) {
  const int64_t in = 32, out = 4;
  std::vector<uint32_t> qweight(in / 4 * out);  // [in / 4, out]
  for (int64_t r = 0; r < in / 4; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      uint32_t word = 0;
      for (uint32_t k = 0; k < 4; ++k)
        word |= static_cast<uint32_t>(100 + o + 4 * r + k) << (8 * k);
      qweight[r * out + o] = word;
    }
  }
  const std::vector<uint32_t> qzeros = {0x7f7f7f7fu};                     // [1, 1]
  const std::vector<uint16_t> scales = {0x3c00, 0x4000, 0x3800, 0x3c00};  // 1, 2, 0.5, 1
  const std::vector<uint8_t> qw = Bytes(qweight), qz = Bytes(qzeros), sc = Bytes(scales);
  QuantizedLinearTensors tensors{qw, qz, sc, {}, {8, 4}, {1, 1}, {1, 4}};
  HfQuantization gptq{HfQuantization::Method::kGptq, 8, -1, false, true};
  absl::StatusOr<std::vector<OwnedTensor>> converted = ConvertQuantizedLinear(gptq, "w", tensors);
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_EQ(converted->size(), 2u);
  EXPECT_EQ((*converted)[0].name, "w.q8");
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      EXPECT_EQ(static_cast<int8_t>((*converted)[0].bytes[o * in + i]), 100 + o + i - 128);
    }
  }
  EXPECT_EQ((*converted)[1].bytes, sc);  // one group: [out][1] is the same bytes

  const std::vector<uint32_t> asymmetric = {0x7f7f7f70u};  // output 0's zero point is 113
  const std::vector<uint8_t> qa = Bytes(asymmetric);
  tensors.qzeros = qa;
  converted = ConvertQuantizedLinear(gptq, "w", tensors);
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_EQ(converted->size(), 1u);
  EXPECT_EQ((*converted)[0].name, "w");
  EXPECT_EQ((*converted)[0].type, GgmlType::kF16);

  tensors.qzeros_shape = {2, 1};
  EXPECT_EQ(ConvertQuantizedLinear(gptq, "w", tensors).status().code(),
            absl::StatusCode::kInvalidArgument);
}

float HalfAt(const OwnedTensor& tensor, size_t index) {
  _Float16 half;
  std::memcpy(&half, tensor.bytes.data() + index * 2, 2);
  return static_cast<float>(half);
}

// E4M3 codes times a per-tensor, per-row or per-block scale, rounded once to F16.
TEST(HfQuantizationTest, Fp8WeightsDequantizeWithEachScaleLayout) {
  // Codes: 0x38 = 1.0, 0x40 = 2.0, 0xb8 = -1.0, 0x01 = 2^-9 (smallest subnormal), 0x7e = 448.
  const std::vector<uint8_t> weight = {0x38, 0x40, 0xb8, 0x01, 0x7e, 0x38, 0x38, 0x40};  // [2, 4]
  const std::vector<float> one = {0.5f};
  const std::vector<uint8_t> tensor_scale = Bytes(one);
  Fp8LinearTensors t{weight, tensor_scale, {2, 4}, {1}, GgmlType::kF32};
  absl::StatusOr<OwnedTensor> dense = DequantizeFp8Linear("w", t);
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->type, GgmlType::kF16);
  EXPECT_EQ(dense->shape, (std::vector<uint64_t>{4, 2}));
  const float want[8] = {0.5f, 1.0f, -0.5f, 0.0009765625f, 224.0f, 0.5f, 0.5f, 1.0f};
  for (size_t k = 0; k < 8; ++k) EXPECT_EQ(HalfAt(*dense, k), want[k]) << k;

  const std::vector<float> rows = {1.0f, 4.0f};  // per output channel, [2, 1]
  const std::vector<uint8_t> row_scale = Bytes(rows);
  t.scale = row_scale;
  t.scale_shape = {2, 1};
  dense = DequantizeFp8Linear("w", t);
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(HalfAt(*dense, 1), 2.0f);
  EXPECT_EQ(HalfAt(*dense, 5), 4.0f);

  const std::vector<uint16_t> blocks = {0x3f80, 0x4000};  // BF16 1.0, 2.0: blocks of [2, 2]
  const std::vector<uint8_t> block_scale = Bytes(blocks);
  t.scale = block_scale;
  t.scale_shape = {1, 2};
  t.scale_type = GgmlType::kBF16;
  // A grid says its shape, not its block size: refused without the config's.
  EXPECT_EQ(DequantizeFp8Linear("w", t).status().code(), absl::StatusCode::kInvalidArgument);
  t.block_rows = 2;
  t.block_cols = 2;
  dense = DequantizeFp8Linear("w", t);
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(HalfAt(*dense, 0), 1.0f);
  EXPECT_EQ(HalfAt(*dense, 2), -2.0f);
  EXPECT_EQ(HalfAt(*dense, 7), 4.0f);

  // A partial last block: 3 rows in blocks of 2 are 2 grid rows, the second holding row 2
  // alone; a block of 3 rows would make one grid row, and is refused.
  const std::vector<uint8_t> weight3 = {0x38, 0x38, 0x38, 0x38, 0x38, 0x38,
                                        0x38, 0x38, 0x38, 0x38, 0x38, 0x38};  // [3, 4] of 1.0
  const std::vector<float> grid = {1.0f, 2.0f, 4.0f, 8.0f};                   // [2, 2]
  const std::vector<uint8_t> grid_scale = Bytes(grid);
  Fp8LinearTensors partial{weight3, grid_scale, {3, 4}, {2, 2}, GgmlType::kF32, 2, 2};
  dense = DequantizeFp8Linear("w", partial);
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(HalfAt(*dense, 4 + 3), 2.0f);  // row 1: still the first grid row
  EXPECT_EQ(HalfAt(*dense, 8 + 0), 4.0f);  // row 2: the second grid row
  EXPECT_EQ(HalfAt(*dense, 8 + 3), 8.0f);
  partial.block_rows = 3;  // ceil(3 / 3) = 1 grid row, not 2
  EXPECT_EQ(DequantizeFp8Linear("w", partial).status().code(), absl::StatusCode::kInvalidArgument);

  const std::vector<float> three = {1.0f, 1.0f, 1.0f};
  const std::vector<uint8_t> bad_scale = Bytes(three);
  t.scale = bad_scale;
  t.scale_shape = {3};
  t.scale_type = GgmlType::kF32;
  EXPECT_EQ(DequantizeFp8Linear("w", t).status().code(), absl::StatusCode::kInvalidArgument);
}

// The row scales beside an FP8 layer's F16 values: per tensor (every row the one scale) and per
// channel ([out] or [out, 1]) as F32 [out] named after the layer; none for a grid of blocks or a
// scale that is not positive and finite; the dequantizer's errors for a bad shape.
TEST(HfQuantizationTest, Fp8RowScalesComeWithPerTensorAndPerChannelLayers) {
  const std::vector<uint8_t> weight = {0x38, 0x40, 0xb8, 0x01, 0x7e, 0x38, 0x38, 0x40};  // [2, 4]
  auto floats = [](const OwnedTensor& t) {
    std::vector<float> out(t.bytes.size() / sizeof(float));
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
    return out;
  };
  const std::vector<float> one = {0.5f};
  const std::vector<uint8_t> tensor_scale = Bytes(one);
  Fp8LinearTensors t{weight, tensor_scale, {2, 4}, {1}, GgmlType::kF32};
  absl::StatusOr<std::optional<OwnedTensor>> rows = Fp8RowScales("blk.0.attn_q.weight", t);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_TRUE(rows->has_value());
  EXPECT_EQ((*rows)->name, "blk.0.attn_q.weight.fp8_scale");
  EXPECT_EQ((*rows)->type, GgmlType::kF32);
  EXPECT_EQ((*rows)->shape, (std::vector<uint64_t>{2}));
  EXPECT_EQ(floats(**rows), (std::vector<float>{0.5f, 0.5f}));

  const std::vector<uint16_t> bf16_rows = {0x3f80, 0x4080};  // BF16 1.0, 4.0 per channel
  const std::vector<uint8_t> row_scale = Bytes(bf16_rows);
  t.scale = row_scale;
  t.scale_type = GgmlType::kBF16;
  for (const std::vector<uint64_t>& shape : {std::vector<uint64_t>{2}, {2, 1}}) {
    t.scale_shape = shape;
    rows = Fp8RowScales("w", t);
    ASSERT_TRUE(rows.ok() && rows->has_value()) << rows.status();
    EXPECT_EQ(floats(**rows), (std::vector<float>{1.0f, 4.0f}));
  }

  const std::vector<float> grid = {1.0f, 2.0f};  // blocks of [2, 2]: no scale per row
  const std::vector<uint8_t> grid_scale = Bytes(grid);
  Fp8LinearTensors blocks{weight, grid_scale, {2, 4}, {1, 2}, GgmlType::kF32, 2, 2};
  rows = Fp8RowScales("w", blocks);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_FALSE(rows->has_value());

  const std::vector<float> zero = {0.0f};
  const std::vector<uint8_t> zero_scale = Bytes(zero);
  Fp8LinearTensors zeroed{weight, zero_scale, {2, 4}, {1}, GgmlType::kF32};
  rows = Fp8RowScales("w", zeroed);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_FALSE(rows->has_value());

  const std::vector<float> three = {1.0f, 1.0f, 1.0f};
  const std::vector<uint8_t> bad_scale = Bytes(three);
  Fp8LinearTensors bad{weight, bad_scale, {2, 4}, {3}, GgmlType::kF32};
  EXPECT_EQ(Fp8RowScales("w", bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::common
