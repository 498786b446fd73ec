#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/v1/inference.pb.h"

namespace loom::api {

/// POST /v1/embeddings as OpenAI defines it (and vLLM serves it for a decoder model with
/// LAST pooling): `input` a string, a list of strings, a list of token ids or a list of
/// such lists; `encoding_format` "float" (default) or "base64" (little-endian float32);
/// `dimensions` only as the model's hidden size (no Matryoshka truncation); `user` ignored.
/// Each input becomes one prompt whose embedding is its last token's final hidden state,
/// L2-normalized (worker NewSequence.embed).
struct EmbeddingsRequest {
  std::string model;
  std::vector<loom::v1::GenerateRequest> inputs;  // text or token ids, max_tokens 1
  bool base64 = false;
};

/// InvalidArgument (with the offending parameter, as InvalidOpenAiParam) for a body that
/// is not such a request; `hidden_size` is what `dimensions` must equal.
absl::StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(std::string_view body,
                                                         int64_t hidden_size);

/// The response body: one `embedding` object per input, in order, and the usage.
std::string EmbeddingsResponseJson(const std::vector<std::vector<float>>& embeddings, bool base64,
                                   const std::string& model, int64_t prompt_tokens);

}  // namespace loom::api
