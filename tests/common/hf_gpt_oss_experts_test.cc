#include "common/formats/hf_gpt_oss_experts.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

// A layer of gpt-oss experts (E experts, hidden = 32 * hidden_blocks, ffn = 32) in
// transformers' layout, with every nibble and exponent distinct enough to trace: element k
// of row r of expert e has nibble (e + r + k) % 16, block g's exponent 120 + e + r + g.
struct Checkpoint {
  uint64_t experts = 2, hidden = 64, ffn = 32;
  std::vector<uint8_t> gate_up_blocks, gate_up_scales, down_blocks, down_scales;
  std::vector<float> gate_up_bias, down_bias;

  Checkpoint() {
    Fill(2 * ffn, hidden, gate_up_blocks, gate_up_scales);
    Fill(hidden, ffn, down_blocks, down_scales);
    for (uint64_t i = 0; i < experts * 2 * ffn; ++i) gate_up_bias.push_back(0.5f * i);
    for (uint64_t i = 0; i < experts * hidden; ++i) down_bias.push_back(-0.25f * i);
  }
  static uint8_t Nibble(uint64_t e, uint64_t r, uint64_t k) { return (e + r + k) % 16; }
  void Fill(uint64_t rows, uint64_t cols, std::vector<uint8_t>& blocks,
            std::vector<uint8_t>& scales) const {
    for (uint64_t e = 0; e < experts; ++e) {
      for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t g = 0; g < cols / 32; ++g) {
          scales.push_back(static_cast<uint8_t>(120 + e + r + g));
          for (uint64_t i = 0; i < 16; ++i) {
            const uint64_t k = g * 32 + 2 * i;
            blocks.push_back(static_cast<uint8_t>(Nibble(e, r, k) | Nibble(e, r, k + 1) << 4));
          }
        }
      }
    }
  }
  GptOssExpertParts Parts() const {
    auto bytes = [](const auto& v) {
      return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                       v.size() * sizeof(v[0]));
    };
    return {
        {"gate_up_proj_blocks",
         {bytes(gate_up_blocks), {experts, 2 * ffn, hidden / 32, 16}, GgmlType::kI8}},
        {"gate_up_proj_scales",
         {bytes(gate_up_scales), {experts, 2 * ffn, hidden / 32}, GgmlType::kI8}},
        {"gate_up_proj_bias", {bytes(gate_up_bias), {experts, 2 * ffn}, GgmlType::kF32}},
        {"down_proj_blocks", {bytes(down_blocks), {experts, hidden, ffn / 32, 16}, GgmlType::kI8}},
        {"down_proj_scales", {bytes(down_scales), {experts, hidden, ffn / 32}, GgmlType::kI8}},
        {"down_proj_bias", {bytes(down_bias), {experts, hidden}, GgmlType::kF32}}};
  }
};

