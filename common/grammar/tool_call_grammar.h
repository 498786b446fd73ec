#pragma once

// The grammar of a tool call in a model's own format: JSON documents of one schema (a
// call: its name and arguments), each framed by literal text, e.g. Hermes/Qwen2.5's
//   <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
// or Mistral's "[TOOL_CALLS]" before a JSON array of calls. The spec (GrammarKind
// kToolCalls' text) is a JSON object:
//   {"schema": <JSON Schema of one framed document>,
//    "begin": "<tool_call>\n", "end": "\n</tool_call>",   // framing, may be ""
//    "separator": "\n",                                   // between framed documents
//    "repeat": true,                                      // one or more documents
//    "trigger": "<tool_call>",                            // optional: tool_choice auto
//    "trigger_at": "anywhere"}                            //   or "start"
// With a trigger the reply is free text until the trigger occurs (anywhere, or only as
// the reply's first characters after blanks: "start"), and from there the framed
// documents (each must start with the trigger), then blanks: a model that starts a call
// is held to the schema, one that does not writes what it likes. Every text that avoids
// the trigger stays possible.
// Formats whose call is plain JSON (Llama 3.1, the generic fallback) need no framing and
// use kJsonSchema directly. Formats that write a call as tags around bare text (Qwen3-Coder's
//   <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>)
// give "xml" instead of "schema":
//   {"begin": "<tool_call>\n<function=", "end": "</function>\n</tool_call>", ...,
//    "xml": {"name_end": ">\n", "key_begin": "<parameter=", "key_end": ">\n",
//            "value_end": "\n</parameter>\n",
//            "tools": [{"name": "get_weather", "parameters": <JSON Schema of an object>}]}}
// A call is `begin`, one tool's name, name_end, then its parameters in any order (keys from
// the schema's properties; required ones are not enforced), each key_begin KEY key_end
// VALUE value_end, then `end`. A VALUE is bare: a string's text (anything without
// value_end), one of a string enum's values, text for a schema that gives no type, or else
// the JSON its schema describes. With "optional_newlines": true in "xml", every newline in
// the literals (begin, end, separator, name_end, key_begin, key_end, value_end) may be left
// out, and a string value stops at value_end without its newlines (GLM-4.5 writes
//   <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>
// and GLM-4.7 the same without the newlines).

#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace loom::common {

/// The grammar of `spec_json` (above). InvalidArgument for a malformed spec, and naming
/// the keyword for a schema construct JsonSchemaGrammar cannot compile.
absl::StatusOr<GrammarDefinition> ToolCallGrammar(std::string_view spec_json);

}  // namespace loom::common
