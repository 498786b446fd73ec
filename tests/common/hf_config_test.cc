#include "common/formats/hf_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/formats/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

void ExpectRefused(const std::string& json, const std::string& piece);

constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
  "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
  "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000, "tie_word_embeddings": true, "vocab_size": 151936,
  "hidden_act": "silu", "rope_scaling": null, "sliding_window": null})";

absl::StatusOr<ModelConfig> Translate(const std::string& json, HfConfigInfo* info = nullptr) {
  GgufMetadataBuilder metadata;
  absl::StatusOr<HfConfigInfo> translated = HfConfigToGguf(json, metadata);
  if (!translated.ok()) return translated.status();
  if (info != nullptr) *info = *translated;
  auto view = GgufFile::FromParts(std::move(metadata.entries()), {}, {}, nullptr);
  if (!view.ok()) return view.status();
  return ModelConfigFromGguf(**view);
}

TEST(HfConfigTest, TranslatesQwen3WithItsOwnHeadDim) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(kQwen3, &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "qwen3");
  EXPECT_TRUE(info.tie_word_embeddings);
  EXPECT_EQ(config->hidden_size, 1024);
  EXPECT_EQ(config->head_dim, 128);  // not hidden / heads = 64
  EXPECT_EQ(config->num_kv_heads, 8);
  EXPECT_EQ(config->context_length, 40960);
  EXPECT_EQ(config->vocab_size, 151936);
  EXPECT_DOUBLE_EQ(config->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_TRUE(config->rope_neox);
}

// Qwen3-30B-A3B's and Mixtral-8x7B's config.json expert fields (shapes shrunk).
TEST(HfConfigTest, TranslatesMixturesOfExperts) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> qwen = Translate(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 768,
    "moe_intermediate_size": 96, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
    "max_position_embeddings": 4096, "vocab_size": 1000})",
                                               &info);
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(info.architecture, "qwen3moe");
  EXPECT_EQ(qwen->num_experts, 128);
  EXPECT_EQ(qwen->num_experts_used, 8);
  EXPECT_EQ(qwen->intermediate_size, 96);
  EXPECT_TRUE(qwen->expert_weights_norm);

  absl::StatusOr<ModelConfig> mixtral = Translate(R"({
    "architectures": ["MixtralForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "num_local_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "vocab_size": 1000, "sliding_window": null})",
                                                  &info);
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(info.architecture, "llama");
  EXPECT_EQ(mixtral->num_experts, 8);
  EXPECT_EQ(mixtral->num_experts_used, 2);
  EXPECT_EQ(mixtral->intermediate_size, 512);
  EXPECT_TRUE(mixtral->rope_neox);  // HF checkpoints are rotate-half

  absl::StatusOr<ModelConfig> plain = Translate(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 768,
    "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": false,
    "num_hidden_layers": 2, "num_attention_heads": 8, "max_position_embeddings": 4096,
    "vocab_size": 1000})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->expert_weights_norm);
  EXPECT_TRUE(mixtral->expert_weights_norm);  // Mixtral has no such field: it renormalizes

  // Without the field Qwen3-MoE does not renormalize (Transformers' Qwen3MoeConfig default).
  absl::StatusOr<ModelConfig> unsaid = Translate(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 768,
    "num_experts": 8, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_attention_heads": 8, "max_position_embeddings": 4096,
    "vocab_size": 1000})");
  ASSERT_TRUE(unsaid.ok()) << unsaid.status();
  EXPECT_FALSE(unsaid->expert_weights_norm);

  // Qwen1.5-MoE's (shrunk): the dense width, the experts', and the shared expert's, which the
  // checkpoint's mlp.shared_expert tensors turn on (tests/worker/hf_model_test.py).
  absl::StatusOr<ModelConfig> qwen2 = Translate(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 704,
    "moe_intermediate_size": 176, "shared_expert_intermediate_size": 704, "num_experts": 60,
    "num_experts_per_tok": 4, "norm_topk_prob": false, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 8, "max_position_embeddings": 8192, "vocab_size": 1000,
    "use_sliding_window": false})",
                                                &info);
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_EQ(info.architecture, "qwen2moe");
  EXPECT_EQ(qwen2->num_experts, 60);
  EXPECT_EQ(qwen2->intermediate_size, 176);
  EXPECT_FALSE(qwen2->expert_weights_norm);
  EXPECT_TRUE(qwen2->rope_neox);
}

// GLM-4.5's config.json (zai-org/GLM-4.5, the layer count shrunk): the first three layers
// dense, sigmoid routing over 160 experts scaled by 2.5, one shared expert, half of each head
// rotating, and a multi-token-prediction layer after the model's, skipped.
constexpr char kGlm45[] = R"({
  "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": true,
  "first_k_dense_replace": 3, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
  "intermediate_size": 12288, "max_position_embeddings": 131072, "moe_intermediate_size": 1536,
  "n_group": 1, "n_routed_experts": 160, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 8,
  "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000,
  "routed_scaling_factor": 2.5, "tie_word_embeddings": false, "topk_group": 1,
  "use_qk_norm": true, "vocab_size": 151552})";

