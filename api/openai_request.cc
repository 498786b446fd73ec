#include "api/openai_request.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"
#include "api/chat_request.h"
#include "api/openai_structured_output.h"
#include "common/grammar/grammar_spec.h"
#include "common/sampling_params.h"
#include "common/status_macros.h"
#include "engine/request_validation.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

// One parse of the body, in the client's field order (the chat template sees every
// message's fields in that order).
using json = nlohmann::ordered_json;

constexpr int kMaxN = 128;          // OpenAI's limit for `n`
using common::kMaxLogprobs;         // top alternatives per token

// A field that is absent or null counts as not given.
const json* Field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<std::optional<double>> Number(const json& body, const char* name, double min,
                                             double max, bool min_open = false) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number())
    return InvalidOpenAiParam(name, absl::StrFormat("'%s' must be a number", name));
  const double x = value->get<double>();
  // The engine holds these as floats: an open bound is checked on the float too (1e-300 is
  // above 0, its float is not).
  if (!std::isfinite(x) || x < min || x > max ||
      (min_open && static_cast<float>(x) <= static_cast<float>(min))) {
    return InvalidOpenAiParam(name, absl::StrFormat("'%s' must be in %s%g, %g], got %g", name,
                                                    min_open ? "(" : "[", min, max, x));
  }
  return x;
}

absl::StatusOr<std::optional<int64_t>> Integer(const json& body, const char* name, int64_t min,
                                               int64_t max) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  // Integral floats (2.0) are accepted as the Python servers do; huge or fractional
  // numbers are not.
  auto out_of_range = [&](auto got) {
    return InvalidOpenAiParam(
        name, absl::StrFormat("'%s' must be in [%d, %d], got %d", name, min, max, got));
  };
  if (value->is_number_unsigned()) {
    const uint64_t u = value->get<uint64_t>();
    if (u > static_cast<uint64_t>(max) || static_cast<int64_t>(u) < min) return out_of_range(u);
    return static_cast<int64_t>(u);
  }
  if (value->is_number_integer()) {
    const int64_t i = value->get<int64_t>();
    if (i < min || i > max) return out_of_range(i);
    return i;
  }
  if (value->is_number_float()) {
    const double x = value->get<double>();
    if (std::isfinite(x) && std::fabs(x) < 9e18 && x == std::floor(x) &&
        x >= static_cast<double>(min) &&
        x <= static_cast<double>(max)) {
      return static_cast<int64_t>(x);
    }
    return InvalidOpenAiParam(
        name, absl::StrFormat("'%s' must be an integer in [%d, %d], got %g", name, min, max, x));
  }
  return InvalidOpenAiParam(name, absl::StrFormat("'%s' must be an integer", name));
}

absl::StatusOr<std::optional<bool>> Boolean(const json& body, const char* name) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean())
    return InvalidOpenAiParam(name, absl::StrFormat("'%s' must be a boolean", name));
  return value->get<bool>();
}

absl::StatusOr<std::optional<std::string>> String(const json& body, const char* name) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string())
    return InvalidOpenAiParam(name, absl::StrFormat("'%s' must be a string", name));
  return value->get<std::string>();
}

absl::StatusOr<std::vector<int32_t>> TokenIdList(const json& list, const char* name) {
  std::vector<int32_t> ids;
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidOpenAiParam(name,
                                absl::StrFormat("'%s' must hold non-negative token ids", name));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

// OpenAI and vLLM fields Loom does not implement: a request that sets one to anything
// but its no-op value is refused naming it, never served as if it were absent (fields no
// API defines stay ignored, as the reference servers do).
absl::Status RefuseUnimplemented(const json& body, OpenAiEndpoint endpoint) {
  auto refuse = [](const char* name) {
    return InvalidOpenAiParam(name, absl::StrFormat("'%s' is not supported by this server", name));
  };
  auto non_empty = [&](const char* name) {
    const json* value = Field(body, name);
    if (value == nullptr) return false;
    // json::empty() is false for every string: compare the text itself.
    if (value->is_string()) return !value->get_ref<const std::string&>().empty();
    return !((value->is_array() || value->is_object()) && value->empty());
  };
  for (const char* name : {"suffix", "prediction", "audio"}) {
    if (non_empty(name)) return refuse(name);
  }
  if (endpoint == OpenAiEndpoint::kCompletions) {
    // Tools need messages (the chat template): /v1/chat/completions only.
    for (const char* name : {"tools", "functions", "tool_choice", "function_call", "parallel_tool_calls"}) {
      if (Field(body, name) != nullptr) {
        return InvalidOpenAiParam(
            name, absl::StrFormat("'%s' is only supported by /v1/chat/completions", name));
      }
    }
  }
  auto is = [&](const char* name, const json& no_op) {
    const json* value = Field(body, name);
    return value == nullptr || *value == no_op;
  };
  if (!is("best_of", 1)) return refuse("best_of");
  // vLLM's sampling extras that would change the output (a constraint the client relies
  // on, or another prompt): refused rather than served as if they were absent.
  for (const char* name : {"allowed_token_ids", "bad_words", "logits_processors"}) {
    if (non_empty(name)) return refuse(name);
  }
  // -1: vLLM's "truncate to the context length", a no-op here (longer prompts are refused).
  if (!is("truncate_prompt_tokens", -1)) return refuse("truncate_prompt_tokens");
  if (!is("use_beam_search", false)) return refuse("use_beam_search");
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    // vLLM's chat-template fields: the served model's template renders every request.
    for (const char* name : {"chat_template", "documents"}) {
      if (non_empty(name)) return refuse(name);
    }
  }
  return absl::OkStatus();
}

