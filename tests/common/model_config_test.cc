#include "common/formats/model_config.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/gguf_test_util.h"
#include "tests/test_paths.h"

namespace loom::common {
namespace {

using ::loom::common::testing::ArrayValue;
using ::loom::common::testing::GgufImageBuilder;
using ::testing::HasSubstr;

constexpr uint32_t kF32 = static_cast<uint32_t>(GgmlType::kF32);
// Q1_0 (128 elements in 18 bytes) keeps full-size synthetic matrices small in memory.
constexpr uint32_t kQ1_0 = 41;

std::filesystem::path ModelPath() {
  return loom::test_env::ModelPath();
}

absl::StatusOr<ModelConfig> ConfigOf(const GgufImageBuilder& builder) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(builder.Build());
  if (!file.ok()) return file.status();
  return ModelConfigFromGguf(**file);
}

// TinyLlama-1.1B's hyper-parameters (llama, GQA 32/4), with a full-size untied LM head.
GgufImageBuilder TinyLlama() {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "llama")
      .KvString("general.name", "TinyLlama")
      .KvU32("llama.context_length", 2048)
      .KvU32("llama.embedding_length", 2048)
      .KvU32("llama.feed_forward_length", 5632)
      .KvU32("llama.block_count", 22)
      .KvU32("llama.attention.head_count", 32)
      .KvU32("llama.attention.head_count_kv", 4)
      .KvF32("llama.attention.layer_norm_rms_epsilon", 1e-5f)
      .KvF32("llama.rope.freq_base", 10000.0f)
      .KvU32("llama.rope.dimension_count", 64)
      .Tensor("token_embd.weight", {2048, 32000}, kQ1_0)
      .Tensor("output.weight", {2048, 32000}, kQ1_0);
  return builder;
}

// Llama-3-8B-shaped metadata (vocab from the key, no tensors unless added).
GgufImageBuilder Llama3() {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "llama")
      .KvU32("llama.context_length", 131072)
      .KvU32("llama.embedding_length", 4096)
      .KvU32("llama.feed_forward_length", 14336)
      .KvU32("llama.block_count", 32)
      .KvU32("llama.attention.head_count", 32)
      .KvU32("llama.attention.head_count_kv", 8)
      .KvF32("llama.attention.layer_norm_rms_epsilon", 1e-5f)
      .KvF32("llama.rope.freq_base", 500000.0f)
      .KvU32("llama.rope.dimension_count", 128)
      .KvU32("llama.vocab_size", 128256);
  return builder;
}

// Qwen2-0.5B-shaped: attention biases, tied embeddings, 14 heads of 64 over 896.
GgufImageBuilder Qwen2(bool with_bias = true) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "qwen2")
      .KvU32("qwen2.context_length", 32768)
      .KvU32("qwen2.embedding_length", 896)
      .KvU32("qwen2.feed_forward_length", 4864)
      .KvU32("qwen2.block_count", 24)
      .KvU32("qwen2.attention.head_count", 14)
      .KvU32("qwen2.attention.head_count_kv", 2)
      .KvF32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f)
      .KvF32("qwen2.rope.freq_base", 1000000.0f)
      .KvStringArray("tokenizer.ggml.tokens", {"a", "b", "c"})
      .KvU32("qwen2.vocab_size", 151936);
  if (with_bias) {
    builder.Tensor("blk.0.attn_q.bias", {896}, kF32)
        .Tensor("blk.0.attn_k.bias", {128}, kF32)
        .Tensor("blk.0.attn_v.bias", {128}, kF32);
  }
  return builder;
}

void ExpectInvalid(const absl::StatusOr<ModelConfig>& config,
                   const std::vector<std::string>& pieces) {
  ASSERT_FALSE(config.ok()) << "expected an error containing " << pieces[0];
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  for (const std::string& piece : pieces) {
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(piece));
  }
}

TEST(ModelConfigTest, ReadsTheSmolLm2Model) {
  ASSERT_TRUE(std::filesystem::exists(ModelPath())) << ModelPath() << " missing";
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(ModelPath().string());
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ModelConfig> config = ModelConfigFromGguf(**file);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "llama");
  EXPECT_THAT(config->name, HasSubstr("Smollm2"));  // general.name as converted
  EXPECT_EQ(config->num_layers, 30);
  EXPECT_EQ(config->hidden_size, 576);
  EXPECT_EQ(config->intermediate_size, 1536);
  EXPECT_EQ(config->num_heads, 9);
  EXPECT_EQ(config->num_kv_heads, 3);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->rope_dim, 64);
  EXPECT_EQ(config->context_length, 8192);
  EXPECT_EQ(config->vocab_size, 49152);
  EXPECT_DOUBLE_EQ(config->rope_theta, 100000.0);
  EXPECT_NEAR(config->rms_norm_eps, 1e-5, 1e-12);
  EXPECT_EQ(config->rope_scaling, RopeScalingType::kNone);
  EXPECT_TRUE(config->tied_embeddings);
  EXPECT_FALSE(config->attention_bias);
  EXPECT_FALSE(config->rope_freq_factors);
}

TEST(ModelConfigTest, ReadsTinyLlamaShapedConfigWithSeparateLmHead) {
  absl::StatusOr<ModelConfig> config = ConfigOf(TinyLlama());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name, "TinyLlama");
  EXPECT_EQ(config->num_layers, 22);
  EXPECT_EQ(config->hidden_size, 2048);
  EXPECT_EQ(config->intermediate_size, 5632);
  EXPECT_EQ(config->num_heads, 32);
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->vocab_size, 32000);
  EXPECT_EQ(config->context_length, 2048);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000.0);
  EXPECT_FALSE(config->tied_embeddings);
  EXPECT_FALSE(config->attention_bias);
}

TEST(ModelConfigTest, ReadsLlama3RopeScalingKeys) {
  GgufImageBuilder builder = Llama3();
  builder.KvString("llama.rope.scaling.type", "llama3")
      .KvF32("llama.rope.scaling.factor", 8.0f)
      .KvU32("llama.rope.scaling.original_context_length", 8192)
      .KvF32("llama.rope.scaling.low_freq_factor", 1.0f)
      .KvF32("llama.rope.scaling.high_freq_factor", 4.0f);
  absl::StatusOr<ModelConfig> config = ConfigOf(builder);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_heads, 32);
  EXPECT_EQ(config->num_kv_heads, 8);
  EXPECT_EQ(config->head_dim, 128);
  EXPECT_EQ(config->vocab_size, 128256);
  EXPECT_EQ(config->context_length, 131072);
  EXPECT_DOUBLE_EQ(config->rope_theta, 500000.0);
  EXPECT_EQ(config->rope_scaling, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(config->rope_scaling_factor, 8.0);
  EXPECT_EQ(config->rope_original_context_length, 8192);
  EXPECT_DOUBLE_EQ(config->rope_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(config->rope_high_freq_factor, 4.0);
  EXPECT_FALSE(config->rope_freq_factors);
  EXPECT_TRUE(config->tied_embeddings);  // no output.weight in this image
}

TEST(ModelConfigTest, RopeFreqsTensorMeansLlama3ScalingWithStoredFactors) {
  GgufImageBuilder builder = Llama3();
  builder.Tensor("rope_freqs.weight", {64}, kF32);
  absl::StatusOr<ModelConfig> config = ConfigOf(builder);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling, RopeScalingType::kLlama3);
  EXPECT_TRUE(config->rope_freq_factors);

  GgufImageBuilder wrong = Llama3();
  wrong.Tensor("rope_freqs.weight", {128}, kF32);
  ExpectInvalid(ConfigOf(wrong), {"rope_freqs.weight", "[128]", "[64]"});
}