TEST(HfConfigTest, TranslatesGlm45) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(kGlm45, &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "glm4moe");
  EXPECT_EQ(info.first_skipped_layer, 8);
  EXPECT_EQ(config->num_layers, 8);
  EXPECT_EQ(config->num_experts, 160);
  EXPECT_EQ(config->num_experts_used, 8);
  EXPECT_EQ(config->intermediate_size, 1536);
  EXPECT_EQ(config->leading_dense_layers, 3);
  EXPECT_EQ(config->dense_intermediate_size, 12288);
  EXPECT_TRUE(config->expert_sigmoid);
  EXPECT_TRUE(config->expert_weights_norm);
  EXPECT_FLOAT_EQ(config->expert_weights_scale, 2.5f);
  EXPECT_EQ(config->rope_dim, 64);
  EXPECT_TRUE(config->rope_neox);
  // Without the multi-token-prediction layers nothing is skipped.
  std::string plain = kGlm45;
  plain.replace(plain.find("\"num_nextn_predict_layers\": 1"), 29,
                "\"num_nextn_predict_layers\": 0");
  ASSERT_TRUE(Translate(plain, &info).ok());
  EXPECT_EQ(info.first_skipped_layer, -1);
}

// DeepSeek-V3's config.json (its FP8 quantization_config left out): multi-head latent
// attention, 8 of 256 experts by sigmoid score in the best 4 of 8 groups, YaRN with mscale
// 1.0, the MTP layer after num_hidden_layers.
constexpr const char* kDeepSeekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
  "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-06, "first_k_dense_replace": 3,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "tie_word_embeddings": false, "vocab_size": 129280, "hidden_act": "silu"})";

TEST(HfConfigTest, TranslatesDeepSeekV3LatentAttentionAndGroupedRouting) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(kDeepSeekV3, &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "deepseek2");
  EXPECT_EQ(info.first_skipped_layer, 61);  // the MTP layer
  EXPECT_EQ(config->mla_kv_lora_rank, 512);
  EXPECT_EQ(config->mla_q_lora_rank, 1536);
  EXPECT_EQ(config->mla_nope_dim, 128);
  EXPECT_EQ(config->head_dim, 64 + 512);
  EXPECT_EQ(config->num_kv_heads, 1);
  EXPECT_EQ(config->mla_value_dim, 128);
  EXPECT_EQ(config->rope_dim, 64);
  EXPECT_FALSE(config->rope_neox);  // DeepSeek's modeling code rotates interleaved pairs
  EXPECT_EQ(config->num_experts, 256);
  EXPECT_EQ(config->intermediate_size, 2048);
  EXPECT_EQ(config->leading_dense_layers, 3);
  EXPECT_EQ(config->dense_intermediate_size, 18432);
  EXPECT_TRUE(config->expert_sigmoid);
  EXPECT_TRUE(config->expert_weights_norm);
  EXPECT_FLOAT_EQ(config->expert_weights_scale, 2.5f);
  EXPECT_EQ(config->expert_groups, 8);
  EXPECT_EQ(config->expert_groups_used, 4);
  // transformers' DeepseekV3Attention: softmax scale x mscale(40, mscale_all_dim)^2, and the
  // rotary embedding's factor mscale(40, mscale) / mscale(40, mscale_all_dim) = 1.
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(config->attention_scale, m * m / std::sqrt(192.0), 1e-6);
  EXPECT_NEAR(config->rope_attention_factor, 1.0, 1e-12);
  // V2-Lite's: queries from the hidden state, no groups (topk_method greedy).
  std::string lite = kDeepSeekV3;
  lite.replace(lite.find("\"q_lora_rank\": 1536"), 19, "\"q_lora_rank\": null");
  lite.replace(lite.find("\"noaux_tc\""), 10, "\"greedy\"");
  config = Translate(lite);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->mla_q_lora_rank, 0);
  EXPECT_EQ(config->expert_groups, 1);
  std::string no_latent = kDeepSeekV3;
  no_latent.replace(no_latent.find("\"kv_lora_rank\": 512, "), 21, "");
  ExpectRefused(no_latent, "kv_lora_rank");
}

TEST(HfConfigTest, Glm45GroupsRunAndOtherScoringIsRefused) {
  // Groups (DeepSeek-V3's n_group, topk_group) are run; a "greedy" topk_method ignores them.
  std::string grouped = kGlm45;
  grouped.replace(grouped.find("\"n_group\": 1"), 12, "\"n_group\": 8");
  absl::StatusOr<ModelConfig> config = Translate(grouped);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->expert_groups, 8);
  EXPECT_EQ(config->expert_groups_used, 1);
  grouped.replace(grouped.find("\"n_group\""), 0, "\"topk_method\": \"greedy\", ");
  config = Translate(grouped);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->expert_groups, 1);
  std::string scoring = kGlm45;
  scoring.replace(scoring.find("\"n_group\""), 0, "\"scoring_func\": \"relu\", ");
  ExpectRefused(scoring, "scoring_func 'relu'");
}

