#include "common/sampling_defaults.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

using nlohmann::json;

struct Field {
  const char* name;
  double min, max;
  bool min_open;
};

constexpr Field kFields[] = {
    {"temperature", 0.0, 100.0, false},       {"top_p", 0.0, 1.0, true},
    {"top_k", -1.0, 1 << 20, false},          {"min_p", 0.0, 1.0, false},
    {"repetition_penalty", 0.0, 100.0, true},
};

}  // namespace

absl::Status GenerationConfigToGguf(const std::string& generation_config_json,
                                    GgufMetadataBuilder& metadata) {
  if (generation_config_json.empty()) return absl::OkStatus();
  const json config = json::parse(generation_config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("generation_config.json: not a JSON object");
  }
  for (const Field& field : kFields) {
    auto it = config.find(field.name);
    if (it == config.end() || it->is_null()) continue;
    const double value = it->is_number() ? it->get<double>() : std::nan("");
    if (!std::isfinite(value) || value < field.min || value > field.max ||
        (field.min_open && value == field.min)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "generation_config.json: '", field.name, "' is ", it->dump(), ", expected a number in ",
          field.min_open ? "(" : "[", field.min, ", ", field.max, "]"));
    }
    if (std::string_view(field.name) == "top_k") {
      metadata.Int("loom.sampling.top_k", value < 0 ? 0 : static_cast<int64_t>(value));
    } else {
      metadata.Float(absl::StrCat("loom.sampling.", field.name), value);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SamplingDefaults> SamplingDefaultsFromGguf(const GgufFile& gguf) {
  SamplingDefaults defaults;
  auto number = [&](const char* key, std::optional<float>& out) -> absl::Status {
    if (gguf.Find(key) == nullptr) return absl::OkStatus();
    LOOM_ASSIGN_OR_RETURN(double value, gguf.GetDouble(key));
    out = static_cast<float>(value);
    return absl::OkStatus();
  };
  LOOM_RETURN_IF_ERROR(number("loom.sampling.temperature", defaults.temperature));
  LOOM_RETURN_IF_ERROR(number("loom.sampling.top_p", defaults.top_p));
  LOOM_RETURN_IF_ERROR(number("loom.sampling.min_p", defaults.min_p));
  LOOM_RETURN_IF_ERROR(number("loom.sampling.repetition_penalty", defaults.repetition_penalty));
  if (gguf.Find("loom.sampling.top_k") != nullptr) {
    LOOM_ASSIGN_OR_RETURN(int64_t top_k, gguf.GetInt("loom.sampling.top_k"));
    if (top_k < 0 || top_k > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("loom.sampling.top_k is ", top_k, ", expected [0, 2^20]"));
    }
    defaults.top_k = static_cast<int32_t>(top_k);
  }
  return defaults;
}

}  // namespace loom::common
