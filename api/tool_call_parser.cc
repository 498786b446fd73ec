#include "api/tool_call_parser.h"

#include <algorithm>
#include <random>

#include "api/harmony_reply.h"
#include "api/pythonic_calls.h"
#include "api/tool_call_text.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

// Ordered: arguments keep the model's key order in the JSON text handed back.
using Json = nlohmann::ordered_json;

using markers::kDsCallBegin;
using markers::kDsCallEnd;
using markers::kDsCallsBegin;
using markers::kDsSep;
using markers::kFunctionOpen;
using markers::kHermesClose;
using markers::kHermesOpen;
using markers::kPythonTag;

// A reply that holds no (well-formed) call: all content.
ParsedReply ContentOnly(std::string_view text) { return ParsedReply{text.size(), {}, {}, {}}; }

ParsedReply WithCalls(std::vector<ParsedToolCall> calls, size_t content_end) {
  return ParsedReply{content_end, std::move(calls), {}, {}};
}

// {"name": ..., <arguments_key>: {...} or "..."} as a call; false when it is not one.
bool CallFromJson(const Json& value, ParsedToolCall& call) {
  if (!value.is_object()) return false;
  // Hermes and the generic format may nest the call as {"function": {...}}.
  const Json& call_json =
      value.contains("function") && value["function"].is_object() ? value["function"] : value;
  auto name = call_json.find("name");
  if (name == call_json.end() || !name->is_string() || name->get<std::string>().empty()) {
    return false;
  }
  call.name = name->get<std::string>();
  auto arguments = call_json.find("arguments");
  if (arguments == call_json.end()) arguments = call_json.find("parameters");
  if (arguments == call_json.end() || arguments->is_null()) {
    call.arguments = "{}";
  } else if (arguments->is_string()) {
    call.arguments = arguments->get<std::string>();
  } else if (arguments->is_object()) {
    call.arguments = arguments->dump(-1, ' ', false, Json::error_handler_t::replace);
  } else {
    return false;
  }
  return true;
}

// A list of calls (an array) or one call.
bool CallsFromJson(const Json& value, std::vector<ParsedToolCall>& calls) {
  if (value.is_array()) {
    if (value.empty()) return false;
    for (const Json& item : value) {
      ParsedToolCall call;
      if (!CallFromJson(item, call)) return false;
      calls.push_back(std::move(call));
    }
    return true;
  }
  ParsedToolCall call;
  if (!CallFromJson(value, call)) return false;
  calls.push_back(std::move(call));
  return true;
}

// A reply wrapped in a Markdown code fence (```json ... ```): the inside.
std::string_view Unfenced(std::string_view text) {
  if (text.substr(0, 3) != "```") return text;
  const size_t line_end = text.find('\n');
  if (line_end == std::string_view::npos) return text;
  std::string_view inside = text.substr(line_end + 1);
  const size_t close = inside.rfind("```");
  if (close != std::string_view::npos) inside = inside.substr(0, close);
  return TrimBlanks(inside);
}

ParsedReply ParseHermes(std::string_view text) {
  const ParsedReply reply = ContentOnly(text);
  const size_t first = text.find(kHermesOpen);
  if (first == std::string_view::npos) return reply;
  size_t at = first;
  std::vector<ParsedToolCall> calls;
  while (at != std::string_view::npos) {
    const size_t body = at + kHermesOpen.size();
    size_t close = text.find(kHermesClose, body);
    // The last call may be cut short of its closing tag (EOS right after the JSON).
    const std::string_view inner = TrimBlanks(
        text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body));
    ParsedToolCall call;
    if (!CallFromJson(ParseGeneratedJson(inner), call)) return reply;  // not a call: all content
    calls.push_back(std::move(call));
    if (close == std::string_view::npos) break;
    at = text.find(kHermesOpen, close + kHermesClose.size());
  }
  return WithCalls(std::move(calls), first);
}

// Mistral's and Granite's: the JSON list of calls after `marker_text`.
ParsedReply ParseCallList(std::string_view text, std::string_view marker_text) {
  const ParsedReply reply = ContentOnly(text);
  const size_t marker = text.find(marker_text);
  if (marker == std::string_view::npos) return reply;
  std::vector<ParsedToolCall> calls;
  if (!CallsFromJson(ParseGeneratedJson(TrimBlanks(text.substr(marker + marker_text.size()))),
                     calls)) {
    return reply;
  }
  return WithCalls(std::move(calls), marker);
}