// Olmo-3-7B-Instruct's config.json (shapes shrunk): OLMo 2's norm names (sandwich_norms
// maps them), a window on the layers layer_types calls sliding; OlmoE-1B-7B's: 64 experts, 8 per
// token, not renormalized, clip_qkv null (a value refused).
TEST(HfConfigTest, TranslatesOlmo3AndOlmoe) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "hidden_size": 4096,
    "intermediate_size": 11008, "num_hidden_layers": 4, "num_attention_heads": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 65536, "rms_norm_eps": 1e-06,
    "rope_theta": 500000, "hidden_act": "silu", "attention_bias": false,
    "sliding_window": 4096, "tie_word_embeddings": false, "vocab_size": 100278,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                    "full_attention"]})",
                                                 &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "olmo2");
  EXPECT_TRUE(info.sandwich_norms);
  EXPECT_TRUE(config->rope_neox);
  EXPECT_EQ(config->sliding_window, 4096);
  EXPECT_EQ(config->sliding_layers, std::vector<bool>({true, true, true, false}));
  const std::string olmoe = R"({
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048,
    "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "hidden_act": "silu", "num_experts": 64, "num_experts_per_tok": 8,
    "norm_topk_prob": false, "clip_qkv": null, "tie_word_embeddings": false,
    "vocab_size": 50304})";
  config = Translate(olmoe, &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "olmoe");
  EXPECT_FALSE(info.sandwich_norms);
  EXPECT_EQ(config->num_experts, 64);
  EXPECT_EQ(config->num_experts_used, 8);
  EXPECT_EQ(config->intermediate_size, 1024);
  EXPECT_FALSE(config->expert_weights_norm);
  std::string clipped = olmoe;
  clipped.replace(clipped.find("\"clip_qkv\": null"), 16, "\"clip_qkv\": 8.0");
  ExpectRefused(clipped, "clip_qkv");
}

// EXAONE-4.0-32B's config.json (layers shrunk to 8): the window on the layers its letter pattern
// calls local, the global ones rotating nothing; 1.2B's has no window and rotates every layer.
TEST(HfConfigTest, TranslatesExaone4) {
  const std::string exaone = R"({
    "architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "hidden_size": 5120,
    "intermediate_size": 27392, "num_hidden_layers": 8, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000, "hidden_act": "silu",
    "sliding_window": 4096, "sliding_window_pattern": "LLLG", "tie_word_embeddings": false,
    "vocab_size": 102400})";
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(exaone, &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "exaone4");
  EXPECT_TRUE(info.sandwich_norms);
  const std::vector<bool> local = {true, true, true, false, true, true, true, false};
  EXPECT_EQ(config->sliding_window, 4096);
  EXPECT_EQ(config->sliding_layers, local);
  EXPECT_EQ(config->rope_layers, local);
  std::string small = exaone;
  small.replace(small.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": null");
  config = Translate(small);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window, 0);
  EXPECT_TRUE(config->rope_layers.empty());
  std::string bad = exaone;
  bad.replace(bad.find("LLLG"), 4, "LXLG");
  ExpectRefused(bad, "sliding_window_pattern 'LXLG'");
}

// ERNIE-4.5-0.3B-PT's config.json: llama's fields, interleaved RoPE pairs, use_bias (true
// refused).
TEST(HfConfigTest, TranslatesErnie45) {
  const std::string ernie = R"({
    "architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000, "hidden_act": "silu", "use_bias": false,
    "tie_word_embeddings": true, "vocab_size": 103424})";
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(ernie, &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "ernie4_5");
  EXPECT_FALSE(config->rope_neox);
  EXPECT_EQ(config->head_dim, 128);
  std::string biased = ernie;
  biased.replace(biased.find("\"use_bias\": false"), 17, "\"use_bias\": true");
  ExpectRefused(biased, "use_bias");
}

// ERNIE-4.5-21B-A3B-PT's config.json (layers shrunk to 4): moe_* fields, the first layer
// dense, the router always renormalizing; sparse layers not every layer from the start are
// refused.
TEST(HfConfigTest, TranslatesErnie45Moe) {
  const std::string ernie = R"({
    "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe",
    "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 4,
    "num_attention_heads": 20, "num_key_value_heads": 4, "head_dim": 128,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000,
    "hidden_act": "silu", "use_bias": false, "tie_word_embeddings": true, "vocab_size": 103424,
    "moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536,
    "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 3,
    "moe_layer_interval": 1, "moe_norm_min": 1e-12, "num_nextn_predict_layers": 1})";
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(ernie, &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "ernie4_5-moe");
  EXPECT_FALSE(config->rope_neox);
  EXPECT_EQ(config->num_experts, 64);
  EXPECT_EQ(config->num_experts_used, 6);
  EXPECT_EQ(config->intermediate_size, 1536);
  EXPECT_EQ(config->leading_dense_layers, 1);
  EXPECT_EQ(config->dense_intermediate_size, 12288);
  EXPECT_TRUE(config->expert_weights_norm);
  EXPECT_FALSE(config->expert_sigmoid);
  std::string early_end = ernie;
  early_end.replace(early_end.find("\"moe_layer_end_index\": 3"), 24, "\"moe_layer_end_index\": 2");
  ExpectRefused(early_end, "moe_layer_end_index 2");
  std::string every_other = ernie;
  every_other.replace(every_other.find("\"moe_layer_interval\": 1"), 23,
                      "\"moe_layer_interval\": 2");
  ExpectRefused(every_other, "moe_layer_interval 2");
}

