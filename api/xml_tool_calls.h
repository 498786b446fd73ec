#pragma once

// The tool-call formats that write a call as tags around bare text instead of JSON:
//   Qwen3-Coder  <function=NAME><parameter=KEY>VALUE</parameter>...</function>
//   GLM-4.5/4.6  <tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>...
//                </tool_call> (GLM-4.7 writes the same without the newlines)
// One scanner that the whole-reply parser (tool_call_parser) and the streaming one
// (tool_call_stream) share, and the conversion of a value's text to JSON.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "api/tool_call_text.h"
#include "nlohmann/json.hpp"

namespace loom::api {

/// The parameters each function (by name) declares as strings in its JSON Schema. A value
/// of such a parameter stays a string even when its text reads as JSON ("42", "true",
/// "null"), as vLLM's Qwen3-Coder and GLM-4.5 parsers keep it; any other value is the JSON
/// its text reads as, else a string.
using StringParameters = absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>>;

/// A format's tags.
struct XmlCallSyntax {
  std::string_view open;        // starts a call; the name follows
  std::string_view name_end;    // ends the name; "": a newline, the first key or `close` does
  std::string_view close;       // ends the call
  std::string_view key_open;    // before a parameter's name
  std::string_view key_close;   // after it
  std::string_view value_open;  // before the value, after optional blanks; "": none
  std::string_view value_close;
  std::string_view wrapper = {};  // around the calls (Qwen3-Coder's <tool_call>), or ""
};

inline constexpr XmlCallSyntax kQwen3CoderSyntax{markers::kFunctionOpen,
                                                 ">",
                                                 markers::kFunctionClose,
                                                 markers::kParameterOpen,
                                                 ">",
                                                 "",
                                                 markers::kParameterClose,
                                                 markers::kHermesOpen};
inline constexpr XmlCallSyntax kGlm45Syntax{markers::kHermesOpen,   "",
                                            markers::kHermesClose,  markers::kArgKeyOpen,
                                            markers::kArgKeyClose,  markers::kArgValueOpen,
                                            markers::kArgValueClose};

/// One parameter of a call.
struct XmlArgument {
  std::string key;
  std::string_view value;  // its raw text (a view into the scanned text)
  bool closed = false;     // its closing tag was seen; else it runs to the call's or text's end
};

/// One call as far as the text shows it.
struct XmlCall {
  size_t start = 0;  // where its opening tag (or the syntax's wrapper just before it) begins
  std::string name;
  std::vector<XmlArgument> arguments;
  bool closed = false;  // its closing tag was seen
};

struct XmlCalls {
  std::vector<XmlCall> calls;  // in order; only the last may be open
  /// The scan stopped inside a call's head: the text ends inside a name or a key (or before
  /// a key's value tag), or a name is empty, or a key lacks its value tag. An open call whose
  /// key broke is in `calls` with the arguments before it (a reply still streaming); a
  /// whole reply like this is no call (the parser takes it as content).
  bool broken = false;
};

/// The calls of `text` in `syntax`, the first at the first opening tag.
XmlCalls ScanXmlCalls(const XmlCallSyntax& syntax, std::string_view text);

/// A value's text as JSON: one leading and one trailing newline dropped (the formats'
/// layout), then a string when `as_string`, else what reads as JSON other than a string (a
/// number, true, an object...) is that value and anything else the text as a string.
nlohmann::ordered_json XmlValueJson(std::string_view raw, bool as_string);

/// The call's arguments as compact JSON text (keys in the call's order). With `text_ended`
/// (the reply is whole) or the call closed: every argument and the closing brace; else the
/// closed arguments only, so the text only grows as the reply does.
std::string XmlArgumentsJson(const XmlCall& call, const StringParameters& string_parameters,
                             bool text_ended);

}  // namespace loom::api