TEST(ModelConfigTest, Llama3ScalingWithoutFactorsNeedsTheOriginalContext) {
  GgufImageBuilder builder = Llama3();
  builder.KvString("llama.rope.scaling.type", "llama3").KvF32("llama.rope.scaling.factor", 8.0f);
  ExpectInvalid(ConfigOf(builder), {"llama.rope.scaling.original_context_length", "is 0"});
}

// <arch>.attention.sliding_window with its pattern as a bool per layer, as a period (every
// N-th layer global), or absent (every layer local); a pattern of the wrong length refused.
TEST(ModelConfigTest, ReadsSlidingWindowLayers) {
  absl::StatusOr<ModelConfig> none = ConfigOf(TinyLlama());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->sliding_window, 0);
  EXPECT_EQ(none->LayerWindow(5), 0);

  GgufImageBuilder every = TinyLlama();
  every.KvU32("llama.attention.sliding_window", 4096);
  absl::StatusOr<ModelConfig> all = ConfigOf(every);
  ASSERT_TRUE(all.ok()) << all.status();
  for (int64_t l = 0; l < 22; ++l) EXPECT_EQ(all->LayerWindow(l), 4096) << l;

  GgufImageBuilder period = TinyLlama();
  period.KvU32("llama.attention.sliding_window", 512)
      .KvU32("llama.attention.sliding_window_pattern", 6);
  absl::StatusOr<ModelConfig> gemma3 = ConfigOf(period);
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  for (int64_t l = 0; l < 22; ++l)
    EXPECT_EQ(gemma3->LayerWindow(l), (l + 1) % 6 == 0 ? 0 : 512) << l;

  std::string flags;
  for (int l = 0; l < 22; ++l) flags += l % 2 == 0 ? '\1' : '\0';
  GgufImageBuilder alternating = TinyLlama();
  alternating.KvU32("llama.attention.sliding_window", 64)
      .Kv("llama.attention.sliding_window_pattern", GgufValueType::kArray,
          ArrayValue(GgufValueType::kBool, 22, flags));
  absl::StatusOr<ModelConfig> gemma2 = ConfigOf(alternating);
  ASSERT_TRUE(gemma2.ok()) << gemma2.status();
  for (int64_t l = 0; l < 22; ++l) EXPECT_EQ(gemma2->LayerWindow(l), l % 2 == 0 ? 64 : 0) << l;

  GgufImageBuilder short_pattern = TinyLlama();
  short_pattern.KvU32("llama.attention.sliding_window", 64)
      .Kv("llama.attention.sliding_window_pattern", GgufValueType::kArray,
          ArrayValue(GgufValueType::kBool, 3, std::string("\1\0\1")));
  EXPECT_EQ(ConfigOf(short_pattern).status().code(), absl::StatusCode::kInvalidArgument);
}

// SmolLM3-3B's GGUF keys (36 layers shrunk to 8): nothing says which layers rotate, so every
// 4th takes no RoPE (llama.cpp's rule); `loom.rope.layers` (from a config.json) overrides it.
TEST(ModelConfigTest, SmolLm3SkipsRopeOnEveryFourthLayer) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "smollm3")
      .KvU32("smollm3.context_length", 65536)
      .KvU32("smollm3.embedding_length", 2048)
      .KvU32("smollm3.feed_forward_length", 11008)
      .KvU32("smollm3.block_count", 8)
      .KvU32("smollm3.attention.head_count", 16)
      .KvU32("smollm3.attention.head_count_kv", 4)
      .KvF32("smollm3.attention.layer_norm_rms_epsilon", 1e-6f)
      .KvF32("smollm3.rope.freq_base", 5000000.0f)
      .KvU32("smollm3.vocab_size", 128256);
  absl::StatusOr<ModelConfig> config = ConfigOf(builder);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->rope_neox);  // llama's converter: permuted q/k rows
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(config->LayerRotates(l), (l + 1) % 4 != 0) << l;

  GgufImageBuilder listed = builder;
  listed.Kv("loom.rope.layers", GgufValueType::kArray,
            ArrayValue(GgufValueType::kBool, 8, std::string("\0\1\1\1\1\1\1\1", 8)));
  config = ConfigOf(listed);
  ASSERT_TRUE(config.ok()) << config.status();
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(config->LayerRotates(l), l != 0) << l;

  GgufImageBuilder every = builder;
  every.Kv("loom.rope.layers", GgufValueType::kArray,
           ArrayValue(GgufValueType::kBool, 8, std::string(8, '\1')));
  config = ConfigOf(every);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->rope_layers.empty());

  GgufImageBuilder short_list = builder;
  short_list.Kv("loom.rope.layers", GgufValueType::kArray,
                ArrayValue(GgufValueType::kBool, 3, std::string("\1\1\0", 3)));
  ExpectInvalid(ConfigOf(short_list), {"loom.rope.layers", "3 entries for 8 layers"});

  absl::StatusOr<ModelConfig> llama = ConfigOf(TinyLlama());
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_TRUE(llama->rope_layers.empty());
}

// Granite's GGUF keys, as llama.cpp's converter writes them; 0 is llama.cpp's "unset".
GgufImageBuilder Granite(float residual_scale, float attention_scale, float logit_scale) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "granite")
      .KvU32("granite.context_length", 4096)
      .KvU32("granite.embedding_length", 2048)
      .KvU32("granite.feed_forward_length", 8192)
      .KvU32("granite.block_count", 40)
      .KvU32("granite.attention.head_count", 32)
      .KvU32("granite.attention.head_count_kv", 8)
      .KvF32("granite.attention.layer_norm_rms_epsilon", 1e-5f)
      .KvU32("granite.vocab_size", 49155)
      .KvF32("granite.embedding_scale", 12.0f)
      .KvF32("granite.residual_scale", residual_scale)
      .KvF32("granite.attention.scale", attention_scale)
      .KvF32("granite.logit_scale", logit_scale);
  return builder;
}

