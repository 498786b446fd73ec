#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "api/tool_call_parser.h"

namespace loom::api {

/// A tool call as far as a reply still being generated shows it.
struct PartialToolCall {
  std::string name;       // complete: a call is reported once its name is
  std::string arguments;  // the arguments so far, a prefix of what ParseToolCalls returns
  bool complete = false;  // the arguments are closed (what ParseToolCalls returns, whole)
};

/// The calls visible in `text`, a reply so far (every format but pythonic), in order. Object
/// arguments come in the compact form ParseToolCalls gives them (whitespace outside strings
/// dropped, each string and number written as nlohmann's dump writes it: only what is final so
/// far), so the arguments of a call only grow as the reply does and end equal to the parsed call's.
/// Arguments sent as a JSON string are reported when the string is complete. Qwen3-Coder's and
/// GLM-4.5's arguments grow by whole parameters (`string_parameters` as for ParseToolCalls),
/// DeepSeek-V3's like JSON ones. Empty for pythonic replies (their calls arrive whole when the
/// reply ends) and for a reply that is not (yet) a call.
std::vector<PartialToolCall> PartialToolCalls(ToolCallFormat format, std::string_view text,
                                              const StringParameters& string_parameters = {});

/// The compact form (as ParseToolCalls writes object arguments) of the JSON object `text`
/// starts with (after blanks), as far as it is final; empty when it does not start one.
std::string CompactJsonPrefix(std::string_view text);

}  // namespace loom::api
