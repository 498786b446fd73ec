#include "api/reasoning_parser.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::api {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (tag.substr(0, n) == text.substr(text.size() - n)) return n;
  }
  return 0;
}

}  // namespace

absl::StatusOr<ReasoningFormat> ParseReasoningFormat(std::string_view name) {
  if (name.empty()) return ReasoningFormat::kNone;
  if (name == "deepseek_r1" || name == "qwen3" || name == "glm45") {
    return ReasoningFormat::kThinkTags;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--reasoning-parser '", std::string(name),
                   "' is not one Loom has: deepseek_r1, qwen3 or glm45 (<think> tags)"));
}

bool ReasoningStartsInside(std::string_view rendered_prompt) {
  const size_t last = rendered_prompt.find_last_not_of(" \t\r\n");
  return last != std::string_view::npos && rendered_prompt.substr(0, last + 1).ends_with(kOpen);
}

ReasoningSplit SplitReasoning(std::string_view reply, bool starts_inside) {
  ReasoningStream stream(starts_inside);
  ReasoningStream::Delta first = stream.Add(reply);
  ReasoningStream::Delta last = stream.Finish();
  ReasoningSplit split;
  split.content = absl::StrCat(first.content, last.content);
  if (stream.reasoned()) split.reasoning = absl::StrCat(first.reasoning, last.reasoning);
  return split;
}

ReasoningStream::ReasoningStream(bool starts_inside)
    : state_(State::kOpening),
      after_opening_(starts_inside ? State::kInside : State::kOutside),
      reasoned_(starts_inside) {}

ReasoningStream::Delta ReasoningStream::Add(std::string_view text) {
  pending_.append(text);
  return Drain(/*final=*/false);
}

ReasoningStream::Delta ReasoningStream::Finish() { return Drain(/*final=*/true); }

ReasoningStream::Delta ReasoningStream::Drain(bool final) {
  Delta delta;
  while (!pending_.empty()) {
    if (state_ == State::kOpening) {
      // The reply's first non-space text: an opening tag (dropped: a model that opens
      // the thinking its template already opened), or the start of the reply proper.
      const size_t first = pending_.find_first_not_of(" \t\r\n");
      const std::string_view rest =
          first == std::string::npos ? std::string_view() : std::string_view(pending_).substr(first);
      if (rest.starts_with(kOpen)) {
        pending_ = std::string(rest.substr(kOpen.size()));
        state_ = State::kInside;
        reasoned_ = true;
        continue;
      }
      if (!final && kOpen.starts_with(rest)) break;  // could still be the tag
      state_ = after_opening_;
      continue;
    }
    if (state_ == State::kOutside) {
      delta.content += pending_;
      pending_.clear();
      break;
    }
    const size_t close = pending_.find(kClose);
    if (close != std::string::npos) {
      delta.reasoning += pending_.substr(0, close);
      pending_.erase(0, close + kClose.size());
      state_ = State::kOutside;
      continue;
    }
    const size_t held = final ? 0 : PartialTagSuffix(pending_, kClose);
    delta.reasoning += pending_.substr(0, pending_.size() - held);
    pending_.erase(0, pending_.size() - held);
    break;
  }
  return delta;
}

}  // namespace loom::api
