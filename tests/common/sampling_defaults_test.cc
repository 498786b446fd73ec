#include "common/sampling_defaults.h"

#include <string>

#include "common/formats/gguf_metadata_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::common {
namespace {

using ::testing::HasSubstr;

TEST(SamplingDefaultsTest, ReadsGenerationConfigSamplingFields) {
  GgufMetadataBuilder metadata;
  ASSERT_TRUE(GenerationConfigToGguf(R"({"do_sample": true, "temperature": 0.6, "top_p": 0.95,
      "top_k": 20, "repetition_penalty": 1.05, "min_p": null, "eos_token_id": [1, 2]})",
                                     metadata)
                  .ok());
  EXPECT_TRUE(metadata.Has("loom.sampling.temperature"));
  EXPECT_TRUE(metadata.Has("loom.sampling.top_p"));
  EXPECT_TRUE(metadata.Has("loom.sampling.top_k"));
  EXPECT_TRUE(metadata.Has("loom.sampling.repetition_penalty"));
  EXPECT_FALSE(metadata.Has("loom.sampling.min_p"));
}

TEST(SamplingDefaultsTest, RefusesOutOfRangeValuesByName) {
  for (const auto& [json, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"top_p": 0})", "top_p"},
           {R"({"top_p": 1.5})", "top_p"},
           {R"({"temperature": -1})", "temperature"},
           {R"({"repetition_penalty": "high"})", "repetition_penalty"},
       }) {
    GgufMetadataBuilder metadata;
    absl::Status status = GenerationConfigToGguf(json, metadata);
    EXPECT_FALSE(status.ok()) << json;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
  }
  GgufMetadataBuilder metadata;
  EXPECT_FALSE(GenerationConfigToGguf("[1]", metadata).ok());
  EXPECT_TRUE(GenerationConfigToGguf("", metadata).ok());
}

}  // namespace
}  // namespace loom::common