// logit_bias: {"token id": bias}, ids in the vocabulary, biases in [-100, 100].
absl::Status ParseLogitBias(const json& body, int32_t vocab_size, loom::v1::SamplingParams& sampling) {
  const json* bias = Field(body, "logit_bias");
  if (bias == nullptr) return absl::OkStatus();
  if (!bias->is_object())
    return InvalidOpenAiParam("logit_bias", "'logit_bias' must map token ids to biases");
  for (const auto& [key, value] : bias->items()) {
    char* end = nullptr;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || id < 0 || id >= vocab_size) {
      return InvalidOpenAiParam(
          "logit_bias",
          absl::StrFormat("'logit_bias' key '%s' is not a token id in [0, %d)", key, vocab_size));
    }
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
        value.get<double>() > 100) {
      return InvalidOpenAiParam(
          "logit_bias",
          absl::StrFormat("'logit_bias' values must be numbers in [-100, 100] (token %s)", key));
    }
    (*sampling.mutable_logit_bias())[static_cast<int32_t>(id)] = value.get<float>();
  }
  return absl::OkStatus();
}

// Sampling, limits and stop conditions shared by both endpoints.
absl::Status ParseCommon(const json& body, loom::v1::GenerateRequest& base, OpenAiRequest& out) {
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> model, String(body, "model"));
  out.model = model.value_or("");
  base.set_model(out.model);

  // max_completion_tokens is the newer name; either may be given.
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens,
                   Integer(body, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max()));
  if (!max_tokens) {
    LOOM_ASSIGN_OR_RETURN(max_tokens, Integer(body, "max_tokens", 1, std::numeric_limits<int32_t>::max()));
  }
  if (max_tokens) base.set_max_tokens(static_cast<int32_t>(*max_tokens));

  loom::v1::SamplingParams& sampling = *base.mutable_sampling();
  // Unset: the model's default, else OpenAI's 1 (ValidateGenerateRequest's
  // unset_temperature; the gRPC API's is 0, greedy).
  LOOM_ASSIGN_OR_RETURN(std::optional<double> temperature, Number(body, "temperature", 0.0, 100.0));
  if (temperature) sampling.set_temperature(static_cast<float>(*temperature));
  LOOM_ASSIGN_OR_RETURN(std::optional<double> top_p, Number(body, "top_p", 0.0, 1.0, /*min_open=*/true));
  if (top_p) sampling.set_top_p(static_cast<float>(*top_p));
  // vLLM's convention: -1 (or 0) turns top-k off.
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, Integer(body, "top_k", -1, 1 << 20));
  if (top_k) sampling.set_top_k(static_cast<int32_t>(*top_k < 0 ? 0 : *top_k));
  LOOM_ASSIGN_OR_RETURN(std::optional<double> min_p, Number(body, "min_p", 0.0, 1.0));
  if (min_p) sampling.set_min_p(static_cast<float>(*min_p));
  LOOM_ASSIGN_OR_RETURN(std::optional<double> presence, Number(body, "presence_penalty", -2.0, 2.0));
  if (presence) sampling.set_presence_penalty(static_cast<float>(*presence));
  LOOM_ASSIGN_OR_RETURN(std::optional<double> frequency, Number(body, "frequency_penalty", -2.0, 2.0));
  if (frequency) sampling.set_frequency_penalty(static_cast<float>(*frequency));
  LOOM_ASSIGN_OR_RETURN(std::optional<double> repetition,
                   Number(body, "repetition_penalty", 0.0, 100.0, /*min_open=*/true));
  if (repetition) sampling.set_repetition_penalty(static_cast<float>(*repetition));
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> seed,
                   Integer(body, "seed", std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()));
  if (seed) {
    sampling.set_seed(static_cast<uint64_t>(*seed));
    out.seed_given = true;
  }

  if (const json* stop = Field(body, "stop")) {
    if (stop->is_string()) {
      base.add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string())
          return InvalidOpenAiParam("stop", "'stop' must be a string or a list of strings");
        base.add_stop(s.get<std::string>());
      }
    } else {
      return InvalidOpenAiParam("stop", "'stop' must be a string or a list of strings");
    }
    // Checked here too so that the error names the parameter.
    if (absl::Status checked = engine::CheckStopStrings(base.stop()); !checked.ok()) {
      return InvalidOpenAiParam("stop", std::string(checked.message()));
    }
  }
  if (const json* ids = Field(body, "stop_token_ids")) {
    if (!ids->is_array())
      return InvalidOpenAiParam("stop_token_ids", "'stop_token_ids' must be a list");
    LOOM_ASSIGN_OR_RETURN(std::vector<int32_t> list, TokenIdList(*ids, "stop_token_ids"));
    base.mutable_stop_token_ids()->Add(list.begin(), list.end());
  }
  LOOM_ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, Boolean(body, "ignore_eos"));
  base.set_ignore_eos(ignore_eos.value_or(false));
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> min_tokens,
                        Integer(body, "min_tokens", 0, std::numeric_limits<int32_t>::max()));
  if (min_tokens) {
    if (max_tokens && *min_tokens > *max_tokens) {
      return InvalidOpenAiParam(
          "min_tokens", absl::StrFormat("'min_tokens' (%d) must be at most 'max_tokens' (%d)",
                                        *min_tokens, *max_tokens));
    }
    sampling.set_min_tokens(static_cast<int32_t>(*min_tokens));
  }
  LOOM_ASSIGN_OR_RETURN(std::optional<bool> include_stop, Boolean(body, "include_stop_str_in_output"));
  base.set_include_stop_str_in_output(include_stop.value_or(false));
  LOOM_ASSIGN_OR_RETURN(std::optional<bool> skip_special, Boolean(body, "skip_special_tokens"));
  if (skip_special) base.set_skip_special_tokens(*skip_special);
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> priority, Integer(body, "priority", -(1 << 30), 1 << 30));
  base.set_priority(static_cast<int32_t>(priority.value_or(0)));
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> salt, String(body, "cache_salt"));
  base.set_cache_salt(salt.value_or(""));
  // Loom's extension (vLLM sets speculation per server only): drafts per step at most.
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> drafts,
                        Integer(body, "num_speculative_tokens", 0, 1 << 20));
  if (drafts) base.set_num_speculative_tokens(static_cast<int32_t>(*drafts));
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> user, String(body, "user"));
  out.user = user.value_or("");
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> request_id, String(body, "request_id"));
  out.request_id = request_id.value_or("");

  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> n, Integer(body, "n", 1, kMaxN));
  out.n = static_cast<int32_t>(n.value_or(1));
  LOOM_ASSIGN_OR_RETURN(std::optional<bool> stream, Boolean(body, "stream"));
  out.stream = stream.value_or(false);
  if (const json* options = Field(body, "stream_options")) {
    if (!out.stream) {
      return InvalidOpenAiParam("stream_options",
                                "'stream_options' is only allowed with 'stream': true");
    }
    if (!options->is_object())
      return InvalidOpenAiParam("stream_options", "'stream_options' must be an object");
    LOOM_ASSIGN_OR_RETURN(std::optional<bool> usage, Boolean(*options, "include_usage"));
    out.include_usage = usage.value_or(false);
    LOOM_ASSIGN_OR_RETURN(std::optional<bool> continuous,
                          Boolean(*options, "continuous_usage_stats"));
    out.continuous_usage = out.include_usage && continuous.value_or(false);
  }
  return absl::OkStatus();
}