const OwnedTensor* Find(const std::vector<OwnedTensor>& tensors, const std::string& name) {
  for (const OwnedTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// Element [r, c] of matrix e of the F32 stack `name` ({cols, rows, E} in ggml order).
float StackedValue(const std::vector<OwnedTensor>& tensors, const std::string& name, uint64_t e,
                   uint64_t r, uint64_t c) {
  const OwnedTensor* t = Find(tensors, name);
  const uint64_t cols = t->shape[0], rows = t->shape[1];
  return reinterpret_cast<const float*>(t->bytes.data())[(e * rows + r) * cols + c];
}

// Every value survives: the GGUF tensors dequantize to what the checkpoint's nibbles and
// exponents say, gate rows from the even rows of gate_up_proj, up rows from the odd ones.
TEST(HfGptOssExpertsTest, RepacksEveryValueAndDeinterleavesGateAndUp) {
  const Checkpoint c;
  absl::StatusOr<std::vector<OwnedTensor>> converted = ConvertGptOssExperts(3, c.Parts());
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_EQ(converted->size(), 6u);
  for (const auto& [name, first, stride, rows, cols] :
       std::vector<std::tuple<std::string, uint64_t, uint64_t, uint64_t, uint64_t>>{
           {"blk.3.ffn_gate_exps.weight", 0, 2, c.ffn, c.hidden},
           {"blk.3.ffn_up_exps.weight", 1, 2, c.ffn, c.hidden},
           {"blk.3.ffn_down_exps.weight", 0, 1, c.hidden, c.ffn}}) {
    const OwnedTensor* tensor = Find(*converted, name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(tensor->type, GgmlType::kMXFP4);
    EXPECT_EQ(tensor->shape, (std::vector<uint64_t>{cols, rows, c.experts}));
    std::vector<float> values(c.experts * rows * cols);
    ASSERT_TRUE(
        DequantizeToF32(GgmlType::kMXFP4, tensor->bytes.data(), values.size(), values.data()).ok());
    for (uint64_t e = 0; e < c.experts; ++e) {
      for (uint64_t r = 0; r < rows; ++r) {
        const uint64_t stored = first + r * stride;
        for (uint64_t k = 0; k < cols; ++k) {
          const float want = kMxfp4Values[Checkpoint::Nibble(e, stored, k)] *
                             Mxfp4Scale(static_cast<uint8_t>(120 + e + stored + k / 32));
          ASSERT_EQ(values[(e * rows + r) * cols + k], want)
              << name << " " << e << " " << r << " " << k;
        }
      }
    }
  }
  const OwnedTensor* up_bias = Find(*converted, "blk.3.ffn_up_exps.bias");
  ASSERT_NE(up_bias, nullptr);
  EXPECT_EQ(up_bias->shape, (std::vector<uint64_t>{c.ffn, c.experts}));
  const auto* up = reinterpret_cast<const float*>(up_bias->bytes.data());
  EXPECT_EQ(up[0], c.gate_up_bias[1]);
  EXPECT_EQ(up[c.ffn + 2], c.gate_up_bias[2 * c.ffn + 5]);  // expert 1, channel 2
  const OwnedTensor* down_bias = Find(*converted, "blk.3.ffn_down_exps.bias");
  ASSERT_NE(down_bias, nullptr);
  EXPECT_EQ(reinterpret_cast<const float*>(down_bias->bytes.data())[c.hidden + 7],
            c.down_bias[c.hidden + 7]);
}

// Fine-tunes saved dequantized: gate_up_proj [E, hidden, 2 * ffn] and down_proj [E, ffn,
// hidden] (input-major, gate and up interleaved by columns) become [E, rows, cols] stacks of
// the stored type, transposed and de-interleaved, every value as stored.
TEST(HfGptOssExpertsTest, TransposesTheDequantizedLayout) {
  const uint64_t experts = 2, hidden = 3, ffn = 2;
  std::vector<float> gate_up(experts * hidden * 2 * ffn), down(experts * ffn * hidden);
  for (size_t i = 0; i < gate_up.size(); ++i) gate_up[i] = static_cast<float>(i);
  for (size_t i = 0; i < down.size(); ++i) down[i] = 1000.0f + static_cast<float>(i);
  const std::vector<float> gate_up_bias(experts * 2 * ffn, 0.5f), down_bias(experts * hidden, 2.0f);
  auto bytes = [](const std::vector<float>& v) {
    return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4);
  };
  const GptOssExpertParts parts = {
      {"gate_up_proj", {bytes(gate_up), {experts, hidden, 2 * ffn}, GgmlType::kF32}},
      {"gate_up_proj_bias", {bytes(gate_up_bias), {experts, 2 * ffn}, GgmlType::kF32}},
      {"down_proj", {bytes(down), {experts, ffn, hidden}, GgmlType::kF32}},
      {"down_proj_bias", {bytes(down_bias), {experts, hidden}, GgmlType::kF32}}};
  absl::StatusOr<std::vector<OwnedTensor>> converted = ConvertGptOssExperts(1, parts);
  ASSERT_TRUE(converted.ok()) << converted.status();
  auto at = [&](const std::string& name, uint64_t e, uint64_t r, uint64_t c) {
    return StackedValue(*converted, name, e, r, c);
  };
  ASSERT_EQ(Find(*converted, "blk.1.ffn_gate_exps.weight")->shape,
            (std::vector<uint64_t>{hidden, ffn, experts}));
  ASSERT_EQ(Find(*converted, "blk.1.ffn_down_exps.weight")->shape,
            (std::vector<uint64_t>{ffn, hidden, experts}));
  for (uint64_t e = 0; e < experts; ++e) {
    for (uint64_t r = 0; r < ffn; ++r) {
      for (uint64_t c = 0; c < hidden; ++c) {
        EXPECT_EQ(at("blk.1.ffn_gate_exps.weight", e, r, c),
                  gate_up[(e * hidden + c) * 2 * ffn + 2 * r]);
        EXPECT_EQ(at("blk.1.ffn_up_exps.weight", e, r, c),
                  gate_up[(e * hidden + c) * 2 * ffn + 2 * r + 1]);
        EXPECT_EQ(at("blk.1.ffn_down_exps.weight", e, c, r), down[(e * ffn + r) * hidden + c]);
      }
    }
  }
  EXPECT_NE(Find(*converted, "blk.1.ffn_down_exps.bias"), nullptr);
  GptOssExpertParts bad = parts;
  bad["down_proj"].shape = {experts, hidden, ffn};
  EXPECT_EQ(ConvertGptOssExperts(1, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Qwen3-VL-MoE's fused experts: the gate's columns of gate_up_proj first, then up's; no
// biases; another part refused.
TEST(HfGptOssExpertsTest, SplitsConcatenatedGateAndUpColumns) {
  const uint64_t experts = 2, hidden = 3, ffn = 2;
  std::vector<float> gate_up(experts * hidden * 2 * ffn), down(experts * ffn * hidden);
  for (size_t i = 0; i < gate_up.size(); ++i) gate_up[i] = static_cast<float>(i);
  for (size_t i = 0; i < down.size(); ++i) down[i] = 1000.0f + static_cast<float>(i);
  auto bytes = [](const std::vector<float>& v) {
    return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4);
  };
  GptOssExpertParts parts = {
      {"gate_up_proj", {bytes(gate_up), {experts, hidden, 2 * ffn}, GgmlType::kF32}},
      {"down_proj", {bytes(down), {experts, ffn, hidden}, GgmlType::kF32}}};
  absl::StatusOr<std::vector<OwnedTensor>> converted = ConvertConcatenatedExperts(4, parts);
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_EQ(converted->size(), 3u);  // no biases
  auto at = [&](const std::string& name, uint64_t e, uint64_t r, uint64_t c) {
    return StackedValue(*converted, name, e, r, c);
  };
  ASSERT_EQ(Find(*converted, "blk.4.ffn_up_exps.weight")->shape,
            (std::vector<uint64_t>{hidden, ffn, experts}));
  for (uint64_t e = 0; e < experts; ++e) {
    for (uint64_t r = 0; r < ffn; ++r) {
      for (uint64_t c = 0; c < hidden; ++c) {
        EXPECT_EQ(at("blk.4.ffn_gate_exps.weight", e, r, c),
                  gate_up[(e * hidden + c) * 2 * ffn + r]);
        EXPECT_EQ(at("blk.4.ffn_up_exps.weight", e, r, c),
                  gate_up[(e * hidden + c) * 2 * ffn + ffn + r]);
        EXPECT_EQ(at("blk.4.ffn_down_exps.weight", e, c, r), down[(e * ffn + r) * hidden + c]);
      }
    }
  }
  parts["gate_up_proj_bias"] = parts["down_proj"];
  EXPECT_THAT(std::string(ConvertConcatenatedExperts(4, parts).status().message()),
              HasSubstr("gate_up_proj_bias"));
}

TEST(HfGptOssExpertsTest, SlicesGraniteMoeGateAndUpRows) {
  const uint64_t experts = 2, hidden = 3, ffn = 2, shared = 4;
  std::vector<float> input(experts * 2 * ffn * hidden), output(experts * hidden * ffn),
      shared_input(2 * shared * hidden);
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>(i);
  for (size_t i = 0; i < output.size(); ++i) output[i] = 1000.0f + static_cast<float>(i);
  for (size_t i = 0; i < shared_input.size(); ++i) shared_input[i] = -1.0f - static_cast<float>(i);
  auto bytes = [](const std::vector<float>& v) {
    return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4);
  };
  GptOssExpertParts parts = {{"block_sparse_moe.input_linear.weight",
                              {bytes(input), {experts, 2 * ffn, hidden}, GgmlType::kF32}},
                             {"block_sparse_moe.output_linear.weight",
                              {bytes(output), {experts, hidden, ffn}, GgmlType::kF32}},
                             {"shared_mlp.input_linear.weight",
                              {bytes(shared_input), {2 * shared, hidden}, GgmlType::kF32}}};
  absl::StatusOr<std::vector<OwnedTensor>> converted = ConvertGraniteMoeExperts(3, parts);
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_EQ(converted->size(), 5u);
  ASSERT_EQ(Find(*converted, "blk.3.ffn_down_exps.weight")->shape,
            (std::vector<uint64_t>{ffn, hidden, experts}));
  ASSERT_EQ(Find(*converted, "blk.3.ffn_up_shexp.weight")->shape,
            (std::vector<uint64_t>{hidden, shared}));
  auto at = [&](const std::string& name, uint64_t e, uint64_t r, uint64_t c) {
    return StackedValue(*converted, name, e, r, c);
  };
  for (uint64_t e = 0; e < experts; ++e) {
    for (uint64_t r = 0; r < ffn; ++r) {
      for (uint64_t c = 0; c < hidden; ++c) {
        EXPECT_EQ(at("blk.3.ffn_gate_exps.weight", e, r, c), input[(e * 2 * ffn + r) * hidden + c]);
        EXPECT_EQ(at("blk.3.ffn_up_exps.weight", e, r, c),
                  input[(e * 2 * ffn + ffn + r) * hidden + c]);
        EXPECT_EQ(at("blk.3.ffn_down_exps.weight", e, c, r), output[(e * hidden + c) * ffn + r]);
      }
    }
  }
  for (uint64_t r = 0; r < shared; ++r) {
    for (uint64_t c = 0; c < hidden; ++c) {
      EXPECT_EQ(at("blk.3.ffn_gate_shexp.weight", 0, r, c), shared_input[r * hidden + c]);
      EXPECT_EQ(at("blk.3.ffn_up_shexp.weight", 0, r, c), shared_input[(shared + r) * hidden + c]);
    }
  }
  // Refused by name: a missing half, shapes that disagree, a stranger.
  GptOssExpertParts missing = parts;
  missing.erase("block_sparse_moe.output_linear.weight");
  EXPECT_THAT(std::string(ConvertGraniteMoeExperts(3, missing).status().message()),
              HasSubstr("model.layers.3.block_sparse_moe.output_linear.weight"));
  GptOssExpertParts bad = parts;
  bad["block_sparse_moe.output_linear.weight"].shape = {experts, ffn, hidden};
  EXPECT_THAT(std::string(ConvertGraniteMoeExperts(3, bad).status().message()),
              HasSubstr("output_linear.weight has shape [2, 2, 3], expected [2, 3, 2]"));
  GptOssExpertParts odd = parts;
  odd["shared_mlp.input_linear.weight"].shape = {7, hidden};
  EXPECT_EQ(ConvertGraniteMoeExperts(3, odd).status().code(), absl::StatusCode::kInvalidArgument);
  GptOssExpertParts unknown = parts;
  unknown["gate_up_proj"] = parts["block_sparse_moe.input_linear.weight"];
  EXPECT_EQ(ConvertGraniteMoeExperts(3, unknown).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HfGptOssExpertsTest, RefusesMissingPartsBadShapesAndMixedLayouts) {
  const Checkpoint c;
  GptOssExpertParts missing = c.Parts();
  missing.erase("down_proj_scales");
  absl::StatusOr<std::vector<OwnedTensor>> result = ConvertGptOssExperts(0, missing);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("down_proj_scales"));

  GptOssExpertParts bad = c.Parts();
  bad["gate_up_proj_bias"].shape = {c.experts, c.ffn};
  result = ConvertGptOssExperts(0, bad);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("gate_up_proj_bias"));

  // One layout or the other, not both.
  GptOssExpertParts mixed = c.Parts();
  mixed["gate_up_proj"] = mixed["gate_up_proj_bias"];
  EXPECT_EQ(ConvertGptOssExperts(0, mixed).status().code(), absl::StatusCode::kInvalidArgument);

  GptOssExpertParts unknown = c.Parts();
  unknown["gate_proj_blocks"] = unknown["down_proj_blocks"];
  EXPECT_EQ(ConvertGptOssExperts(0, unknown).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::common
