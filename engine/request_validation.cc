#include "engine/request_validation.h"

#include "absl/strings/str_format.h"
#include "common/grammar/grammar_spec.h"
#include "common/sampling_params.h"
#include "common/status_macros.h"

namespace loom::engine {
void ApplyModelSamplingDefaults(const common::SamplingDefaults& defaults,
                                loom::v1::SamplingParams& sampling) {
  if (defaults.temperature && !sampling.has_temperature()) {
    sampling.set_temperature(*defaults.temperature);
  }
  if (defaults.top_p && !sampling.has_top_p()) sampling.set_top_p(*defaults.top_p);
  if (defaults.top_k && !sampling.has_top_k()) sampling.set_top_k(*defaults.top_k);
  if (defaults.min_p && !sampling.has_min_p()) sampling.set_min_p(*defaults.min_p);
  if (defaults.repetition_penalty && !sampling.has_repetition_penalty()) {
    sampling.set_repetition_penalty(*defaults.repetition_penalty);
  }
}

absl::Status CheckStopStrings(const google::protobuf::RepeatedPtrField<std::string>& stop) {
  size_t bytes = 0;
  for (const std::string& s : stop) bytes += s.size();
  if (bytes <= kMaxStopStringBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the stop strings total %d bytes; at most %d are allowed", bytes, kMaxStopStringBytes));
}

absl::StatusOr<RequestParams> ValidateGenerateRequest(const loom::v1::GenerateRequest& request,
                                                      const common::ModelConfig& config,
                                                      const common::Tokenizer& tokenizer,
                                                      float unset_temperature, bool embed) {
  RequestParams params;
  if (request.has_token_ids()) {
    params.prompt_ids.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
    for (size_t i = 0; i < params.prompt_ids.size(); ++i) {
      const int32_t id = params.prompt_ids[i];
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "prompt token %d is id %d, outside the vocabulary [0, %d)", i, id, config.vocab_size));
      }
    }
  } else {
    params.prompt_ids =
        tokenizer.Encode(request.text(), /*add_special=*/true, /*parse_special=*/true);
  }
  if (params.prompt_ids.empty() ||
      (!request.has_token_ids() && request.text().empty())) {
    return absl::InvalidArgumentError("the prompt is empty");
  }
  const int64_t prompt_len = static_cast<int64_t>(params.prompt_ids.size());
  if (embed && prompt_len > config.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the input has %d tokens; the model's context length is %d", prompt_len,
                        config.context_length));
  }
  if (!embed && prompt_len >= config.context_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the prompt has %d tokens; the model's context length is %d (room for at least one "
        "output token is needed)",
        prompt_len, config.context_length));
  }
  if (request.max_tokens() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens must be >= 0, got %d", request.max_tokens()));
  }
  params.embed = embed;
  if (embed) {
    params.max_tokens = 1;  // the embedding is the one output; nothing is generated
  } else {
    params.max_tokens = request.max_tokens() == 0
                            ? static_cast<int32_t>(config.context_length - prompt_len)
                            : request.max_tokens();
    if (prompt_len + params.max_tokens > config.context_length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the prompt (%d tokens) plus max_tokens (%d) exceeds the context length %d", prompt_len,
          params.max_tokens, config.context_length));
    }
  }

  // Request, then the model's generation_config.json, then the API's default; the worker
  // protocol gets every field set.
  loom::v1::SamplingParams requested = request.sampling();
  ApplyModelSamplingDefaults(config.sampling_defaults, requested);
  common::SamplingParams sampling = common::SamplingParamsFromProto(requested);
  if (!requested.has_temperature()) sampling.temperature = unset_temperature;
  LOOM_RETURN_IF_ERROR(common::ValidateSamplingParams(sampling, config.vocab_size));
  params.sampling = common::SamplingParamsToProto(sampling);

  if (request.sampling().has_grammar()) {
    // Compiled here once so a grammar the engine cannot compile is the client's error
    // (naming the construct), never a worker's; repeated specs hit the cache.
    const loom::v1::GrammarConstraint& grammar = params.sampling.grammar();
    absl::StatusOr<common::GrammarKind> kind = common::ParseGrammarKind(grammar.kind());
    if (!kind.ok()) return kind.status();
    absl::StatusOr<std::shared_ptr<const common::Grammar>> compiled =
        common::SharedGrammarCache().Get({*kind, grammar.text()});
    if (!compiled.ok()) return compiled.status();
    // Constrained sequences do not speculate (the worker masks one token per step).
    params.num_speculative_tokens = 0;
  }

  if (request.has_prompt_logprobs()) {
    if (request.prompt_logprobs() < 0 || request.prompt_logprobs() > common::kMaxLogprobs) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt_logprobs must be in [0, %d], got %d", common::kMaxLogprobs,
          request.prompt_logprobs()));
    }
    params.prompt_logprobs = request.prompt_logprobs();
  }
  LOOM_RETURN_IF_ERROR(CheckStopStrings(request.stop()));
  for (const std::string& stop : request.stop()) {
    if (!stop.empty()) params.stop.push_back(stop);
  }
  for (int32_t id : request.stop_token_ids()) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stop_token_ids holds %d, outside the vocabulary [0, %d)", id, config.vocab_size));
    }
    params.stop_token_ids.push_back(id);
  }
  params.ignore_eos = request.ignore_eos();
  if (params.sampling.min_tokens() > params.max_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "min_tokens (%d) must be at most max_tokens (%d)", params.sampling.min_tokens(),
        params.max_tokens));
  }
  if (params.sampling.min_tokens() > 0) {
    // What the worker masks until min_tokens outputs exist: everything that would end the
    // sequence (the coordinator also ignores stop strings until then).
    if (!params.ignore_eos) {
      for (int32_t id : tokenizer.EndOfGenerationIds()) {
        if (id >= 0 && id < config.vocab_size) params.sampling.add_min_tokens_suppressed_ids(id);
      }
    }
    for (int32_t id : params.stop_token_ids) params.sampling.add_min_tokens_suppressed_ids(id);
  }
  params.include_stop_str_in_output = request.include_stop_str_in_output();
  params.skip_special_tokens =
      request.has_skip_special_tokens() ? request.skip_special_tokens() : true;
  params.priority = request.priority();
  params.cache_salt = request.cache_salt();
  if (request.has_num_speculative_tokens() && params.num_speculative_tokens != 0) {
    const int32_t drafts = request.num_speculative_tokens();
    if (drafts < 0 || drafts > common::kMaxSpeculativeTokens) {
      return absl::InvalidArgumentError(
          absl::StrFormat("num_speculative_tokens must be in [0, %d], got %d",
                          common::kMaxSpeculativeTokens, drafts));
    }
    params.num_speculative_tokens = drafts;
  }
  return params;
}

}  // namespace loom::engine
