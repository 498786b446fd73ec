#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_metadata_builder.h"

namespace loom::common {

/// The served model's own sampling defaults (a Hugging Face directory's
/// generation_config.json, as vLLM's `--generation-config auto` applies them): each set
/// field replaces the API's default for requests that leave that field unset; a request
/// that sets a field keeps its value. Unset fields leave the API default.
struct SamplingDefaults {
  std::optional<float> temperature;         // >= 0
  std::optional<float> top_p;               // (0, 1]
  std::optional<int32_t> top_k;             // >= 0 (0: off; generation_config's -1 maps to 0)
  std::optional<float> min_p;               // [0, 1]
  std::optional<float> repetition_penalty;  // > 0

  bool empty() const { return !temperature && !top_p && !top_k && !min_p && !repetition_penalty; }
};

/// Reads generation_config.json's temperature, top_p, top_k, min_p and repetition_penalty
/// into `loom.sampling.*` metadata (absent or null fields are skipped); InvalidArgument
/// naming a field that is not a number or is out of range. Thread-safe.
absl::Status GenerationConfigToGguf(const std::string& generation_config_json,
                                    GgufMetadataBuilder& metadata);

/// The `loom.sampling.*` defaults of a model file (none for GGUF files without them).
absl::StatusOr<SamplingDefaults> SamplingDefaultsFromGguf(const GgufFile& gguf);

}  // namespace loom::common