absl::Status ParseCompletionPrompt(const json& body, const loom::v1::GenerateRequest& base,
                                   const common::Tokenizer& tokenizer, OpenAiRequest& out) {
  const json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return InvalidOpenAiParam("prompt", "'prompt' is required");
  auto add_text = [&](const std::string& text) {
    loom::v1::GenerateRequest request = base;
    request.set_text(text);
    out.prompts.push_back(std::move(request));
    out.echo_texts.push_back(text);
  };
  auto add_ids = [&](const json& ids) -> absl::Status {
    LOOM_ASSIGN_OR_RETURN(std::vector<int32_t> list, TokenIdList(ids, "prompt"));
    loom::v1::GenerateRequest request = base;
    request.mutable_token_ids()->mutable_ids()->Add(list.begin(), list.end());
    absl::StatusOr<std::string> text = tokenizer.Decode(list, /*skip_special=*/false);
    out.echo_texts.push_back(text.ok() ? *std::move(text) : std::string());
    out.prompts.push_back(std::move(request));
    return absl::OkStatus();
  };
  const char* kShape = "'prompt' must be a string, a list of strings, a list of token ids or a "
                       "list of lists of token ids";
  if (prompt->is_string()) {
    add_text(prompt->get<std::string>());
  } else if (prompt->is_array() && !prompt->empty()) {
    if ((*prompt)[0].is_number()) {
      LOOM_RETURN_IF_ERROR(add_ids(*prompt));
    } else {
      // A list of strings or a list of token lists, not both (OpenAI's and vLLM's shapes).
      const bool texts = (*prompt)[0].is_string();
      for (const json& item : *prompt) {
        if (texts && item.is_string()) {
          add_text(item.get<std::string>());
        } else if (!texts && item.is_array()) {
          LOOM_RETURN_IF_ERROR(add_ids(item));
        } else {
          return InvalidOpenAiParam("prompt", kShape);
        }
      }
    }
  } else {
    return InvalidOpenAiParam("prompt", prompt->is_array() ? "'prompt' is empty" : kShape);
  }

  LOOM_ASSIGN_OR_RETURN(std::optional<bool> echo, Boolean(body, "echo"));
  out.echo = echo.value_or(false);
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, Integer(body, "logprobs", 0, kMaxLogprobs));
  out.num_logprobs = logprobs ? static_cast<int32_t>(*logprobs) : -1;
  return absl::OkStatus();
}

