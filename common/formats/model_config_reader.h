#pragma once

// Internal to common/formats/model_config*.cc: the `<arch>.*` key reader, the bounds and checks
// model_config.cc and model_config_experts.cc share, and the mixture-of-experts readers.

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "common/status_macros.h"

namespace loom::common::model_config_internal {

// Sanity bounds: far above any real model, low enough that sizes derived from them
// (hidden * heads, context * layers, ...) cannot overflow int64.
constexpr int64_t kMaxDimension = int64_t{1} << 20;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxExperts = 1024;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxContext = int64_t{1} << 26;
constexpr int64_t kMaxVocab = int64_t{1} << 24;

inline absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// Look-ups of `<arch>.<suffix>`. Absent optional keys leave the default in place.
class ConfigReader {
 public:
  ConfigReader(const GgufFile& gguf, std::string architecture)
      : gguf_(gguf), architecture_(std::move(architecture)) {}

  std::string Key(absl::string_view suffix) const {
    return absl::StrCat(architecture_, ".", suffix);
  }

  absl::StatusOr<int64_t> RequiredInt(absl::string_view suffix) const {
    const std::string key = Key(suffix);
    if (gguf_.Find(key) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: required key '", key, "' is missing"));
    }
    return gguf_.GetInt(key);
  }

  absl::Status OptionalInt(absl::string_view suffix, int64_t& value) const {
    const std::string key = Key(suffix);
    if (gguf_.Find(key) == nullptr) return absl::OkStatus();
    LOOM_ASSIGN_OR_RETURN(value, gguf_.GetInt(key));
    return absl::OkStatus();
  }

  absl::Status OptionalDouble(absl::string_view suffix, double& value) const {
    const std::string key = Key(suffix);
    if (gguf_.Find(key) == nullptr) return absl::OkStatus();
    LOOM_ASSIGN_OR_RETURN(value, gguf_.GetDouble(key));
    return absl::OkStatus();
  }

  absl::Status OptionalBool(absl::string_view suffix, bool& value) const {
    const std::string key = Key(suffix);
    if (gguf_.Find(key) == nullptr) return absl::OkStatus();
    LOOM_ASSIGN_OR_RETURN(value, gguf_.GetBool(key));
    return absl::OkStatus();
  }

  absl::Status OptionalString(absl::string_view suffix, std::string& value) const {
    const std::string key = Key(suffix);
    if (gguf_.Find(key) == nullptr) return absl::OkStatus();
    LOOM_ASSIGN_OR_RETURN(std::string_view text, gguf_.GetString(key));
    value = std::string(text);
    return absl::OkStatus();
  }

 private:
  const GgufFile& gguf_;
  std::string architecture_;
};

inline absl::Status CheckRange(const ConfigReader& reader, absl::string_view suffix, int64_t value,
                               int64_t min, int64_t max) {
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("model config: '", reader.Key(suffix), "' is ",
                                                   value, ", expected a value in [", min, ", ", max,
                                                   "]"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckPositiveFinite(const ConfigReader& reader, absl::string_view suffix,
                                        double value) {
  if (!std::isfinite(value) || value <= 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: '", reader.Key(suffix), "' is ",
                                                   value, ", expected a positive finite number"));
  }
  return absl::OkStatus();
}

inline std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// `name`, when present, must have exactly `expected` as its ggml shape.
inline absl::Status CheckTensorShape(const GgufFile& gguf, absl::string_view name,
                                     const std::vector<uint64_t>& expected) {
  const GgufTensorInfo* tensor = gguf.FindTensor(std::string_view(name.data(), name.size()));
  if (tensor == nullptr || tensor->shape == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model config: tensor '", name, "' has shape ",
                                                 ShapeString(tensor->shape), ", expected ",
                                                 ShapeString(expected)));
}

inline absl::StatusOr<RopeScalingType> ParseRopeScaling(absl::string_view type) {
  if (type.empty() || type == "none") return RopeScalingType::kNone;
  if (type == "linear") return RopeScalingType::kLinear;
  if (type == "llama3") return RopeScalingType::kLlama3;
  if (type == "yarn") return RopeScalingType::kYarn;
  if (type == "longrope") return RopeScalingType::kLongRope;
  return absl::InvalidArgumentError(
      absl::StrCat("model config: unknown rope scaling type '", type,
                   "' (known: none, linear, llama3, yarn, longrope)"));
}

// Mixture of experts (model_config_experts.cc): how many experts, how many a token uses, their
// width, the dense layers before them and the router's rule.
absl::Status ReadExperts(const ConfigReader& reader, ModelConfig& config);

// Multi-token-prediction layers after the model's own (GLM-4.5): block_count counts them,
// the model does not run them.
absl::Status ReadNextnLayers(const ConfigReader& reader, ModelConfig& config);

// The name of tensor `suffix` in the first layer with experts (after the dense ones).
std::string FirstExpertLayerTensor(const ModelConfig& config, absl::string_view suffix);

// A shared expert (Qwen2-MoE, GLM-4.5), when the file has its tensors (see the definition).
absl::Status ReadSharedExpert(const ConfigReader& reader, const GgufFile& gguf, int64_t dense_ffn,
                              ModelConfig& config);

}  // namespace loom::common::model_config_internal