TEST(ModelConfigTest, ReadsGraniteMultipliers) {
  absl::StatusOr<ModelConfig> config = ConfigOf(Granite(0.22f, 0.015625f, 8.0f));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->rope_neox);
  EXPECT_FLOAT_EQ(config->embedding_scale, 12.0f);
  EXPECT_FLOAT_EQ(config->residual_scale, 0.22f);
  EXPECT_DOUBLE_EQ(config->attention_scale, 0.015625);
  EXPECT_FLOAT_EQ(config->logit_scale, 8.0f);

  config = ConfigOf(Granite(0.0f, 0.0f, 8.0f));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FLOAT_EQ(config->residual_scale, 1.0f);
  EXPECT_DOUBLE_EQ(config->attention_scale, 0.0);  // 1 / sqrt(head_dim) in the graph

  ExpectInvalid(ConfigOf(Granite(0.22f, 0.015625f, -2.0f)), {"granite.logit_scale", "positive"});

  absl::StatusOr<ModelConfig> llama = ConfigOf(TinyLlama());
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->residual_scale, 1.0f);
  EXPECT_EQ(llama->logit_scale, 1.0f);
  EXPECT_EQ(llama->embedding_scale, 1.0f);
}

// gpt-oss-20b as llama.cpp's converter writes it: no key for its SwiGLU limit or its local
// layers' period (both the architecture's rules), its tensors saying sinks and biases, and
// post_attention_norm meaning its FFN norm rather than Gemma's post norms.
GgufImageBuilder GptOss(uint64_t sinks = 64) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "gpt-oss")
      .KvU32("gpt-oss.context_length", 131072)
      .KvU32("gpt-oss.embedding_length", 2880)
      .KvU32("gpt-oss.feed_forward_length", 2880)
      .KvU32("gpt-oss.expert_feed_forward_length", 2880)
      .KvU32("gpt-oss.expert_count", 32)
      .KvU32("gpt-oss.expert_used_count", 4)
      .KvU32("gpt-oss.block_count", 24)
      .KvU32("gpt-oss.attention.head_count", 64)
      .KvU32("gpt-oss.attention.head_count_kv", 8)
      .KvU32("gpt-oss.attention.key_length", 64)
      .KvU32("gpt-oss.attention.value_length", 64)
      .KvU32("gpt-oss.attention.sliding_window", 128)
      .KvF32("gpt-oss.attention.layer_norm_rms_epsilon", 1e-5f)
      .KvF32("gpt-oss.rope.freq_base", 150000.0f)
      .KvString("gpt-oss.rope.scaling.type", "yarn")
      .KvF32("gpt-oss.rope.scaling.factor", 32.0f)
      .KvU32("gpt-oss.rope.scaling.original_context_length", 4096)
      .KvU32("gpt-oss.vocab_size", 201088)
      .Tensor("blk.0.attn_sinks.weight", {sinks}, kF32)
      .Tensor("blk.0.attn_output.bias", {2880}, kF32)
      .Tensor("blk.0.post_attention_norm.weight", {2880}, kF32)
      .Tensor("blk.0.ffn_gate_inp.bias", {32}, kF32)
      .Tensor("blk.0.ffn_gate_exps.bias", {2880, 32}, kF32)
      .Tensor("blk.0.ffn_up_exps.bias", {2880, 32}, kF32)
      .Tensor("blk.0.ffn_down_exps.bias", {2880, 32}, kF32);
  return builder;
}

TEST(ModelConfigTest, ReadsGptOss) {
  absl::StatusOr<ModelConfig> config = ConfigOf(GptOss());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->rope_neox);
  EXPECT_TRUE(config->attention_sinks);
  EXPECT_TRUE(config->attention_output_bias);
  EXPECT_TRUE(config->expert_bias);
  EXPECT_FALSE(config->post_norms);
  EXPECT_FLOAT_EQ(config->swiglu_limit, 7.0f);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->LayerWindow(0), 128);
  EXPECT_EQ(config->LayerWindow(1), 0);
  EXPECT_EQ(config->LayerWindow(22), 128);
  EXPECT_EQ(config->rope_scaling, RopeScalingType::kYarn);

  GgufImageBuilder override = GptOss();
  override.KvF32("loom.swiglu_limit", 1.5f);
  config = ConfigOf(override);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FLOAT_EQ(config->swiglu_limit, 1.5f);

  ExpectInvalid(ConfigOf(GptOss(/*sinks=*/8)), {"blk.0.attn_sinks.weight"});
  // The clamped SwiGLU and a router bias need experts.
  GgufImageBuilder dense = TinyLlama();
  dense.KvF32("loom.swiglu_limit", 7.0f);
  EXPECT_EQ(ConfigOf(dense).status().code(), absl::StatusCode::kUnimplemented);
  GgufImageBuilder router = TinyLlama();
  router.Tensor("blk.0.ffn_gate_inp.bias", {8}, kF32);
  ExpectInvalid(ConfigOf(router), {"ffn_gate_inp.bias"});
}

// Qwen3-30B-A3B's experts: 128 of 768 channels beside a dense width of 6144, 8 per token;
// Mixtral's: llama keys with expert_count, the dense width being the experts'.
TEST(ModelConfigTest, ReadsMixtureOfExpertsKeys) {
  GgufImageBuilder qwen3moe;
  qwen3moe.KvString("general.architecture", "qwen3moe")
      .KvU32("qwen3moe.context_length", 40960)
      .KvU32("qwen3moe.embedding_length", 2048)
      .KvU32("qwen3moe.feed_forward_length", 6144)
      .KvU32("qwen3moe.expert_feed_forward_length", 768)
      .KvU32("qwen3moe.expert_count", 128)
      .KvU32("qwen3moe.expert_used_count", 8)
      .KvU32("qwen3moe.block_count", 48)
      .KvU32("qwen3moe.attention.head_count", 32)
      .KvU32("qwen3moe.attention.head_count_kv", 4)
      .KvU32("qwen3moe.attention.key_length", 128)
      .KvU32("qwen3moe.vocab_size", 151936);
  absl::StatusOr<ModelConfig> config = ConfigOf(qwen3moe);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_experts, 128);
  EXPECT_EQ(config->num_experts_used, 8);
  EXPECT_EQ(config->intermediate_size, 768);
  EXPECT_TRUE(config->expert_weights_norm);
  EXPECT_TRUE(config->rope_neox);

  GgufImageBuilder mixtral = TinyLlama();
  mixtral.KvU32("llama.expert_count", 8).KvU32("llama.expert_used_count", 2);
  config = ConfigOf(mixtral);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_experts, 8);
  EXPECT_EQ(config->intermediate_size, 5632);

  GgufImageBuilder unnormalized = TinyLlama();
  unnormalized.KvU32("llama.expert_count", 8)
      .KvU32("llama.expert_used_count", 1)
      .KvBool("llama.expert_weights_norm", false);
  config = ConfigOf(unnormalized);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->expert_weights_norm);

  GgufImageBuilder dense = TinyLlama();
  EXPECT_EQ(ConfigOf(dense)->num_experts, 0);
}