// The body's `reasoning_effort` and `chat_template_kwargs` as the template's variables.
absl::StatusOr<std::optional<json>> TemplateKwargs(const json& body) {
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> effort, String(body, "reasoning_effort"));
  return ChatTemplateVariables(effort, Field(body, "chat_template_kwargs"));
}

absl::Status ParseChatMessages(const json& body, const loom::v1::GenerateRequest& base,
                               const common::Tokenizer& tokenizer,
                               const common::ChatTemplate* chat_template, OpenAiRequest& out) {
  const json* messages = Field(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return InvalidOpenAiParam("messages", "'messages' must be a non-empty list of messages");
  }
  if (chat_template == nullptr) {
    return InvalidOpenAiParam("messages", "this model has no chat template; use /v1/completions");
  }
  ChatRenderOptions options;
  LOOM_ASSIGN_OR_RETURN(std::optional<bool> add_generation_prompt,
                        Boolean(body, "add_generation_prompt"));
  LOOM_ASSIGN_OR_RETURN(std::optional<bool> continue_final_message,
                        Boolean(body, "continue_final_message"));
  options.add_generation_prompt = add_generation_prompt.value_or(true);
  options.continue_final_message = continue_final_message.value_or(false);
  LOOM_ASSIGN_OR_RETURN(std::optional<json> kwargs, TemplateKwargs(body));
  LOOM_ASSIGN_OR_RETURN(std::string rendered,
                        RenderChatPrompt(*messages, out.tools, tokenizer, *chat_template,
                                         kwargs ? &*kwargs : nullptr, options));
  const std::vector<int32_t> ids = EncodeChatPrompt(rendered, tokenizer);
  loom::v1::GenerateRequest request = base;
  request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  out.prompts.push_back(std::move(request));
  out.echo_texts.push_back(std::move(rendered));

  LOOM_ASSIGN_OR_RETURN(std::optional<bool> logprobs, Boolean(body, "logprobs"));
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> top, Integer(body, "top_logprobs", 0, kMaxLogprobs));
  if (top && !logprobs.value_or(false)) {
    return InvalidOpenAiParam("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  out.num_logprobs = logprobs.value_or(false) ? static_cast<int32_t>(top.value_or(0)) : -1;
  return absl::OkStatus();
}

// The tool fields; `required` and a named function constrain the reply to a valid call
// through the grammar engine.
absl::Status ParseTools(const json& body, const common::ChatTemplate* chat_template,
                        loom::v1::GenerateRequest& base, OpenAiRequest& out) {
  LOOM_ASSIGN_OR_RETURN(out.tools,
                        ParseToolsRequest(body, chat_template != nullptr ? chat_template->source() : ""));
  if (out.tools.legacy && out.stream && out.tools.active()) {
    return InvalidOpenAiParam("functions",
                              "the legacy 'functions' cannot be streamed; use 'tools'");
  }
  return ApplyToolConstraint(out.tools, out.tools.legacy ? "functions" : "tools",
                             out.tools.legacy ? "function_call" : "tool_choice", base);
}

// vLLM's prompt_logprobs, and a completion's echo with logprobs (the prompt's logprobs
// before the output's, as lm-evaluation-harness scores log-likelihoods): the worker
// scores every prompt token with as many alternatives as either asks for. Whole
// responses only: both come with the prompt, which a stream has sent before they exist.
absl::Status ParsePromptLogprobs(const json& body, OpenAiRequest& out) {
  LOOM_ASSIGN_OR_RETURN(std::optional<int64_t> prompt_logprobs,
                        Integer(body, "prompt_logprobs", 0, kMaxLogprobs));
  out.prompt_logprobs = prompt_logprobs ? static_cast<int32_t>(*prompt_logprobs) : -1;
  const bool echo_logprobs = out.echo && out.num_logprobs >= 0;
  if (!echo_logprobs && out.prompt_logprobs < 0) return absl::OkStatus();
  if (out.stream) {
    return InvalidOpenAiParam(
        echo_logprobs ? "echo" : "prompt_logprobs",
        echo_logprobs ? "'echo' with 'logprobs' is answered whole: set 'stream' to false"
                      : "'prompt_logprobs' is answered whole: set 'stream' to false");
  }
  const int32_t top = std::max(out.prompt_logprobs, echo_logprobs ? out.num_logprobs : 0);
  for (loom::v1::GenerateRequest& request : out.prompts) request.set_prompt_logprobs(top);
  return absl::OkStatus();
}

}  // namespace

