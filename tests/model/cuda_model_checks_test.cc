#include "model/cuda_model_checks.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::model {
namespace {

using ::testing::HasSubstr;

common::ModelConfig Config(int64_t head_dim) {
  common::ModelConfig config;
  config.architecture = "llama";
  config.hidden_size = 1024;
  config.num_heads = 8;
  config.num_kv_heads = 8;
  config.head_dim = head_dim;
  return config;
}

// Checked before any device is touched: these run without a GPU.
TEST(CudaModelChecksTest, HeadDimsTheAttentionKernelsTakeAndLatentAttentionRefused) {
  for (int64_t head_dim : {64, 128, 256}) {
    EXPECT_TRUE(ValidateCudaModelConfig(Config(head_dim)).ok()) << head_dim;
  }
  absl::Status odd = ValidateCudaModelConfig(Config(96));
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(odd.message()), HasSubstr("head dim 96"));
  // DeepSeek's latent attention: refused by name, pointing at the CPU.
  common::ModelConfig latent = Config(576);
  latent.architecture = "deepseek2";
  latent.num_kv_heads = 1;
  latent.mla_kv_lora_rank = 512;
  absl::Status refused = ValidateCudaModelConfig(latent);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("multi-head latent attention"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--device cpu"));
}

}  // namespace
}  // namespace loom::model