// Gemma-3-1B-it's config.json (shapes shrunk): GELU, its query scale and local RoPE base as
// loom keys, norms offset by 1, tied embeddings by default, every 6th layer global.
TEST(HfConfigTest, TranslatesGemma3) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["Gemma3ForCausalLM"], "hidden_size": 128, "intermediate_size": 512,
    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 64, "max_position_embeddings": 32768, "vocab_size": 1000,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 64,
    "rope_theta": 1000000, "rope_local_base_freq": 10000, "sliding_window": 512,
    "sliding_window_pattern": 6, "attn_logit_softcapping": null,
    "final_logit_softcapping": null, "rope_scaling": null})",
                                                 &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "gemma3");
  EXPECT_TRUE(info.tie_word_embeddings);
  EXPECT_TRUE(info.sandwich_norms);
  EXPECT_TRUE(config->gelu);
  EXPECT_FLOAT_EQ(config->embedding_scale, std::sqrt(128.0f));
  EXPECT_DOUBLE_EQ(config->attention_scale, 1.0 / 8.0);
  EXPECT_DOUBLE_EQ(config->local_rope_theta, 10000.0);
  EXPECT_FLOAT_EQ(config->norm_weight_offset, 1.0f);
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(config->LayerWindow(l), l == 5 ? 0 : 512) << l;

  EXPECT_EQ(config->attn_logit_softcap, 0.0f);
  EXPECT_EQ(config->final_logit_softcap, 0.0f);
  ExpectRefused(R"({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 128,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 4096, "hidden_activation": "silu"})",
                "hidden_activation 'silu'");
}

// gemma-3-4b-it's config.json as released: a multimodal wrapper whose text_config names
// only what differs from transformers' Gemma3TextConfig defaults (no heads, head dim,
// vocabulary, RoPE bases or context); the text model is served with those defaults.
TEST(HfConfigTest, TranslatesGemma3MultimodalTextConfigOverItsDefaults) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
    "mm_tokens_per_image": 256, "initializer_range": 0.02,
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "model_type": "siglip_vision_model",
                      "num_hidden_layers": 27, "patch_size": 14}})",
                                                 &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(info.multimodal);
  EXPECT_EQ(info.architecture, "gemma3");
  EXPECT_TRUE(info.tie_word_embeddings);
  EXPECT_TRUE(info.sandwich_norms);
  EXPECT_EQ(config->hidden_size, 2560);
  EXPECT_EQ(config->num_layers, 34);
  EXPECT_EQ(config->num_heads, 8);
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 256);
  EXPECT_EQ(config->vocab_size, 262208);
  EXPECT_EQ(config->context_length, 131072);
  EXPECT_DOUBLE_EQ(config->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(config->local_rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->attention_scale, 1.0 / 16.0);  // query_pre_attn_scalar 256
  EXPECT_EQ(config->rope_scaling, RopeScalingType::kLinear);
  EXPECT_TRUE(config->gelu);
  for (int64_t l = 0; l < 34; ++l) EXPECT_EQ(config->LayerWindow(l), l % 6 == 5 ? 0 : 1024) << l;

  // Mistral Small 3.1: the text model is Mistral's, every field given.
  absl::StatusOr<ModelConfig> mistral = Translate(R"({
    "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
    "text_config": {"head_dim": 128, "hidden_act": "silu", "hidden_size": 512,
                    "intermediate_size": 1024, "max_position_embeddings": 131072,
                    "model_type": "mistral", "num_attention_heads": 4, "num_hidden_layers": 2,
                    "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
                    "sliding_window": null, "vocab_size": 1000},
    "vision_config": {"model_type": "pixtral"}})",
                                                  &info);
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_TRUE(info.multimodal);
  EXPECT_EQ(info.architecture, "mistral");
  EXPECT_FALSE(info.tie_word_embeddings);
  EXPECT_EQ(mistral->head_dim, 128);
  EXPECT_EQ(mistral->sliding_window, 0);

  // Qwen2.5-VL-7B's (shrunk): a Qwen2 text model at the top level, M-RoPE's rope_scaling
  // (plain RoPE for text-only positions), or its fields in text_config (newer exports).
  for (const char* text_at : {"top", "text_config"}) {
    SCOPED_TRACE(text_at);
    const std::string fields = R"("hidden_size": 256, "intermediate_size": 512,
      "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
      "max_position_embeddings": 128000, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
      "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 2,
      "vocab_size": 1000, "tie_word_embeddings": false,
      "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]})";
    const std::string json =
        std::string(text_at) == std::string("top")
            ? R"({"architectures": ["Qwen2_5_VLForConditionalGeneration"], )" + fields +
                  R"(, "vision_config": {"depth": 32}})"
            : R"({"architectures": ["Qwen2_5_VLForConditionalGeneration"], "text_config": {)" +
                  fields + R"(}, "vision_config": {"depth": 32}})";
    absl::StatusOr<ModelConfig> qwen = Translate(json, &info);
    ASSERT_TRUE(qwen.ok()) << qwen.status();
    EXPECT_TRUE(info.multimodal);
    EXPECT_EQ(info.architecture, "qwen2");
    EXPECT_FALSE(info.tie_word_embeddings);
    EXPECT_EQ(qwen->hidden_size, 256);
    EXPECT_EQ(qwen->head_dim, 64);
    EXPECT_EQ(qwen->rope_scaling, RopeScalingType::kNone);
    EXPECT_EQ(qwen->sliding_window, 0);
  }

  // Qwen3-VL-8B's (shrunk): a Qwen3 in text_config, interleaved M-RoPE.
  absl::StatusOr<ModelConfig> qwen3 = Translate(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "text_config": {"attention_bias": false, "head_dim": 128, "hidden_act": "silu",
                    "hidden_size": 256, "intermediate_size": 512, "max_position_embeddings": 262144,
                    "model_type": "qwen3_vl_text", "num_attention_heads": 4,
                    "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
                    "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20],
                                     "rope_type": "default"},
                    "rope_theta": 5000000, "tie_word_embeddings": false, "vocab_size": 1000},
    "tie_word_embeddings": false, "vision_config": {"depth": 27}})",
                                                &info);
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(info.architecture, "qwen3");
  EXPECT_EQ(qwen3->head_dim, 128);
  EXPECT_EQ(qwen3->rope_scaling, RopeScalingType::kNone);
  EXPECT_DOUBLE_EQ(qwen3->rope_theta, 5e6);

  // Qwen3-VL-30B-A3B's (shrunk): a Qwen3-MoE whose router renormalizes whatever the field says.
  absl::StatusOr<ModelConfig> moe = Translate(R"({
    "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    "text_config": {"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
                    "num_experts": 16, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
                    "mlp_only_layers": [], "num_attention_heads": 4, "num_key_value_heads": 2,
                    "head_dim": 64, "num_hidden_layers": 2, "max_position_embeddings": 4096,
                    "vocab_size": 1000, "model_type": "qwen3_vl_moe_text",
                    "rope_scaling": {"mrope_interleaved": true, "mrope_section": [8, 12, 12],
                                     "rope_type": "default"}}})",
                                              &info);
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(info.architecture, "qwen3moe");
  EXPECT_EQ(moe->num_experts, 16);
  EXPECT_EQ(moe->intermediate_size, 64);
  EXPECT_TRUE(moe->expert_weights_norm);
  EXPECT_EQ(moe->rope_scaling, RopeScalingType::kNone);

  ExpectRefused(R"({"architectures": ["Gemma3ForConditionalGeneration"]})", "text_config");
  // Fields of the wrong type are refused, never thrown.
  ExpectRefused(R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {"model_type": 5}})",
                "model_type ''");
  ExpectRefused(R"({"architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
    "intermediate_size": 512, "max_position_embeddings": 4096,
    "rope_scaling": {"type": null, "rope_type": 7, "factor": "x"}})",
                "rope");
  ExpectRefused(R"({"architectures": ["Mistral3ForConditionalGeneration"],
    "text_config": {"model_type": "qwen2"}})",
                "model_type 'qwen2'");
}

