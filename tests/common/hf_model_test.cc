#include "common/formats/hf_model.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

TEST(HfModelTest, MapsHuggingFaceTensorNamesToGgufNames) {
  EXPECT_EQ(GgufTensorName("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(GgufTensorName("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(GgufTensorName("lm_head.weight"), "output.weight");
  EXPECT_EQ(GgufTensorName("model.layers.12.self_attn.q_proj.weight"), "blk.12.attn_q.weight");
  EXPECT_EQ(GgufTensorName("model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
  EXPECT_EQ(GgufTensorName("model.layers.3.self_attn.q_norm.weight"), "blk.3.attn_q_norm.weight");
  EXPECT_EQ(GgufTensorName("model.layers.3.post_attention_layernorm.weight"),
            "blk.3.ffn_norm.weight");
  EXPECT_EQ(GgufTensorName("model.layers.7.mlp.down_proj.weight"), "blk.7.ffn_down.weight");
  EXPECT_EQ(GgufTensorName("model.layers.2.self_attn.qkv_proj.weight"), "blk.2.attn_qkv.weight");
  EXPECT_EQ(GgufTensorName("model.layers.2.mlp.gate_up_proj.weight"), "blk.2.ffn_up.weight");
  EXPECT_EQ(GgufTensorName("model.layers.x.mlp.down_proj.weight"), "");
  EXPECT_EQ(GgufTensorName("model.layers.1.mlp.experts.0.weight"), "");
  EXPECT_EQ(GgufTensorName("vision_tower.weight"), "");
}

// Mixtral's block_sparse_moe and Qwen3-MoE's mlp experts, one GGUF matrix per expert.
TEST(HfModelTest, MapsExpertTensorNames) {
  EXPECT_EQ(GgufTensorName("model.layers.2.block_sparse_moe.gate.weight"),
            "blk.2.ffn_gate_inp.weight");
  EXPECT_EQ(GgufTensorName("model.layers.2.block_sparse_moe.experts.7.w1.weight"),
            "blk.2.ffn_gate.7.weight");
  EXPECT_EQ(GgufTensorName("model.layers.2.block_sparse_moe.experts.7.w3.weight"),
            "blk.2.ffn_up.7.weight");
  EXPECT_EQ(GgufTensorName("model.layers.2.block_sparse_moe.experts.7.w2.weight"),
            "blk.2.ffn_down.7.weight");
  EXPECT_EQ(GgufTensorName("model.layers.0.mlp.gate.weight"), "blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(GgufTensorName("model.layers.0.mlp.experts.127.gate_proj.weight"),
            "blk.0.ffn_gate.127.weight");
  EXPECT_EQ(GgufTensorName("model.layers.0.mlp.experts.127.down_proj.weight"),
            "blk.0.ffn_down.127.weight");
  EXPECT_EQ(GgufTensorName("model.layers.0.mlp.experts.x.down_proj.weight"), "");
  EXPECT_EQ(GgufTensorName("model.layers.0.mlp.shared_expert.down_proj.weight"),
            "blk.0.ffn_down_shexp.weight");
  EXPECT_EQ(GgufTensorName("model.layers.3.mlp.shared_expert.gate_proj.weight"),
            "blk.3.ffn_gate_shexp.weight");
  EXPECT_EQ(GgufTensorName("model.layers.3.mlp.shared_expert_gate.weight"),
            "blk.3.ffn_gate_inp_shexp.weight");
  EXPECT_EQ(GgufTensorName("model.layers.0.mlp.shared_expert.gate.weight"), "");
  // Multimodal checkpoints' text models, in transformers' older and newer layouts.
  EXPECT_EQ(GgufTensorName("language_model.model.layers.2.self_attn.q_proj.weight"),
            "blk.2.attn_q.weight");
  EXPECT_EQ(GgufTensorName("language_model.model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(GgufTensorName("language_model.lm_head.weight"), "output.weight");
  EXPECT_EQ(GgufTensorName("model.language_model.layers.0.mlp.down_proj.weight"),
            "blk.0.ffn_down.weight");
  EXPECT_EQ(GgufTensorName("model.language_model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(GgufTensorName("vision_tower.vision_model.embeddings.patch_embedding.weight"), "");
  EXPECT_TRUE(IsVisionTensorName("vision_tower.vision_model.embeddings.patch_embedding.weight"));
  EXPECT_TRUE(IsVisionTensorName("model.multi_modal_projector.mm_input_projection_weight"));
  EXPECT_FALSE(IsVisionTensorName("language_model.model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(IsVisionTensorName("visual.blocks.0.attn.qkv.weight"));
  EXPECT_TRUE(IsVisionTensorName("model.visual.merger.mlp.0.weight"));
  EXPECT_FALSE(IsVisionTensorName("model.layers.0.self_attn.q_proj.weight"));
}

TEST(HfModelTest, ADirectoryWithoutConfigSaysSo) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "hf_empty";
  std::filesystem::create_directories(dir);
  auto model = OpenModelFile(dir.string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("config.json"));
}

TEST(HfModelTest, AFileIsOpenedAsGguf) {
  const std::filesystem::path file = std::filesystem::path(::testing::TempDir()) / "not.gguf";
  std::ofstream(file) << "nope";
  auto model = OpenModelFile(file.string());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("magic"));
}

}  // namespace
}  // namespace loom::common
