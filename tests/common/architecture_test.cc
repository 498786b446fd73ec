#include "common/formats/architecture.h"

#include <set>
#include <string_view>

#include "gtest/gtest.h"

namespace loom::common {
namespace {

TEST(ArchitectureTest, EveryArchitectureIsFoundByBothOfItsNames) {
  ASSERT_FALSE(Architectures().empty());
  std::set<std::string_view> gguf_names;
  std::set<std::string_view> hf_names;
  for (const ArchitectureRules& rules : Architectures()) {
    EXPECT_TRUE(hf_names.insert(rules.hf_class_name).second) << rules.hf_class_name;
    EXPECT_EQ(FindHfArchitecture(rules.hf_class_name), &rules);
    // A GGUF name shared by two classes (Mixtral's files are `llama` ones with experts)
    // finds the first entry, whose rules for the file must be the same.
    const ArchitectureRules* first = FindArchitecture(rules.gguf_name);
    ASSERT_NE(first, nullptr) << rules.gguf_name;
    if (!gguf_names.insert(rules.gguf_name).second) {
      EXPECT_EQ(first->gguf_rope_neox, rules.gguf_rope_neox) << rules.hf_class_name;
    } else {
      EXPECT_EQ(first, &rules);
    }
  }
}

TEST(ArchitectureTest, MixtureOfExpertsClassesMapToTheirGgufArchitectures) {
  ASSERT_NE(FindHfArchitecture("MixtralForCausalLM"), nullptr);
  EXPECT_EQ(FindHfArchitecture("MixtralForCausalLM")->gguf_name, "llama");
  ASSERT_NE(FindHfArchitecture("Qwen3MoeForCausalLM"), nullptr);
  EXPECT_EQ(FindHfArchitecture("Qwen3MoeForCausalLM")->gguf_name, "qwen3moe");
  EXPECT_TRUE(FindArchitecture("qwen3moe")->gguf_rope_neox);
}

TEST(ArchitectureTest, DeepSeekClassesAreLatentAttentionInDeepseek2Files) {
  for (const char* name : {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}) {
    const ArchitectureRules* rules = FindHfArchitecture(name);
    ASSERT_NE(rules, nullptr) << name;
    EXPECT_EQ(rules->gguf_name, "deepseek2");
    EXPECT_TRUE(rules->mla);
    EXPECT_TRUE(rules->hf_rope_interleaved);
  }
  EXPECT_FALSE(FindArchitecture("deepseek2")->gguf_rope_neox);
  EXPECT_FALSE(FindArchitecture("llama")->mla);
}

TEST(ArchitectureTest, UnknownNamesAndTheOtherNamespaceAreNotFound) {
  EXPECT_EQ(FindArchitecture("gpt2"), nullptr);
  EXPECT_EQ(FindArchitecture("LlamaForCausalLM"), nullptr);  // an HF name is not a GGUF one
  EXPECT_EQ(FindHfArchitecture("llama"), nullptr);
  EXPECT_EQ(FindHfArchitecture(""), nullptr);
}

TEST(ArchitectureTest, RopeLayoutFollowsTheGgufConverter) {
  // llama.cpp's converter permutes llama's and mistral's q/k rows to interleaved pairs and
  // leaves qwen's in rotate-half order.
  EXPECT_FALSE(FindArchitecture("llama")->gguf_rope_neox);
  EXPECT_FALSE(FindArchitecture("mistral")->gguf_rope_neox);
  EXPECT_TRUE(FindArchitecture("qwen2")->gguf_rope_neox);
  EXPECT_TRUE(FindArchitecture("qwen3")->gguf_rope_neox);
  EXPECT_TRUE(FindArchitecture("mistral")->sliding_window_every_layer);
  EXPECT_FALSE(FindArchitecture("qwen2")->sliding_window_every_layer);
  // SmolLM3's converter is llama's (permuted q/k); its every 4th layer takes no RoPE.
  ASSERT_NE(FindArchitecture("smollm3"), nullptr);
  EXPECT_FALSE(FindArchitecture("smollm3")->gguf_rope_neox);
  EXPECT_EQ(FindArchitecture("smollm3")->no_rope_period, 4);
  EXPECT_EQ(FindHfArchitecture("SmolLM3ForCausalLM"), FindArchitecture("smollm3"));
  EXPECT_EQ(FindArchitecture("llama")->no_rope_period, 0);
  // GLM-4 pairs (2i, 2i+1) in both formats: its converter does not permute, its HF code
  // rotates interleaved pairs.
  ASSERT_NE(FindArchitecture("glm4"), nullptr);
  EXPECT_FALSE(FindArchitecture("glm4")->gguf_rope_neox);
  EXPECT_TRUE(FindArchitecture("glm4")->hf_rope_interleaved);
  // Gemma 2 and 3 name four norms per layer in Hugging Face checkpoints, Gemma 1 two.
  EXPECT_TRUE(FindArchitecture("gemma2")->hf_sandwich_norms);
  EXPECT_TRUE(FindArchitecture("gemma3")->hf_sandwich_norms);
  ASSERT_NE(FindArchitecture("gemma"), nullptr);
  EXPECT_FALSE(FindArchitecture("gemma")->hf_sandwich_norms);
  EXPECT_TRUE(FindArchitecture("gemma")->gemma);
  EXPECT_FALSE(FindArchitecture("llama")->hf_rope_interleaved);
}

}  // namespace
}  // namespace loom::common