// Gemma-2-2b-it's config.json (shapes shrunk): soft-capping as llama.cpp's keys, every
// other layer local (the even ones), one RoPE base, the query scale; a non-positive cap
// refused.
TEST(HfConfigTest, TranslatesGemma2) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["Gemma2ForCausalLM"], "hidden_size": 128, "intermediate_size": 512,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "max_position_embeddings": 8192, "vocab_size": 1000,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
    "rope_theta": 10000.0, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "cache_implementation": "hybrid"})",
                                                 &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "gemma2");
  EXPECT_TRUE(info.tie_word_embeddings);
  EXPECT_TRUE(info.sandwich_norms);
  EXPECT_TRUE(config->gelu);
  EXPECT_FLOAT_EQ(config->attn_logit_softcap, 50.0f);
  EXPECT_FLOAT_EQ(config->final_logit_softcap, 30.0f);
  EXPECT_DOUBLE_EQ(config->attention_scale, 1.0 / 16.0);
  EXPECT_DOUBLE_EQ(config->local_rope_theta, 0.0);
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(config->LayerWindow(l), l % 2 == 0 ? 4096 : 0) << l;

  ExpectRefused(R"({"architectures": ["Gemma2ForCausalLM"], "hidden_size": 128,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 4096, "final_logit_softcapping": -1.0})",
                "final_logit_softcapping");
}

// Phi-4-mini-shaped: longrope factors (served as tensors), the top-level
// original_max_position_embeddings, a partial rotary embedding.
TEST(HfConfigTest, TranslatesPhi3LongRopeAndPartialRotary) {
  GgufMetadataBuilder metadata;
  absl::StatusOr<HfConfigInfo> info = HfConfigToGguf(R"({
    "architectures": ["Phi3ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "partial_rotary_factor": 0.75, "vocab_size": 1000, "sliding_window": 262144,
    "rope_scaling": {"type": "longrope", "long_factor": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
      13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], "short_factor": [1, 1, 1, 1, 1, 1, 1, 1,
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}})",
                                                     metadata);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->architecture, "phi3");
  EXPECT_EQ(info->rope_factors_long.size(), 24u);
  EXPECT_EQ(info->rope_factors_long[23], 24.0f);
  EXPECT_EQ(info->rope_factors_short.size(), 24u);
  auto view = GgufFile::FromParts(std::move(metadata.entries()), {}, {}, nullptr);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(*(*view)->GetInt("phi3.rope.dimension_count"), 48);  // 0.75 x 64
  EXPECT_EQ(*(*view)->GetInt("phi3.rope.scaling.original_context_length"), 4096);

  ExpectRefused(R"({"architectures": ["Phi3ForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 8192, "rope_scaling": {"type": "longrope", "short_factor": [1]}})",
                "long_factor");
}