ParsedReply ParseLlama3(std::string_view text) {
  const ParsedReply reply = ContentOnly(text);
  std::string_view body = TrimBlanks(text);
  if (body.substr(0, kPythonTag.size()) == kPythonTag)
    body = TrimBlanks(body.substr(kPythonTag.size()));
  body = Unfenced(body);
  std::vector<ParsedToolCall> calls;
  Json whole = ParseGeneratedJson(body);
  if (!whole.is_discarded()) {
    if (!CallsFromJson(whole, calls)) return reply;
  } else {
    // Several calls separated by ';' (Llama 3.2's parallel form).
    size_t start = 0;
    while (start <= body.size()) {
      size_t end = body.find(';', start);
      // A ';' inside a string value: extend until the piece parses.
      Json piece;
      while (true) {
        piece = ParseGeneratedJson(TrimBlanks(body.substr(
            start, end == std::string_view::npos ? std::string_view::npos : end - start)));
        if (!piece.is_discarded() || end == std::string_view::npos) break;
        end = body.find(';', end + 1);
      }
      ParsedToolCall call;
      if (!CallFromJson(piece, call)) return reply;
      calls.push_back(std::move(call));
      if (end == std::string_view::npos) break;
      start = end + 1;
    }
  }
  return WithCalls(std::move(calls), 0);
}

ParsedReply ParseGeneric(std::string_view text) {
  const ParsedReply reply = ContentOnly(text);
  const Json value = ParseGeneratedJson(Unfenced(TrimBlanks(text)));
  if (!value.is_object()) return reply;
  std::vector<ParsedToolCall> calls;
  if (auto list = value.find("tool_calls"); list != value.end()) {
    if (!list->is_array() || !CallsFromJson(*list, calls)) return reply;
  } else if (auto one = value.find("tool_call"); one != value.end()) {
    if (!CallsFromJson(*one, calls)) return reply;
  } else if (!CallsFromJson(value, calls)) {
    return reply;
  }
  return WithCalls(std::move(calls), 0);
}

// Qwen3-Coder's and GLM-4.5's tags: the content ends where the first call starts.
ParsedReply ParseXmlCalls(const XmlCallSyntax& syntax, std::string_view text,
                          const StringParameters& string_parameters) {
  const XmlCalls scan = ScanXmlCalls(syntax, text);
  if (scan.broken || scan.calls.empty()) return ContentOnly(text);
  std::vector<ParsedToolCall> calls;
  for (const XmlCall& call : scan.calls) {
    calls.push_back({call.name, XmlArgumentsJson(call, string_parameters, /*text_ended=*/true)});
  }
  return WithCalls(std::move(calls), scan.calls.front().start);
}

ParsedReply ParseDeepSeekV3(std::string_view text) {
  const ParsedReply reply = ContentOnly(text);
  const size_t begin = text.find(kDsCallBegin);
  if (begin == std::string_view::npos) return reply;
  const size_t wrapper = text.rfind(kDsCallsBegin, begin);
  std::vector<ParsedToolCall> calls;
  for (size_t at = begin; at != std::string_view::npos; at = text.find(kDsCallBegin, at + 1)) {
    const size_t head = at + kDsCallBegin.size();
    const size_t sep = text.find(kDsSep, head);
    if (sep == std::string_view::npos) return reply;
    const size_t end = text.find(kDsCallEnd, sep);
    std::string_view rest = text.substr(
        sep + kDsSep.size(), end == std::string_view::npos ? std::string_view::npos : end - sep - kDsSep.size());
    ParsedToolCall call;
    std::string_view json_text;
    if (TrimBlanks(text.substr(head, sep - head)) == "function") {
      // V3: "function<sep>NAME\n```json\n{...}\n```".
      const size_t newline = rest.find('\n');
      if (newline == std::string_view::npos) return reply;
      call.name = std::string(TrimBlanks(rest.substr(0, newline)));
      json_text = Unfenced(TrimBlanks(rest.substr(newline + 1)));
    } else {
      // V3.1: "NAME<sep>{...}".
      call.name = std::string(TrimBlanks(text.substr(head, sep - head)));
      json_text = TrimBlanks(rest);
    }
    const Json arguments = ParseGeneratedJson(json_text);
    if (call.name.empty() || !arguments.is_object()) return reply;
    call.arguments = arguments.dump(-1, ' ', false, Json::error_handler_t::replace);
    calls.push_back(std::move(call));
    if (end == std::string_view::npos) break;
  }
  return WithCalls(std::move(calls), wrapper != std::string_view::npos ? wrapper : begin);
}

ParsedReply ParsePythonic(std::string_view text) {
  const ParsedReply reply = ContentOnly(text);
  std::string_view body = TrimBlanks(text);
  if (body.substr(0, kPythonTag.size()) == kPythonTag)
    body = TrimBlanks(body.substr(kPythonTag.size()));
  std::optional<std::vector<ParsedToolCall>> calls = ParsePythonicCalls(Unfenced(body));
  if (!calls) return reply;
  return WithCalls(*std::move(calls), 0);
}

