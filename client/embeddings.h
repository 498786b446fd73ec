#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::client {

/// One input of Client::Embed: a text (tokenized by the coordinator) or token ids.
struct EmbedInput {
  std::string text;
  std::vector<int32_t> token_ids;  // used when non-empty (then `text` is ignored)

  static EmbedInput Text(std::string text) { return {std::move(text), {}}; }
  static EmbedInput Tokens(std::vector<int32_t> ids) { return {"", std::move(ids)}; }
};

/// Client::Embed's answer: one vector per input, in input order (the input's last token's
/// final hidden state, L2-normalized, as POST /v1/embeddings computes it).
struct Embeddings {
  std::vector<std::vector<float>> vectors;
  std::vector<int32_t> input_tokens;  // each input's token count
  int64_t prompt_tokens = 0;          // their sum
};

}  // namespace loom::client