TEST(HfConfigTest, LlamaCheckpointsUseRotateHalfRope) {
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 8192,
    "vocab_size": 100, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "llama");
  EXPECT_TRUE(config->rope_neox);  // a GGUF llama would be false: its q/k rows are permuted
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->rope_scaling, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(config->rope_scaling_factor, 8.0);
  EXPECT_EQ(config->rope_original_context_length, 8192);
  EXPECT_DOUBLE_EQ(config->rope_high_freq_factor, 4.0);
}

TEST(HfConfigTest, ReadsLinearAndYarnScalingFromEitherKey) {
  absl::StatusOr<ModelConfig> linear = Translate(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512,
    "vocab_size": 100, "rope_scaling": {"type": "linear", "factor": 2.0}})");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->rope_scaling, RopeScalingType::kLinear);
  absl::StatusOr<ModelConfig> yarn = Translate(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512,
    "vocab_size": 100, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 128}})");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_EQ(yarn->rope_scaling, RopeScalingType::kYarn);
}

// transformers' _compute_yarn_parameters: the attention factor is given, else
// mscale/mscale_all_dim's ratio, else 0.1 ln(factor) + 1; beta_fast/beta_slow default to
// 32/1; the correction range uses max_position_embeddings without
// original_max_position_embeddings.
TEST(HfConfigTest, YarnParametersFollowTransformers) {
  const std::string head = R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512,
    "vocab_size": 100, "rope_scaling": )";
  absl::StatusOr<ModelConfig> plain = Translate(head + R"({"rope_type": "yarn", "factor": 4.0}})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NEAR(plain->rope_attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
  EXPECT_EQ(plain->rope_original_context_length, 512);
  EXPECT_DOUBLE_EQ(plain->rope_yarn_beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(plain->rope_yarn_beta_slow, 1.0);
  EXPECT_TRUE(plain->rope_yarn_truncate);

  absl::StatusOr<ModelConfig> given = Translate(head + R"({"type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 128, "attention_factor": 0.75, "beta_fast": 16,
      "beta_slow": 2, "truncate": false}})");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_DOUBLE_EQ(given->rope_attention_factor, 0.75);
  EXPECT_EQ(given->rope_original_context_length, 128);
  EXPECT_DOUBLE_EQ(given->rope_yarn_beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(given->rope_yarn_beta_slow, 2.0);
  EXPECT_FALSE(given->rope_yarn_truncate);

  absl::StatusOr<ModelConfig> deepseek = Translate(head + R"({"type": "yarn", "factor": 40.0,
      "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": null, "beta_slow": 0}})");
  ASSERT_TRUE(deepseek.ok()) << deepseek.status();
  EXPECT_NEAR(deepseek->rope_attention_factor,
              (0.1 * std::log(40.0) + 1.0) / (0.05 * std::log(40.0) + 1.0), 1e-12);
  EXPECT_DOUBLE_EQ(deepseek->rope_yarn_beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(deepseek->rope_yarn_beta_slow, 1.0);

  ExpectRefused(head + R"({"type": "yarn", "factor": 4.0, "attention_factor": -1}})",
                "attention factor");
}

TEST(HfConfigTest, MistralSlidingWindowCoversEveryLayer) {
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 32768, "sliding_window": 4096, "vocab_size": 100})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "mistral");
  EXPECT_EQ(config->context_length, 32768);  // the window is applied, not the context capped
  EXPECT_EQ(config->sliding_window, 4096);
  EXPECT_EQ(config->LayerWindow(0), 4096);
  EXPECT_EQ(config->LayerWindow(1), 4096);
}

// Qwen2: use_sliding_window from layer max_window_layers on; layer_types, where given, per
// layer; no window without use_sliding_window; local layers need a window size.
TEST(HfConfigTest, QwenSlidingWindowLayersFollowTheConfig) {
  const std::string base = R"("architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 4096, "vocab_size": 100)";
  absl::StatusOr<ModelConfig> from_layer = Translate("{" + base + R"(, "sliding_window": 512,
    "use_sliding_window": true, "max_window_layers": 1})");
  ASSERT_TRUE(from_layer.ok()) << from_layer.status();
  EXPECT_EQ(from_layer->LayerWindow(0), 0);
  EXPECT_EQ(from_layer->LayerWindow(1), 512);
  EXPECT_EQ(from_layer->LayerWindow(2), 512);
  absl::StatusOr<ModelConfig> types = Translate("{" + base + R"(, "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})");
  ASSERT_TRUE(types.ok()) << types.status();
  EXPECT_EQ(types->LayerWindow(0), 64);
  EXPECT_EQ(types->LayerWindow(1), 0);
  EXPECT_EQ(types->LayerWindow(2), 64);
  absl::StatusOr<ModelConfig> off = Translate("{" + base + R"(, "sliding_window": 512,
    "use_sliding_window": false, "max_window_layers": 0})");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->sliding_window, 0);
  EXPECT_EQ(off->LayerWindow(2), 0);
  GgufMetadataBuilder metadata;
  EXPECT_FALSE(HfConfigToGguf("{" + base + R"(, "use_sliding_window": true,
    "max_window_layers": 0})",
                              metadata)
                   .ok());
}