// Qwen1.5-MoE-A2.7B-shaped: 60 experts of 1408 channels, 4 per token, and a shared expert of
// 5632 beside them, scaled by its sigmoid gate.
GgufImageBuilder Qwen2Moe(bool width_keys, std::vector<uint64_t> gate_shape) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "qwen2moe")
      .KvU32("qwen2moe.context_length", 8192)
      .KvU32("qwen2moe.embedding_length", 2048)
      .KvU32("qwen2moe.feed_forward_length", 5632)
      .KvU32("qwen2moe.expert_count", 60)
      .KvU32("qwen2moe.expert_used_count", 4)
      .KvU32("qwen2moe.block_count", 24)
      .KvU32("qwen2moe.attention.head_count", 16)
      .KvU32("qwen2moe.attention.head_count_kv", 16)
      .KvU32("qwen2moe.vocab_size", 151936)
      .Tensor("blk.0.ffn_gate_shexp.weight", {2048, 5632}, kQ1_0)
      .Tensor("blk.0.ffn_up_shexp.weight", {2048, 5632}, kQ1_0)
      .Tensor("blk.0.ffn_down_shexp.weight", {5632, 2048}, kQ1_0);
  if (width_keys) {
    builder.KvU32("qwen2moe.expert_feed_forward_length", 1408)
        .KvU32("qwen2moe.expert_shared_feed_forward_length", 5632);
  }
  if (!gate_shape.empty()) builder.Tensor("blk.0.ffn_gate_inp_shexp.weight", gate_shape, kF32);
  return builder;
}

// The widths from the keys, or llama.cpp's rules without them (experts of feed_forward_length
// / expert_used_count, a shared expert of feed_forward_length); the routed weights not
// renormalized unless the file says; the gate as llama.cpp declares it ([hidden]) or as
// converters write it ([1, hidden]).
TEST(ModelConfigTest, ReadsQwen2MoeSharedExpert) {
  for (bool width_keys : {true, false}) {
    for (const std::vector<uint64_t>& gate :
         {std::vector<uint64_t>{2048}, std::vector<uint64_t>{2048, 1}}) {
      SCOPED_TRACE(::testing::Message() << "keys " << width_keys << ", gate dims " << gate.size());
      absl::StatusOr<ModelConfig> config = ConfigOf(Qwen2Moe(width_keys, gate));
      ASSERT_TRUE(config.ok()) << config.status();
      EXPECT_EQ(config->num_experts, 60);
      EXPECT_EQ(config->intermediate_size, 1408);
      EXPECT_EQ(config->shared_expert_intermediate_size, 5632);
      EXPECT_TRUE(config->shared_expert_gated);
      EXPECT_FALSE(config->expert_weights_norm);
      EXPECT_TRUE(config->rope_neox);
    }
  }
  GgufImageBuilder normalized = Qwen2Moe(true, {2048});
  normalized.KvBool("qwen2moe.expert_weights_norm", true);
  EXPECT_TRUE(ConfigOf(normalized)->expert_weights_norm);
  // Without the gate tensor the shared expert joins unscaled.
  absl::StatusOr<ModelConfig> ungated = ConfigOf(Qwen2Moe(true, {}));
  ASSERT_TRUE(ungated.ok()) << ungated.status();
  EXPECT_EQ(ungated->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(ungated->shared_expert_gated);
  // A routed-only qwen2moe file has no shared expert.
  GgufImageBuilder routed;
  routed.KvString("general.architecture", "qwen2moe")
      .KvU32("qwen2moe.context_length", 8192)
      .KvU32("qwen2moe.embedding_length", 2048)
      .KvU32("qwen2moe.feed_forward_length", 5632)
      .KvU32("qwen2moe.expert_feed_forward_length", 1408)
      .KvU32("qwen2moe.expert_count", 60)
      .KvU32("qwen2moe.expert_used_count", 4)
      .KvU32("qwen2moe.block_count", 24)
      .KvU32("qwen2moe.attention.head_count", 16)
      .KvU32("qwen2moe.vocab_size", 151936);
  EXPECT_EQ(ConfigOf(routed)->shared_expert_intermediate_size, 0);
}

TEST(ModelConfigTest, RefusesMisshapenSharedExperts) {
  ExpectInvalid(ConfigOf(Qwen2Moe(true, {2048, 2})), {"blk.0.ffn_gate_inp_shexp.weight"});
  ExpectInvalid(ConfigOf(Qwen2Moe(true, {1024})), {"blk.0.ffn_gate_inp_shexp.weight"});
  GgufImageBuilder narrow = Qwen2Moe(false, {2048});
  narrow.KvU32("qwen2moe.expert_shared_feed_forward_length", 4096);
  ExpectInvalid(ConfigOf(narrow), {"blk.0.ffn_gate_shexp.weight", "4096"});
  GgufImageBuilder dense = TinyLlama();
  dense.Tensor("blk.0.ffn_up_shexp.weight", {2048, 5632}, kQ1_0);
  ExpectInvalid(ConfigOf(dense), {"shared expert", "without experts"});
  GgufImageBuilder half = TinyLlama();
  half.KvU32("llama.expert_count", 8)
      .KvU32("llama.expert_used_count", 2)
      .Tensor("blk.0.ffn_up_shexp.weight", {2048, 5632}, kQ1_0);
  ExpectInvalid(ConfigOf(half), {"ffn_gate_shexp"});
  // A shared width without the expert's tensors, in a file with layers.
  GgufImageBuilder missing = TinyLlama();
  missing.KvU32("llama.expert_count", 8)
      .KvU32("llama.expert_used_count", 2)
      .KvU32("llama.expert_shared_feed_forward_length", 256)
      .Tensor("blk.0.attn_norm.weight", {2048}, kF32);
  ExpectInvalid(ConfigOf(missing),
                {"llama.expert_shared_feed_forward_length", "256", "no shared expert"});
}

TEST(ModelConfigTest, RefusesExpertCountsOutOfRangeAndSharedExperts) {
  GgufImageBuilder too_many = TinyLlama();
  too_many.KvU32("llama.expert_count", 8).KvU32("llama.expert_used_count", 9);
  ExpectInvalid(ConfigOf(too_many), {"llama.expert_used_count", "9"});
  GgufImageBuilder missing = TinyLlama();
  missing.KvU32("llama.expert_count", 8);
  ExpectInvalid(ConfigOf(missing), {"llama.expert_used_count", "missing"});
  GgufImageBuilder one = TinyLlama();
  one.KvU32("llama.expert_count", 1).KvU32("llama.expert_used_count", 1);
  ExpectInvalid(ConfigOf(one), {"llama.expert_count"});
  // A count of shared experts without their tensors, in a file with layers.
  GgufImageBuilder shared = TinyLlama();
  shared.KvU32("llama.expert_count", 8)
      .KvU32("llama.expert_used_count", 2)
      .KvU32("llama.expert_shared_count", 1)
      .Tensor("blk.0.attn_norm.weight", {2048}, kF32);
  ExpectInvalid(ConfigOf(shared), {"llama.expert_shared_count", "no shared expert"});
}

// GLM-4.5-Air-shaped: 46 layers and a multi-token-prediction one (block_count 47), the first
// dense (10944 channels), the rest 128 experts of 1408 channels, 8 per token, chosen by sigmoid
// scores with a per-expert bias, beside one ungated shared expert; half of each head rotating.
struct Glm45Keys {
  uint32_t block_count = 47;
  uint32_t leading_dense = 1;
  uint32_t nextn = 1;
  float scale = 1.0f;
  uint64_t bias_size = 128;
};

GgufImageBuilder Glm45Air(const Glm45Keys& keys = {}) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "glm4moe")
      .KvU32("glm4moe.context_length", 131072)
      .KvU32("glm4moe.embedding_length", 4096)
      .KvU32("glm4moe.feed_forward_length", 10944)
      .KvU32("glm4moe.expert_feed_forward_length", 1408)
      .KvU32("glm4moe.expert_count", 128)
      .KvU32("glm4moe.expert_used_count", 8)
      .KvU32("glm4moe.expert_shared_count", 1)
      .KvU32("glm4moe.leading_dense_block_count", keys.leading_dense)
      .KvU32("glm4moe.nextn_predict_layers", keys.nextn)
      .KvBool("glm4moe.expert_weights_norm", true)
      .KvF32("glm4moe.expert_weights_scale", keys.scale)
      .KvU32("glm4moe.block_count", keys.block_count)
      .KvU32("glm4moe.attention.head_count", 96)
      .KvU32("glm4moe.attention.head_count_kv", 8)
      .KvU32("glm4moe.attention.key_length", 128)
      .KvU32("glm4moe.rope.dimension_count", 64)
      .KvU32("glm4moe.vocab_size", 151552)
      .Tensor("blk.0.ffn_gate.weight", {4096, 10944}, kQ1_0)
      .Tensor("blk.0.ffn_up.weight", {4096, 10944}, kQ1_0)
      .Tensor("blk.1.ffn_gate_inp.weight", {4096, 128}, kF32)
      .Tensor("blk.1.exp_probs_b.bias", {keys.bias_size}, kF32)
      .Tensor("blk.1.ffn_gate_shexp.weight", {4096, 1408}, kQ1_0)
      .Tensor("blk.1.ffn_up_shexp.weight", {4096, 1408}, kQ1_0)
      .Tensor("blk.1.ffn_down_shexp.weight", {1408, 4096}, kQ1_0);
  for (int l = 0; l < 47; ++l) {
    builder.Tensor(absl::StrCat("blk.", l, ".attn_norm.weight"), {4096}, kF32);
  }
  return builder;
}

