#pragma once

// Tool calls written as Python (Llama 3.2's and Llama 4's "pythonic" format):
//   [get_weather(city="Paris", unit='celsius'), get_time(zone=None)]
// Arguments are keyword arguments whose values are Python literals: strings (either
// quote, with escapes), numbers, True/False/None, lists, tuples and dicts.

#include <optional>
#include <string_view>
#include <vector>

#include "api/tool_call_parser.h"

namespace loom::api {

/// The calls of `text` (a bracketed list of calls, or one call; surrounding whitespace
/// allowed), with the arguments as a JSON object's text; nullopt when `text` is anything
/// else (positional arguments, expressions, trailing text).
std::optional<std::vector<ParsedToolCall>> ParsePythonicCalls(std::string_view text);

}  // namespace loom::api