void ExpectRefused(const std::string& json, const std::string& piece) {
  GgufMetadataBuilder metadata;
  absl::StatusOr<HfConfigInfo> info = HfConfigToGguf(json, metadata);
  ASSERT_FALSE(info.ok()) << piece;
  EXPECT_THAT(std::string(info.status().message()), HasSubstr(piece));
}

// SmolLM3-3B's config.json (shapes shrunk): no_rope_layers lists the layers that rotate.
TEST(HfConfigTest, TranslatesSmolLM3NoRopeLayers) {
  const std::string base = R"("architectures": ["SmolLM3ForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 65536, "rope_theta": 5000000.0,
    "vocab_size": 1000, "tie_word_embeddings": true, "use_sliding_window": false,
    "sliding_window": null, "no_rope_layer_interval": 4)";
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config =
      Translate("{" + base + R"(, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]})", &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "smollm3");
  EXPECT_TRUE(info.tie_word_embeddings);
  EXPECT_TRUE(config->rope_neox);  // rotate-half rows, as every Hugging Face checkpoint
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(config->LayerRotates(l), (l + 1) % 4 != 0) << l;

  // A list unlike the interval wins; without a list the interval decides.
  config = Translate("{" + base + R"(, "no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 1]})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->LayerRotates(0));
  EXPECT_TRUE(config->LayerRotates(3));
  std::string every_other = base;
  every_other.replace(every_other.find("\"no_rope_layer_interval\": 4"),
                      std::string("\"no_rope_layer_interval\": 4").size(),
                      "\"no_rope_layer_interval\": 2");
  config = Translate("{" + every_other + "}");
  ASSERT_TRUE(config.ok()) << config.status();
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(config->LayerRotates(l), l % 2 == 0) << l;

  ExpectRefused("{" + base + R"(, "no_rope_layers": [1, 1, 1]})", "no_rope_layers");
  ExpectRefused("{" + base + R"(, "no_rope_layers": [1, 1, 1, 2, 1, 1, 1, 1]})",
                "no_rope_layers[3]");
}

// granite-3.1-8b-instruct's multipliers (shapes shrunk) as llama.cpp's keys.
TEST(HfConfigTest, TranslatesGraniteMultipliers) {
  const std::string base = R"("architectures": ["GraniteForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 131072, "rope_theta": 10000000.0,
    "vocab_size": 1000, "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
    "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
    "attention_multiplier": 0.0078125)";
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config =
      Translate("{" + base + R"(, "logits_scaling": 16.0})", &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "granite");
  EXPECT_FLOAT_EQ(config->embedding_scale, 12.0f);
  EXPECT_FLOAT_EQ(config->residual_scale, 0.22f);
  EXPECT_NEAR(config->attention_scale, 0.0078125, 1e-9);
  EXPECT_FLOAT_EQ(config->logit_scale, 16.0f);
  EXPECT_TRUE(config->rope_layers.empty());

  ExpectRefused("{" + base + R"(, "logits_scaling": -1.0})", "logits_scaling");
  ExpectRefused("{" + base + R"(, "logits_scaling": 0})", "logits_scaling");
}

// granite-3.1-3b-a800m-instruct's config.json (GraniteMoeForCausalLM), and the same as
// GraniteMoeSharedForCausalLM: the experts' width is intermediate_size, the router
// renormalizes, Granite's multipliers apply. (The shared expert's width counts once its
// tensors are there: tests/worker/hf_model_test.py's granitemoe directory.)
TEST(HfConfigTest, TranslatesGraniteMoeAndItsSharedExpert) {
  const std::string base = R"("hidden_size": 1536, "intermediate_size": 512,
    "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "rope_theta": 10000000.0, "rms_norm_eps": 1e-06,
    "vocab_size": 49155, "tie_word_embeddings": true, "attention_bias": false,
    "num_local_experts": 40, "num_experts_per_tok": 8, "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22, "attention_multiplier": 0.015625, "logits_scaling": 6.0)";
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config =
      Translate(R"({"architectures": ["GraniteMoeForCausalLM"], )" + base + "}", &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "granitemoe");
  EXPECT_EQ(config->num_experts, 40);
  EXPECT_EQ(config->num_experts_used, 8);
  EXPECT_EQ(config->intermediate_size, 512);
  EXPECT_TRUE(config->expert_weights_norm);
  EXPECT_EQ(config->shared_expert_intermediate_size, 0);
  EXPECT_FLOAT_EQ(config->embedding_scale, 12.0f);
  EXPECT_FLOAT_EQ(config->logit_scale, 6.0f);
  config = Translate(R"({"architectures": ["GraniteMoeSharedForCausalLM"], )" + base +
                         R"(, "shared_intermediate_size": 1024})",
                     &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "granitemoe");
  // shared_intermediate_size 0 means no shared expert (GraniteMoeSharedConfig's default).
  config = Translate(R"({"architectures": ["GraniteMoeSharedForCausalLM"], )" + base +
                         R"(, "shared_intermediate_size": 0})",
                     &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->shared_expert_intermediate_size, 0);
}