TEST(ModelConfigTest, ReadsGlm45DenseLayersSigmoidRoutingAndNextnLayers) {
  absl::StatusOr<ModelConfig> config = ConfigOf(Glm45Air());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_layers, 46);
  EXPECT_EQ(config->nextn_layers, 1);
  EXPECT_EQ(config->leading_dense_layers, 1);
  EXPECT_EQ(config->dense_intermediate_size, 10944);
  EXPECT_EQ(config->DenseFfnWidth(), 10944);
  EXPECT_EQ(config->intermediate_size, 1408);
  EXPECT_FALSE(config->LayerHasExperts(0));
  EXPECT_TRUE(config->LayerHasExperts(1));
  EXPECT_EQ(config->shared_expert_intermediate_size, 1408);  // 1 x the experts' width
  EXPECT_FALSE(config->shared_expert_gated);
  EXPECT_TRUE(config->expert_sigmoid);  // glm4moe's default
  EXPECT_TRUE(config->expert_selection_bias);
  EXPECT_TRUE(config->expert_weights_norm);
  EXPECT_FLOAT_EQ(config->expert_weights_scale, 1.0f);
  EXPECT_EQ(config->rope_dim, 64);
  EXPECT_TRUE(config->rope_neox);
  // GLM-4.5's scale; a softmax said by the file; a dense model's width is its own.
  GgufImageBuilder scaled = Glm45Air({.scale = 2.5f});
  scaled.KvU32("glm4moe.expert_gating_func", 1);
  config = ConfigOf(scaled);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FLOAT_EQ(config->expert_weights_scale, 2.5f);
  EXPECT_FALSE(config->expert_sigmoid);
  EXPECT_EQ(ConfigOf(TinyLlama())->DenseFfnWidth(), 5632);
}

// DeepSeek-V2-Lite's keys as llama.cpp's converter writes them (decompressed widths as
// key_length / value_length), or (absorbed) DeepSeek-V3's: the latent's widths there, the
// decompressed ones as *_mla and one KV head.
struct DeepSeekKeys {
  bool absorbed = false;
  uint32_t kv_lora_rank = 512;
  uint32_t value_length = 128;
  uint32_t q_lora_rank = 0;  // 0: no key
};

GgufImageBuilder DeepSeekV2Lite(const DeepSeekKeys& keys = {}) {
  const bool absorbed = keys.absorbed;
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "deepseek2")
      .KvU32("deepseek2.context_length", 163840)
      .KvU32("deepseek2.embedding_length", 2048)
      .KvU32("deepseek2.feed_forward_length", 10944)
      .KvU32("deepseek2.expert_feed_forward_length", 1408)
      .KvU32("deepseek2.expert_count", 64)
      .KvU32("deepseek2.expert_used_count", 6)
      .KvU32("deepseek2.expert_shared_count", 2)
      .KvU32("deepseek2.leading_dense_block_count", 1)
      .KvF32("deepseek2.expert_weights_scale", 1.0f)
      .KvU32("deepseek2.block_count", 27)
      .KvU32("deepseek2.attention.head_count", 16)
      .KvU32("deepseek2.attention.head_count_kv", absorbed ? 1 : 16)
      .KvU32("deepseek2.attention.kv_lora_rank", keys.kv_lora_rank)
      .KvU32("deepseek2.attention.key_length", absorbed ? 576 : 192)
      .KvU32("deepseek2.attention.value_length", absorbed ? 512 : keys.value_length)
      .KvU32("deepseek2.rope.dimension_count", 64)
      .KvString("deepseek2.rope.scaling.type", "yarn")
      .KvF32("deepseek2.rope.scaling.factor", 40.0f)
      .KvU32("deepseek2.rope.scaling.original_context_length", 4096)
      .KvF32("deepseek2.rope.scaling.yarn_log_multiplier", 0.0707f)
      .KvU32("deepseek2.vocab_size", 102400)
      .Tensor("blk.1.ffn_gate_inp.weight", {2048, 64}, kF32)
      .Tensor("blk.1.ffn_gate_shexp.weight", {2048, 2816}, kQ1_0)
      .Tensor("blk.1.ffn_up_shexp.weight", {2048, 2816}, kQ1_0)
      .Tensor("blk.1.ffn_down_shexp.weight", {2816, 2048}, kQ1_0);
  if (absorbed) {
    builder.KvU32("deepseek2.attention.key_length_mla", 192)
        .KvU32("deepseek2.attention.value_length_mla", keys.value_length);
  }
  if (keys.q_lora_rank > 0) builder.KvU32("deepseek2.attention.q_lora_rank", keys.q_lora_rank);
  for (int l = 0; l < 27; ++l) {
    builder.Tensor(absl::StrCat("blk.", l, ".attn_norm.weight"), {2048}, kF32);
  }
  return builder;
}

