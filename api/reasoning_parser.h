#pragma once

// Reasoning models (`--reasoning-parser`): the part of a chat reply inside
// `<think>...</think>` is returned as `reasoning_content` (vLLM's field) and the rest as
// `content`, whole or streamed.

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace loom::api {

/// The reasoning formats Loom parses. DeepSeek-R1 and Qwen3 (and QwQ, and the models
/// distilled from them) both think between `<think>` and `</think>`; where the reply
/// starts, inside or outside the thinking, is read from the rendered prompt rather than
/// guessed per model (see ReasoningStartsInside).
enum class ReasoningFormat { kNone, kThinkTags };

/// "" -> kNone; "deepseek_r1", "qwen3", "glm45" (vLLM's names) -> kThinkTags. InvalidArgument
/// naming the choices otherwise.
absl::StatusOr<ReasoningFormat> ParseReasoningFormat(std::string_view name);

/// Whether a reply to `rendered_prompt` starts inside the thinking: the prompt ends with
/// `<think>` and whitespace (DeepSeek-R1's and Qwen3-Thinking-2507's templates open it;
/// Qwen3's with `enable_thinking: false` opens and closes it). A `<think>` a user wrote
/// earlier in the conversation does not count.
bool ReasoningStartsInside(std::string_view rendered_prompt);

/// A whole reply split. Inside the thinking until `</think>`; outside, a reply that opens
/// with `<think>` (after whitespace) enters it. No reasoning: `reasoning` is empty.
/// A reply that ends inside the thinking (max_tokens) is all reasoning, `content` empty.
struct ReasoningSplit {
  std::optional<std::string> reasoning;
  std::string content;
};
ReasoningSplit SplitReasoning(std::string_view reply, bool starts_inside);

/// The same split over a streamed reply: text that could still be the start of a tag is
/// held back until it is known (so a tag never reaches the client in pieces). Not
/// thread-safe; one per choice.
class ReasoningStream {
 public:
  explicit ReasoningStream(bool starts_inside);

  struct Delta {
    std::string reasoning;
    std::string content;
  };
  /// Appends newly generated text; returns what can be sent.
  Delta Add(std::string_view text);
  /// The reply ended: everything held back.
  Delta Finish();
  /// Whether the reply was inside the thinking at any point (so far).
  bool reasoned() const { return reasoned_; }

 private:
  // kOpening: before the reply's first non-space text, which may open the thinking.
  enum class State { kOpening, kInside, kOutside };
  Delta Drain(bool final);

  State state_;
  State after_opening_;  // where a reply that does not open with <think> is
  bool reasoned_;
  std::string pending_;  // not yet sent: a possible tag start, or leading whitespace
};

}  // namespace loom::api