// GLM-4-9B-0414's config.json (shapes shrunk): half of each head rotates, in the interleaved
// pairs its modeling code uses (so not rotate-half, unlike every other checkpoint).
TEST(HfConfigTest, Glm4RotatesHalfOfEachHeadInInterleavedPairs) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["Glm4ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 128, "partial_rotary_factor": 0.5, "attention_bias": true,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "vocab_size": 1000, "hidden_act": "silu", "tie_word_embeddings": false})",
                                                 &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "glm4");
  EXPECT_FALSE(config->rope_neox);
  EXPECT_EQ(config->rope_dim, 64);
  EXPECT_EQ(config->head_dim, 128);
}

// gpt-oss-20b's config.json (shapes shrunk): experts (num_local_experts and
// experts_per_token beside num_experts_per_tok), layer_types, YaRN with truncate false, its
// SwiGLU limit and the mxfp4 quantization_config.
TEST(HfConfigTest, TranslatesGptOss) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["GptOssForCausalLM"], "attention_bias": true, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 4, "num_key_value_heads": 8, "num_local_experts": 32,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
      "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
      "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "vocab_size": 201088})",
                                                 &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "gpt-oss");
  EXPECT_EQ(info.quantization.method, HfQuantization::Method::kMxfp4);
  EXPECT_EQ(config->num_experts, 32);
  EXPECT_EQ(config->num_experts_used, 4);
  EXPECT_EQ(config->intermediate_size, 2880);
  EXPECT_TRUE(config->expert_weights_norm);  // top-k softmaxed: renormalized probabilities
  EXPECT_FLOAT_EQ(config->swiglu_limit, 7.0f);
  EXPECT_EQ(config->sliding_window, 128);
  EXPECT_EQ(config->sliding_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(config->rope_scaling, RopeScalingType::kYarn);
  EXPECT_FALSE(config->rope_yarn_truncate);
  EXPECT_TRUE(config->rope_neox);
  EXPECT_EQ(config->head_dim, 64);
}

// gemma-7b's config.json (shapes shrunk): hidden_act "gelu" and no hidden_activation, which
// transformers runs as the tanh approximation; llama's two norm names per layer.
TEST(HfConfigTest, TranslatesGemma1) {
  HfConfigInfo info;
  absl::StatusOr<ModelConfig> config = Translate(R"({
    "architectures": ["GemmaForCausalLM"], "hidden_size": 96, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "head_dim": 64, "max_position_embeddings": 8192, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "vocab_size": 1000, "hidden_act": "gelu"})",
                                                 &info);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(info.architecture, "gemma");
  EXPECT_TRUE(info.tie_word_embeddings);
  EXPECT_FALSE(info.sandwich_norms);
  EXPECT_TRUE(config->gelu);
  EXPECT_FLOAT_EQ(config->embedding_scale, std::sqrt(96.0f));
  EXPECT_DOUBLE_EQ(config->attention_scale, 1.0 / 8.0);  // 1 / sqrt(head_dim)
  EXPECT_FLOAT_EQ(config->norm_weight_offset, 1.0f);
  EXPECT_EQ(config->sliding_window, 0);
  // Another activation is still refused.
  ExpectRefused(R"({"architectures": ["GemmaForCausalLM"], "hidden_size": 96,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 8192, "hidden_act": "relu"})",
                "hidden_act 'relu'");
}

// Other architectures rotate every layer.
TEST(HfConfigTest, LlamaRotatesEveryLayer) {
  absl::StatusOr<ModelConfig> config = Translate(kQwen3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->rope_layers.empty());
  for (int64_t l = 0; l < 28; ++l) EXPECT_TRUE(config->LayerRotates(l));
}

TEST(HfConfigTest, RefusesWhatLoomCannotServeByName) {
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 512)";
  ExpectRefused(R"({"architectures": ["GPTNeoXForCausalLM"], )" + base + "}",
                "'GPTNeoXForCausalLM'");
  ExpectRefused(R"({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu", )" + base + "}",
                "hidden_act 'gelu'");
  ExpectRefused(R"({"architectures": ["LlamaForCausalLM"], "mlp_bias": true, )" + base + "}",
                "mlp_bias");
  ExpectRefused(R"({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type":
                "dynamic", "factor": 2.0}, )" +
                    base + "}",
                "'dynamic'");
  ExpectRefused(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": "64"})", "'hidden_size'");
  ExpectRefused(R"({"architectures": ["LlamaForCausalLM"]})", "'hidden_size' is missing");
  ExpectRefused("[1]", "not a JSON object");
}

}  // namespace
}  // namespace loom::common
