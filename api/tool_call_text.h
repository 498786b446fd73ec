#pragma once

// The text of the tool-call formats (api/tool_call_parser.h) that the whole-reply parser
// and the streaming scanner share: the formats' literal markers and JSON's blanks.

#include <string_view>

#include "common/json_depth.h"
#include "nlohmann/json.hpp"

namespace loom::api::markers {

inline constexpr std::string_view kHermesOpen = "<tool_call>";
inline constexpr std::string_view kHermesClose = "</tool_call>";
inline constexpr std::string_view kMistral = "[TOOL_CALLS]";
inline constexpr std::string_view kGranite = "<|tool_call|>";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";
inline constexpr std::string_view kFunctionOpen = "<function=";  // Qwen3-Coder
inline constexpr std::string_view kFunctionClose = "</function>";
inline constexpr std::string_view kParameterOpen = "<parameter=";
inline constexpr std::string_view kParameterClose = "</parameter>";
inline constexpr std::string_view kArgKeyOpen = "<arg_key>";  // GLM-4.5
inline constexpr std::string_view kArgKeyClose = "</arg_key>";
inline constexpr std::string_view kArgValueOpen = "<arg_value>";
inline constexpr std::string_view kArgValueClose = "</arg_value>";
inline constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";  // DeepSeek-V3
inline constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
inline constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";

}  // namespace loom::api::markers

namespace loom::api {

/// JSON's insignificant whitespace.
inline bool IsBlank(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/// `text` as JSON, or discarded when it is not JSON or nests deeper than Loom takes from
/// anyone (generated text is no call then; see json_depth.h).
inline nlohmann::ordered_json ParseGeneratedJson(std::string_view text) {
  if (common::JsonNestingDepth(text) > common::kMaxJsonNestingDepth) {
    return nlohmann::ordered_json::value_t::discarded;
  }
  return nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr,
                                       /*allow_exceptions=*/false);
}

/// `text` without leading and trailing blanks.
inline std::string_view TrimBlanks(std::string_view text) {
  while (!text.empty() && IsBlank(text.front())) text.remove_prefix(1);
  while (!text.empty() && IsBlank(text.back())) text.remove_suffix(1);
  return text;
}

}  // namespace loom::api
