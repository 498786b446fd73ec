#pragma once

// OpenAI's harmony format (gpt-oss): a reply is a sequence of messages, each
//   [<|start|>assistant[ to=RECIPIENT]]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]
//   <|message|>BODY(<|end|>|<|call|>|<|return|>)
// (the first one's <|start|>assistant is in the prompt). Channel "analysis" is reasoning,
// "final" the answer; a message to "functions.NAME" is a tool call whose body is its
// arguments; "commentary" without a recipient is a preamble shown to the user (content).

#include <string>
#include <string_view>
#include <vector>

#include "api/tool_call_parser.h"
#include "api/tool_call_stream.h"

namespace loom::api {

/// The whole reply: `content` (final and preamble bodies, joined), `reasoning` (analysis
/// bodies) and the calls (arguments compacted as ParseToolCalls does for JSON, a body that
/// is not a JSON object kept as written). A reply without any <|channel|> is all content.
ParsedReply ParseHarmony(std::string_view text);

/// Streaming: the content and reasoning of the reply so far, as far as they are final (a
/// body's text up to a possibly incomplete special token at the end). Both only grow.
struct HarmonyText {
  std::string content;
  std::string reasoning;
};
HarmonyText HarmonySoFar(std::string_view text);

/// Streaming: the calls of the reply so far (PartialToolCalls' contract).
std::vector<PartialToolCall> HarmonyPartialCalls(std::string_view text);

}  // namespace loom::api
