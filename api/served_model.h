#pragma once

#include <cstdint>
#include <string>

#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "loom/v1/inference.pb.h"

namespace loom::api {

/// The model a coordinator serves, as clients name it: the id they pass as `model`
/// (`--served-model-name`, else the GGUF file's name without `.gguf`), what the workers
/// must match, and when it started serving. Both APIs answer model lists and check the
/// `model` field of requests against it.
struct ServedModel {
  std::string id;
  loom::v1::ModelInfo info;  // architecture, vocabulary, context length, fingerprint
  int64_t created = 0;       // unix seconds

  /// True when a request's `model` names this model (empty means "the served one").
  bool Matches(const std::string& requested) const {
    return requested.empty() || requested == id;
  }
  loom::v1::ServedModel ToProto() const;
};

/// `name_override` empty: the id is the file's stem.
ServedModel MakeServedModel(const std::string& path, const common::GgufFile& gguf,
                            const common::ModelConfig& config, const std::string& name_override);

}  // namespace loom::api