TEST(ModelConfigTest, ReadsDeepSeekLatentAttentionAndItsYarnScale) {
  absl::StatusOr<ModelConfig> config;
  for (const bool absorbed : {false, true}) {
    SCOPED_TRACE(absorbed ? "absorbed" : "decompressed");
    config = ConfigOf(DeepSeekV2Lite({.absorbed = absorbed}));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(config->mla());
    EXPECT_EQ(config->mla_kv_lora_rank, 512);
    EXPECT_EQ(config->mla_q_lora_rank, 0);
    EXPECT_EQ(config->mla_nope_dim, 128);
    EXPECT_EQ(config->mla_value_dim, 128);
    // The KV pool's one head: the rotary key part beside the latent.
    EXPECT_EQ(config->head_dim, 64 + 512);
    EXPECT_EQ(config->num_kv_heads, 1);
    EXPECT_EQ(config->rope_dim, 64);
    EXPECT_FALSE(config->rope_neox);            // interleaved pairs
    EXPECT_FALSE(config->expert_weights_norm);  // deepseek2's default
    EXPECT_FALSE(config->expert_sigmoid);
    EXPECT_EQ(config->shared_expert_intermediate_size, 2816);
    // m = 1 + 0.0707 ln 40 multiplies the softmax scale twice; cos and sin stay unscaled.
    const double m = 1.0 + static_cast<double>(0.0707f) * std::log(40.0);
    EXPECT_NEAR(config->attention_scale, m * m / std::sqrt(192.0), 1e-9);
    EXPECT_DOUBLE_EQ(config->rope_attention_factor, 1.0);
  }
  EXPECT_EQ(ConfigOf(DeepSeekV2Lite({.q_lora_rank = 1536}))->mla_q_lora_rank, 1536);
  EXPECT_EQ(ConfigOf(DeepSeekV2Lite())->expert_groups, 1);
  // DeepSeek-V3's grouped routing: 8 groups, the best 4 used.
  GgufImageBuilder grouped = DeepSeekV2Lite();
  grouped.KvU32("deepseek2.expert_group_count", 8).KvU32("deepseek2.expert_group_used_count", 4);
  config = ConfigOf(grouped);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->expert_groups, 8);
  EXPECT_EQ(config->expert_groups_used, 4);
}

TEST(ModelConfigTest, RefusesDeepSeekLatentAttentionWithoutItsWidths) {
  ExpectInvalid(ConfigOf(DeepSeekV2Lite({.value_length = 256})),
                {"deepseek2.attention.value_length", "256"});
  ExpectInvalid(ConfigOf(DeepSeekV2Lite({.absorbed = true, .value_length = 256})),
                {"deepseek2.attention.value_length_mla", "256"});
  ExpectInvalid(ConfigOf(DeepSeekV2Lite({.kv_lora_rank = 0})),
                {"deepseek2.attention.kv_lora_rank"});
}

TEST(ModelConfigTest, RefusesGlm45RoutingItCannotRun) {
  GgufImageBuilder gating = Glm45Air();
  gating.KvU32("glm4moe.expert_gating_func", 3);
  absl::StatusOr<ModelConfig> config = ConfigOf(gating);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnimplemented) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("expert_gating_func"));
  // Groups need their used count, dividing the experts, holding the top-k.
  GgufImageBuilder grouped = Glm45Air();
  grouped.KvU32("glm4moe.expert_group_count", 8);
  ExpectInvalid(ConfigOf(grouped), {"glm4moe.expert_group_used_count"});
  GgufImageBuilder uneven = Glm45Air();
  uneven.KvU32("glm4moe.expert_group_count", 3).KvU32("glm4moe.expert_group_used_count", 1);
  ExpectInvalid(ConfigOf(uneven), {"glm4moe.expert_group_count", "3", "128"});
  GgufImageBuilder narrow = Glm45Air();
  narrow.KvU32("glm4moe.expert_group_count", 64).KvU32("glm4moe.expert_group_used_count", 2);
  ExpectInvalid(ConfigOf(narrow), {"8 experts per token", "glm4moe.expert_group_used_count"});
  ExpectInvalid(ConfigOf(Glm45Air({.bias_size = 64})), {"blk.1.exp_probs_b.bias"});
  GgufImageBuilder interleaved = Glm45Air();
  interleaved.KvU32("glm4moe.interleave_moe_layer_step", 2);
  config = ConfigOf(interleaved);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnimplemented) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("interleave_moe_layer_step"));
  ExpectInvalid(ConfigOf(Glm45Air({.leading_dense = 46})),
                {"glm4moe.leading_dense_block_count", "46"});
  ExpectInvalid(ConfigOf(Glm45Air({.nextn = 47})), {"glm4moe.nextn_predict_layers", "47"});
  // block_count must count the multi-token-prediction layer's tensors too.
  ExpectInvalid(ConfigOf(Glm45Air({.block_count = 46})), {"glm4moe.block_count", "46"});
}

// OLMo-2-7B-shaped (olmo2): no attn_norm or ffn_norm, post_attention_norm and post_ffw_norm,
// a QK-norm as wide as all heads; with a window (OLMo 3, no pattern key) every 4th layer is
// global. OLMoE-1B-7B-shaped (olmoe): the same QK-norm, 64 experts, 8 per token, their
// weights not renormalized (the architecture's default).
GgufImageBuilder Olmo2(uint32_t window, uint64_t q_norm = 4096) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "olmo2")
      .KvU32("olmo2.context_length", 4096)
      .KvU32("olmo2.embedding_length", 4096)
      .KvU32("olmo2.feed_forward_length", 11008)
      .KvU32("olmo2.block_count", 8)
      .KvU32("olmo2.attention.head_count", 32)
      .KvU32("olmo2.attention.head_count_kv", 32)
      .KvU32("olmo2.vocab_size", 100352)
      .Tensor("blk.0.attn_q_norm.weight", {q_norm}, kF32)
      .Tensor("blk.0.attn_k_norm.weight", {q_norm == 4096 ? 4096u : 128u}, kF32)
      .Tensor("blk.0.post_ffw_norm.weight", {4096}, kF32);
  for (int l = 0; l < 8; ++l) {
    builder.Tensor(absl::StrCat("blk.", l, ".post_attention_norm.weight"), {4096}, kF32);
  }
  if (window > 0) builder.KvU32("olmo2.attention.sliding_window", window);
  return builder;
}