// Bytes of `text` before `marker` or before a suffix that may be its beginning.
size_t BeforeMarker(std::string_view text, std::string_view marker) {
  const size_t at = text.find(marker);
  if (at != std::string_view::npos) return at;
  for (size_t len = std::min(text.size(), marker.size() - 1); len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return text.size() - len;
  }
  return text.size();
}

}  // namespace

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kGeneric:
      return "generic";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kGranite:
      return "granite";
    case ToolCallFormat::kPythonic:
      return "pythonic";
    case ToolCallFormat::kQwen3Coder:
      return "qwen3_coder";
    case ToolCallFormat::kGlm45:
      return "glm45";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kGptOss:
      return "gpt_oss";
  }
  return "generic";
}

ToolCallFormat ToolCallFormatOf(std::string_view source) {
  auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  if (has("<|channel|>") && has("<|message|>")) return ToolCallFormat::kGptOss;
  if (has(kFunctionOpen) && has(markers::kParameterOpen)) return ToolCallFormat::kQwen3Coder;
  if (has(markers::kArgKeyOpen)) return ToolCallFormat::kGlm45;
  if (has(kDsCallsBegin)) return ToolCallFormat::kDeepSeekV3;
  if (has(markers::kGranite)) return ToolCallFormat::kGranite;
  if (has("<tool_call>")) return ToolCallFormat::kHermes;
  if (has("[TOOL_CALLS]")) return ToolCallFormat::kMistral;
  if (has("[func_name1(")) return ToolCallFormat::kPythonic;
  if (has("<|python_tag|>") || has("ipython")) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kGeneric;
}

bool TemplateRendersTools(std::string_view source) {
  return ToolCallFormatOf(source) != ToolCallFormat::kGeneric &&
         source.find("tools") != std::string_view::npos;
}

std::string_view CallListMarker(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kMistral:
      return markers::kMistral;
    case ToolCallFormat::kGranite:
      return markers::kGranite;
    default:
      return {};
  }
}

ParsedReply ParseToolCalls(ToolCallFormat format, std::string_view text,
                           const StringParameters& string_parameters) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return ParseHermes(text);
    case ToolCallFormat::kMistral:
    case ToolCallFormat::kGranite:
      return ParseCallList(text, CallListMarker(format));
    case ToolCallFormat::kLlama3Json:
      return ParseLlama3(text);
    case ToolCallFormat::kGeneric:
      return ParseGeneric(text);
    case ToolCallFormat::kGptOss:
      return ParseHarmony(text);
    case ToolCallFormat::kPythonic:
      return ParsePythonic(text);
    case ToolCallFormat::kQwen3Coder:
      return ParseXmlCalls(kQwen3CoderSyntax, text, string_parameters);
    case ToolCallFormat::kGlm45:
      return ParseXmlCalls(kGlm45Syntax, text, string_parameters);
    case ToolCallFormat::kDeepSeekV3:
      return ParseDeepSeekV3(text);
  }
  return ParseGeneric(text);
}

size_t StreamableContent(ToolCallFormat format, std::string_view text) {
  switch (format) {
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kGlm45:
      return BeforeMarker(text, kHermesOpen);
    case ToolCallFormat::kMistral:
    case ToolCallFormat::kGranite:
      return BeforeMarker(text, CallListMarker(format));
    case ToolCallFormat::kQwen3Coder:
      return std::min(BeforeMarker(text, kHermesOpen), BeforeMarker(text, kFunctionOpen));
    case ToolCallFormat::kDeepSeekV3:
      return std::min(BeforeMarker(text, kDsCallsBegin), BeforeMarker(text, kDsCallBegin));
    case ToolCallFormat::kGptOss:
      return 0;  // its content is no prefix of the reply: HarmonySoFar streams it
    case ToolCallFormat::kPythonic:
    case ToolCallFormat::kLlama3Json:
    case ToolCallFormat::kGeneric: {
      // The whole reply is the call: held while it may still be one (it starts like JSON,
      // a code fence or the python tag), streamed at once when it cannot.
      const std::string_view body = TrimBlanks(text);
      if (body.empty()) return 0;
      const char first = body.front();
      if (first == '{' || first == '[' || first == '`' || first == '<') return 0;
      return text.size();
    }
  }
  return text.size();
}

std::string NewToolCallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[generator() % (sizeof(kAlphabet) - 1)];
  return id;
}

}  // namespace loom::api
