#pragma once

// The grammar of a tool call in a model's own format: JSON documents of one schema (a
// call: its name and arguments), each framed by literal text, e.g. Hermes/Qwen2.5's
//   <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
// or Mistral's "[TOOL_CALLS]" before a JSON array of calls. The spec (GrammarKind
// kToolCalls' text) is a JSON object:
//   {"schema": <JSON Schema of one framed document>,
//    "begin": "<tool_call>\n", "end": "\n</tool_call>",   // framing, may be ""
//    "separator": "\n",                                   // between framed documents
//    "repeat": true}                                      // one or more documents
// Formats whose call is plain JSON (Llama 3.1, the generic fallback) need no framing and
// use kJsonSchema directly.

#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace loom::common {

/// The grammar of `spec_json` (above). InvalidArgument for a malformed spec, and naming
/// the keyword for a schema construct JsonSchemaGrammar cannot compile.
absl::StatusOr<GrammarDefinition> ToolCallGrammar(std::string_view spec_json);

}  // namespace loom::common