TEST(ModelConfigTest, ReadsOlmoNormsAndWindows) {
  absl::StatusOr<ModelConfig> config = ConfigOf(Olmo2(0));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->pre_norms);
  EXPECT_TRUE(config->post_norms);
  EXPECT_TRUE(config->qk_norm);
  EXPECT_TRUE(config->qk_norm_full);
  EXPECT_TRUE(config->rope_neox);
  EXPECT_EQ(config->sliding_window, 0);
  config = ConfigOf(Olmo2(4096));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window, 4096);
  EXPECT_EQ(config->sliding_layers,
            std::vector<bool>({true, true, true, false, true, true, true, false}));
  // A per-head QK-norm (Qwen3's) is per head; any other width is refused.
  config = ConfigOf(Olmo2(0, 128));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->qk_norm_full);
  ExpectInvalid(ConfigOf(Olmo2(0, 2048)), {"blk.0.attn_q_norm.weight"});
  // Its layers are counted by their post-attention norms.
  GgufImageBuilder extra = Olmo2(0);
  extra.Tensor("blk.8.post_attention_norm.weight", {4096}, kF32);
  ExpectInvalid(ConfigOf(extra), {"olmo2.block_count", "blk.8.post_attention_norm.weight present"});

  GgufImageBuilder olmoe;
  olmoe.KvString("general.architecture", "olmoe")
      .KvU32("olmoe.context_length", 4096)
      .KvU32("olmoe.embedding_length", 2048)
      .KvU32("olmoe.feed_forward_length", 1024)
      .KvU32("olmoe.block_count", 1)
      .KvU32("olmoe.attention.head_count", 16)
      .KvU32("olmoe.expert_count", 64)
      .KvU32("olmoe.expert_used_count", 8)
      .KvU32("olmoe.vocab_size", 50304)
      .Tensor("blk.0.attn_norm.weight", {2048}, kF32)
      .Tensor("blk.0.attn_q_norm.weight", {2048}, kF32)
      .Tensor("blk.0.attn_k_norm.weight", {2048}, kF32);
  config = ConfigOf(olmoe);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->pre_norms);
  EXPECT_TRUE(config->qk_norm_full);
  EXPECT_EQ(config->num_experts, 64);
  EXPECT_EQ(config->intermediate_size, 1024);
  EXPECT_FALSE(config->expert_weights_norm);
}

// Phi-3-mini-128k-shaped: fused attn_qkv and gate/up, longrope factors as tensors. The long
// factors serve a context beyond the pre-training one (llama.cpp's choice), with the
// attention factor of the file or sqrt(1 + ln(s) / ln(original)).
GgufImageBuilder Phi3(uint32_t context) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "phi3")
      .KvU32("phi3.context_length", context)
      .KvU32("phi3.embedding_length", 3072)
      .KvU32("phi3.feed_forward_length", 8192)
      .KvU32("phi3.block_count", 32)
      .KvU32("phi3.attention.head_count", 32)
      .KvU32("phi3.attention.head_count_kv", 32)
      .KvU32("phi3.rope.dimension_count", 96)
      .KvU32("phi3.rope.scaling.original_context_length", 4096)
      .KvU32("phi3.vocab_size", 32064)
      .Tensor("rope_factors_long.weight", {48}, kF32)
      .Tensor("rope_factors_short.weight", {48}, kF32)
      .Tensor("blk.0.attn_qkv.weight", {3072, 9216}, kF32)
      .Tensor("blk.0.ffn_up.weight", {3072, 16384}, kF32);
  return builder;
}

TEST(ModelConfigTest, ReadsPhi3FusedTensorsAndLongRope) {
  absl::StatusOr<ModelConfig> long_context = ConfigOf(Phi3(131072));
  ASSERT_TRUE(long_context.ok()) << long_context.status();
  EXPECT_EQ(long_context->rope_scaling, RopeScalingType::kLongRope);
  EXPECT_EQ(long_context->rope_factors_tensor, "rope_factors_long.weight");
  EXPECT_TRUE(long_context->rope_neox);
  EXPECT_NEAR(long_context->rope_attention_factor,
              std::sqrt(1.0 + std::log(32.0) / std::log(4096.0)), 1e-12);

  GgufImageBuilder with_factor = Phi3(131072);
  with_factor.KvF32("phi3.rope.scaling.attn_factor", 1.25f);
  EXPECT_DOUBLE_EQ(ConfigOf(with_factor)->rope_attention_factor, 1.25);

  absl::StatusOr<ModelConfig> short_context = ConfigOf(Phi3(4096));
  ASSERT_TRUE(short_context.ok()) << short_context.status();
  EXPECT_EQ(short_context->rope_factors_tensor, "rope_factors_short.weight");
  EXPECT_DOUBLE_EQ(short_context->rope_attention_factor, 1.0);

  GgufImageBuilder wrong = Phi3(4096);
  wrong.Tensor("blk.0.ffn_gate.weight", {3072, 8192}, kF32);  // then ffn_up is not fused
  ExpectInvalid(ConfigOf(wrong), {"blk.0.ffn_up.weight"});
}

TEST(ModelConfigTest, ReadsLinearRopeScaling) {
  GgufImageBuilder builder = Llama3();
  builder.KvString("llama.rope.scaling.type", "linear").KvF32("llama.rope.scaling.factor", 4.0f);
  absl::StatusOr<ModelConfig> config = ConfigOf(builder);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(config->rope_scaling_factor, 4.0);
}

TEST(ModelConfigTest, ReadsQwen2WithAttentionBias) {
  absl::StatusOr<ModelConfig> config = ConfigOf(Qwen2());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "qwen2");
  EXPECT_EQ(config->num_layers, 24);
  EXPECT_EQ(config->hidden_size, 896);
  EXPECT_EQ(config->num_heads, 14);
  EXPECT_EQ(config->num_kv_heads, 2);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->vocab_size, 151936);
  EXPECT_NEAR(config->rms_norm_eps, 1e-6, 1e-12);
  EXPECT_DOUBLE_EQ(config->rope_theta, 1000000.0);
  EXPECT_TRUE(config->attention_bias);
  EXPECT_TRUE(config->tied_embeddings);

  absl::StatusOr<ModelConfig> without = ConfigOf(Qwen2(/*with_bias=*/false));
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_FALSE(without->attention_bias);
}

TEST(ModelConfigTest, DefaultsKvHeadsHeadDimAndRopeDim) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "mistral")
      .KvU32("mistral.context_length", 4096)
      .KvU32("mistral.embedding_length", 256)
      .KvU32("mistral.feed_forward_length", 512)
      .KvU32("mistral.block_count", 2)
      .KvU32("mistral.attention.head_count", 4)
      .KvU32("mistral.vocab_size", 1000);
  absl::StatusOr<ModelConfig> config = ConfigOf(builder);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->rope_dim, 64);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-5);
}

TEST(ModelConfigTest, ExplicitKeyLengthOverridesHiddenOverHeads) {
  GgufImageBuilder builder = Qwen2(false);
  builder.KvU32("qwen2.attention.key_length", 128).KvU32("qwen2.attention.value_length", 128);
  absl::StatusOr<ModelConfig> config = ConfigOf(builder);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->head_dim, 128);
}

TEST(ModelConfigTest, RejectsMissingOrUnsupportedArchitecture) {
  ExpectInvalid(ConfigOf(GgufImageBuilder().KvU32("llama.block_count", 2)),
                {"general.architecture", "missing"});
  ExpectInvalid(ConfigOf(GgufImageBuilder().KvString("general.architecture", "gpt2")),
                {"unsupported architecture 'gpt2'", "llama"});
  ExpectInvalid(ConfigOf(GgufImageBuilder().KvU32("general.architecture", 1)),
                {"general.architecture"});
}

