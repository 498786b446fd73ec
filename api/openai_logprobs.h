#pragma once

// The OpenAI API's logprobs objects: per generated token (chat's `content` entries, the
// completions API's parallel arrays), the prompt's when a completion echoes it, and
// vLLM's `prompt_logprobs`.

#include <cstdint>
#include <optional>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "engine/request.h"
#include "loom/v1/worker.pb.h"
#include "nlohmann/json.hpp"

namespace loom::api {

/// How a logprobs object names a token: its text (its bytes), or with vLLM's
/// `return_tokens_as_token_ids` "token_id:<id>" (what a client that scores or trains on
/// token ids reads back without detokenizing; the text offsets still count the text).
std::string LogprobToken(const common::Tokenizer& tokenizer, int32_t token_id, bool as_token_ids);

/// Appends one generated token's logprobs to `logprobs` (null: started here): chat's
/// {"content": [{token, logprob, bytes, top_logprobs}]}, or the completions API's
/// {tokens, token_logprobs, top_logprobs, text_offset}, whose offsets continue from
/// `text_offset` (advanced past the token's text). Tokens named as LogprobToken says.
void AppendLogprobs(bool chat, const common::Tokenizer& tokenizer,
                    const loom::v1::SequenceOutput& output, nlohmann::ordered_json& logprobs,
                    int64_t& text_offset, bool as_token_ids = false);

/// A completion that echoes its prompt with `logprobs: top`: the prompt's tokens first (the
/// first with null logprob and top_logprobs, as it has nothing before it), then
/// `generated` (AppendLogprobs' object for the output, or null), its offsets shifted past
/// the prompt's. What lm-evaluation-harness scores log-likelihoods from.
nlohmann::ordered_json EchoLogprobs(
    const std::vector<int32_t>& prompt_ids,
    const std::vector<std::optional<engine::PromptTokenLogprob>>& scores, int top,
    const common::Tokenizer& tokenizer, const nlohmann::ordered_json& generated,
    bool as_token_ids = false);

/// vLLM's `prompt_logprobs`: null for the first prompt token, then per token
/// {"<id>": {"logprob", "rank", "decoded_token"}} for the token itself and the `top` most
/// likely tokens at its position.
nlohmann::ordered_json PromptLogprobs(
    const std::vector<int32_t>& prompt_ids,
    const std::vector<std::optional<engine::PromptTokenLogprob>>& scores, int top,
    const common::Tokenizer& tokenizer);

}  // namespace loom::api
