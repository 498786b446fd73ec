#include "common/sampling_params.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/grammar/grammar_spec.h"

namespace loom::common {

absl::Status ValidateSamplingParams(const SamplingParams& p, int64_t vocab_size) {
  auto bad = [](const char* name, double value, const char* range) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s must be %s, got %g", name, range, value));
  };
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return bad("temperature", p.temperature, "finite and >= 0");
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p", p.top_p, "in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p", p.min_p, "in [0, 1]");
  if (p.top_k < 0) return bad("top_k", p.top_k, ">= 0 (0 disables it)");
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty)) {
    return bad("repetition_penalty", p.repetition_penalty, "finite and > 0");
  }
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2)) {
    return bad("presence_penalty", p.presence_penalty, "in [-2, 2]");
  }
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2)) {
    return bad("frequency_penalty", p.frequency_penalty, "in [-2, 2]");
  }
  const int64_t max_logprobs = std::min<int64_t>(kMaxLogprobs, vocab_size);
  if (p.num_logprobs < -1 || p.num_logprobs > max_logprobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logprobs must be between 0 and %d, got %d", max_logprobs, p.num_logprobs));
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit_bias names token %d, outside the vocabulary [0, %d)", id, vocab_size));
    }
    if (!(bias >= -100 && bias <= 100)) return bad("logit_bias", bias, "in [-100, 100]");
  }
  if (p.min_tokens < 0) return bad("min_tokens", p.min_tokens, ">= 0");
  for (int32_t id : p.min_tokens_suppressed_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "min_tokens_suppressed_ids holds %d, outside the vocabulary [0, %d)", id, vocab_size));
    }
  }
  if (!p.grammar_kind.empty()) {
    if (absl::Status kind = ParseGrammarKind(p.grammar_kind).status(); !kind.ok()) return kind;
  }
  return absl::OkStatus();
}

SamplingParams SamplingParamsFromProto(const loom::v1::SamplingParams& proto) {
  SamplingParams params;  // the defaults for every unset field
  if (proto.has_temperature()) params.temperature = proto.temperature();
  if (proto.has_top_k()) params.top_k = proto.top_k();
  if (proto.has_top_p()) params.top_p = proto.top_p();
  if (proto.has_min_p()) params.min_p = proto.min_p();
  if (proto.has_repetition_penalty()) params.repetition_penalty = proto.repetition_penalty();
  if (proto.has_presence_penalty()) params.presence_penalty = proto.presence_penalty();
  if (proto.has_frequency_penalty()) params.frequency_penalty = proto.frequency_penalty();
  if (proto.has_seed()) params.seed = proto.seed();
  if (proto.has_num_logprobs()) params.num_logprobs = proto.num_logprobs();
  if (proto.has_grammar()) {
    params.grammar_kind = proto.grammar().kind();
    params.grammar_text = proto.grammar().text();
  }
  for (const auto& [id, bias] : proto.logit_bias()) params.logit_bias.emplace_back(id, bias);
  std::sort(params.logit_bias.begin(), params.logit_bias.end());  // map order is unspecified
  if (proto.has_min_tokens()) params.min_tokens = proto.min_tokens();
  params.min_tokens_suppressed_ids.assign(proto.min_tokens_suppressed_ids().begin(),
                                          proto.min_tokens_suppressed_ids().end());
  return params;
}

loom::v1::SamplingParams SamplingParamsToProto(const SamplingParams& params) {
  loom::v1::SamplingParams proto;
  proto.set_temperature(params.temperature);
  proto.set_top_k(params.top_k);
  proto.set_top_p(params.top_p);
  proto.set_min_p(params.min_p);
  proto.set_repetition_penalty(params.repetition_penalty);
  proto.set_presence_penalty(params.presence_penalty);
  proto.set_frequency_penalty(params.frequency_penalty);
  proto.set_seed(params.seed);
  proto.set_num_logprobs(params.num_logprobs);
  if (!params.grammar_kind.empty() || !params.grammar_text.empty()) {
    loom::v1::GrammarConstraint* grammar = proto.mutable_grammar();
    grammar->set_kind(params.grammar_kind);
    grammar->set_text(params.grammar_text);
  }
  for (const auto& [id, bias] : params.logit_bias) (*proto.mutable_logit_bias())[id] = bias;
  proto.set_min_tokens(params.min_tokens);
  proto.mutable_min_tokens_suppressed_ids()->Add(params.min_tokens_suppressed_ids.begin(),
                                                 params.min_tokens_suppressed_ids.end());
  return proto;
}

}  // namespace loom::common