absl::Status InvalidOpenAiParam(const std::string& param, const std::string& message) {
  absl::Status status = absl::InvalidArgumentError(message);
  if (!param.empty()) status.SetPayload(kOpenAiParamPayload, absl::Cord(param));
  return status;
}

std::string OpenAiErrorParam(const absl::Status& status) {
  const auto param = status.GetPayload(kOpenAiParamPayload);
  return param ? std::string(*param) : std::string();
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, const std::string& body,
                                                 const common::Tokenizer& tokenizer,
                                                 const common::ChatTemplate* chat_template) {
  // Invalid UTF-8 in strings, trailing garbage and nesting beyond the parser's limits
  // are all parse errors. Callers bound the body's depth first (HttpRouter; the endpoint
  // picker, whose bodies never pass through the router).
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return InvalidOpenAiParam("", "the request body is not valid JSON");
  if (!parsed.is_object()) return InvalidOpenAiParam("", "the request body must be a JSON object");
  OpenAiRequest out;
  out.endpoint = endpoint;
  loom::v1::GenerateRequest base;
  LOOM_RETURN_IF_ERROR(RefuseUnimplemented(parsed, endpoint));
  LOOM_RETURN_IF_ERROR(ParseCommon(parsed, base, out));
  LOOM_RETURN_IF_ERROR(ParseLogitBias(parsed, tokenizer.vocab_size(), *base.mutable_sampling()));
  LOOM_RETURN_IF_ERROR(ParseStructuredOutput(parsed, *base.mutable_sampling()));
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    LOOM_RETURN_IF_ERROR(ParseTools(parsed, chat_template, base, out));
  }
  if (endpoint == OpenAiEndpoint::kCompletions) {
    LOOM_RETURN_IF_ERROR(ParseCompletionPrompt(parsed, base, tokenizer, out));
  } else {
    LOOM_RETURN_IF_ERROR(ParseChatMessages(parsed, base, tokenizer, chat_template, out));
  }
  LOOM_RETURN_IF_ERROR(ParsePromptLogprobs(parsed, out));
  LOOM_ASSIGN_OR_RETURN(std::optional<bool> token_ids,
                        Boolean(parsed, "return_tokens_as_token_ids"));
  out.return_token_ids = token_ids.value_or(false);
  for (loom::v1::GenerateRequest& request : out.prompts) {
    if (out.num_logprobs >= 0) request.mutable_sampling()->set_num_logprobs(out.num_logprobs);
  }
  return out;
}

}  // namespace loom::api
