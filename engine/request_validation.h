#pragma once

#include "absl/status/statusor.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/request.h"
#include "loom/v1/inference.pb.h"

namespace loom::engine {

/// Stop strings have no count limit (OpenAI's is 4; vLLM has none); their total length is
/// bounded, as each generated token is checked against every one of them.
inline constexpr size_t kMaxStopStringBytes = 8192;

/// InvalidArgument when `stop`'s strings total more than kMaxStopStringBytes.
absl::Status CheckStopStrings(const google::protobuf::RepeatedPtrField<std::string>& stop);

/// Tokenizes the prompt and checks a client's request against the model: a non-empty
/// prompt, token ids within the vocabulary, prompt + max_tokens within the context
/// length (max_tokens 0 means "up to the context length"), sampling parameters in range
/// (unset ones take the model's defaults, `config.sampling_defaults`, then the API's:
/// greedy, or `unset_temperature` for the temperature). InvalidArgument naming the field
/// and value. `embed`: the request is an embedding (RequestParams::embed set, max_tokens
/// 1), whose prompt may fill the whole context (nothing is generated after it). Thread-safe.
absl::StatusOr<RequestParams> ValidateGenerateRequest(const loom::v1::GenerateRequest& request,
                                                      const common::ModelConfig& config,
                                                      const common::Tokenizer& tokenizer,
                                                      float unset_temperature = 0.0f,
                                                      bool embed = false);

/// Sets each sampling field `request` leaves unset that the model has a default for.
void ApplyModelSamplingDefaults(const common::SamplingDefaults& defaults,
                                loom::v1::SamplingParams& sampling);

}  // namespace loom::engine