TEST(ModelConfigTest, RejectsMissingRequiredKeysByName) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "llama")
      .KvU32("llama.context_length", 2048)
      .KvU32("llama.feed_forward_length", 5632);
  ExpectInvalid(ConfigOf(builder), {"'llama.embedding_length'", "missing"});
}

TEST(ModelConfigTest, RejectsInconsistentHeadCounts) {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "llama")
      .KvU32("llama.context_length", 2048)
      .KvU32("llama.embedding_length", 2048)
      .KvU32("llama.feed_forward_length", 5632)
      .KvU32("llama.block_count", 22)
      .KvU32("llama.attention.head_count", 32)
      .KvU32("llama.attention.head_count_kv", 5)
      .KvU32("llama.vocab_size", 32000);
  ExpectInvalid(ConfigOf(builder), {"head_count 32", "head_count_kv 5"});

  GgufImageBuilder more_kv;
  more_kv.KvString("general.architecture", "llama")
      .KvU32("llama.context_length", 2048)
      .KvU32("llama.embedding_length", 2048)
      .KvU32("llama.feed_forward_length", 5632)
      .KvU32("llama.block_count", 22)
      .KvU32("llama.attention.head_count", 8)
      .KvU32("llama.attention.head_count_kv", 16)
      .KvU32("llama.vocab_size", 32000);
  ExpectInvalid(ConfigOf(more_kv), {"llama.attention.head_count_kv", "is 16"});

  GgufImageBuilder not_dividing_hidden;
  not_dividing_hidden.KvString("general.architecture", "llama")
      .KvU32("llama.context_length", 2048)
      .KvU32("llama.embedding_length", 1000)
      .KvU32("llama.feed_forward_length", 5632)
      .KvU32("llama.block_count", 22)
      .KvU32("llama.attention.head_count", 3)
      .KvU32("llama.vocab_size", 32000);
  ExpectInvalid(ConfigOf(not_dividing_hidden), {"embedding_length 1000", "head_count 3"});
}

GgufImageBuilder MinimalLlama() {
  GgufImageBuilder builder;
  builder.KvString("general.architecture", "llama")
      .KvU32("llama.context_length", 2048)
      .KvU32("llama.embedding_length", 256)
      .KvU32("llama.feed_forward_length", 512)
      .KvU32("llama.block_count", 2)
      .KvU32("llama.attention.head_count", 4);
  return builder;
}

TEST(ModelConfigTest, RejectsOutOfRangeAndWronglyTypedValues) {
  GgufImageBuilder negative = MinimalLlama();
  negative.KvI32("llama.attention.head_count_kv", -1).KvU32("llama.vocab_size", 10);
  ExpectInvalid(ConfigOf(negative), {"llama.attention.head_count_kv", "is -1"});

  GgufImageBuilder zero_eps = MinimalLlama();
  zero_eps.KvF32("llama.attention.layer_norm_rms_epsilon", 0.0f).KvU32("llama.vocab_size", 10);
  ExpectInvalid(ConfigOf(zero_eps), {"layer_norm_rms_epsilon", "positive"});

  GgufImageBuilder string_theta = MinimalLlama();
  string_theta.KvString("llama.rope.freq_base", "10000").KvU32("llama.vocab_size", 10);
  ExpectInvalid(ConfigOf(string_theta), {"'llama.rope.freq_base'"});

  GgufImageBuilder odd_rope = MinimalLlama();
  odd_rope.KvU32("llama.rope.dimension_count", 33).KvU32("llama.vocab_size", 10);
  ExpectInvalid(ConfigOf(odd_rope), {"rope.dimension_count", "33"});

  GgufImageBuilder wide_rope = MinimalLlama();
  wide_rope.KvU32("llama.rope.dimension_count", 128).KvU32("llama.vocab_size", 10);
  ExpectInvalid(ConfigOf(wide_rope), {"rope.dimension_count", "is 128"});

  GgufImageBuilder unknown_scaling = MinimalLlama();
  unknown_scaling.KvString("llama.rope.scaling.type", "ntk").KvU32("llama.vocab_size", 10);
  ExpectInvalid(ConfigOf(unknown_scaling), {"rope scaling type 'ntk'"});

  GgufImageBuilder zero_layers;
  zero_layers.KvString("general.architecture", "llama")
      .KvU32("llama.context_length", 2048)
      .KvU32("llama.embedding_length", 256)
      .KvU32("llama.feed_forward_length", 512)
      .KvU32("llama.block_count", 0)
      .KvU32("llama.attention.head_count", 4);
  ExpectInvalid(ConfigOf(zero_layers), {"llama.block_count", "is 0"});
}

TEST(ModelConfigTest, RejectsUnknownOrInconsistentVocabulary) {
  ExpectInvalid(ConfigOf(MinimalLlama()), {"vocabulary size"});

  GgufImageBuilder too_many_tokens = MinimalLlama();
  too_many_tokens.KvU32("llama.vocab_size", 2).KvStringArray("tokenizer.ggml.tokens",
                                                             {"a", "b", "c"});
  ExpectInvalid(ConfigOf(too_many_tokens), {"3 tokens", "vocabulary size 2"});

  GgufImageBuilder mismatch = MinimalLlama();
  mismatch.KvU32("llama.vocab_size", 100).Tensor("token_embd.weight", {256, 64}, kF32);
  ExpectInvalid(ConfigOf(mismatch), {"llama.vocab_size", "100", "64 rows"});

  GgufImageBuilder wrong_embedding = MinimalLlama();
  wrong_embedding.Tensor("token_embd.weight", {128, 64}, kF32);
  ExpectInvalid(ConfigOf(wrong_embedding), {"token_embd.weight", "[128, 64]"});
}

TEST(ModelConfigTest, RejectsWronglyShapedLayoutTensors) {
  GgufImageBuilder head = MinimalLlama();
  head.Tensor("token_embd.weight", {256, 64}, kF32).Tensor("output.weight", {256, 32}, kF32);
  ExpectInvalid(ConfigOf(head), {"'output.weight'", "[256, 32]", "[256, 64]"});

  GgufImageBuilder bias = Qwen2(false);
  bias.Tensor("blk.0.attn_q.bias", {128}, kF32);
  ExpectInvalid(ConfigOf(bias), {"'blk.0.attn_q.bias'", "[128]", "[896]"});
}

TEST(ModelConfigTest, RejectsBlockCountDisagreeingWithLayerTensors) {
  GgufImageBuilder builder = MinimalLlama();
  builder.KvU32("llama.vocab_size", 10)
      .Tensor("blk.0.attn_norm.weight", {256}, kF32)
      .Tensor("blk.1.attn_norm.weight", {256}, kF32)
      .Tensor("blk.2.attn_norm.weight", {256}, kF32);
  ExpectInvalid(ConfigOf(builder), {"llama.block_count", "is 2", "blk.2.attn_norm.weight present"});
}

}  // namespace
}  // namespace loom::common
