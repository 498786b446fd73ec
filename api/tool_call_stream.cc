#include "api/tool_call_stream.h"

#include <cstdint>
#include <cstdio>

#include "api/harmony_reply.h"
#include "api/tool_call_text.h"
#include "api/xml_tool_calls.h"
#include "common/unicode.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

using markers::kDsCallBegin;
using markers::kDsCallEnd;
using markers::kDsSep;
using markers::kHermesOpen;
using markers::kPythonTag;

// How far a scan got: the value is whole, the text ends inside it, or it is not JSON.
enum class Scan { kDone, kMore, kBad };

void SkipSpace(std::string_view text, size_t& pos) {
  while (pos < text.size() && IsBlank(text[pos])) ++pos;
}

// A decoded character as nlohmann's dump writes it inside a string (ensure_ascii off).
void AppendEscaped(uint32_t cp, std::string& out) {
  switch (cp) {
    case '"':
      out += "\\\"";
      return;
    case '\\':
      out += "\\\\";
      return;
    case '\b':
      out += "\\b";
      return;
    case '\t':
      out += "\\t";
      return;
    case '\n':
      out += "\\n";
      return;
    case '\f':
      out += "\\f";
      return;
    case '\r':
      out += "\\r";
      return;
    default:
      if (cp < 0x20) {
        char buffer[8];
        std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(cp));
        out += buffer;
      } else {
        common::AppendUtf8(cp, out);
      }
  }
}

bool Hex4(std::string_view text, size_t at, uint32_t& value) {
  value = 0;
  for (size_t i = at; i < at + 4; ++i) {
    const char c = text[i];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return false;
    value = value * 16 + static_cast<uint32_t>(digit);
  }
  return true;
}

// The string starting at text[pos] ('"'): `decoded` gets its characters; `compact` (when
// given) the string as nlohmann's dump writes it, as far as it is final (an escape is
// written once whole).
Scan String(std::string_view text, size_t& pos, std::string* decoded, std::string* compact) {
  if (pos >= text.size() || text[pos] != '"') return Scan::kBad;
  ++pos;
  if (compact != nullptr) *compact += '"';
  while (pos < text.size()) {
    const char c = text[pos];
    if (c == '"') {
      ++pos;
      if (compact != nullptr) *compact += '"';
      return Scan::kDone;
    }
    if (static_cast<unsigned char>(c) < 0x20) return Scan::kBad;
    if (c != '\\') {
      if (decoded != nullptr) *decoded += c;
      if (compact != nullptr) *compact += c;
      ++pos;
      continue;
    }
    if (pos + 1 >= text.size()) return Scan::kMore;
    uint32_t cp = 0;
    size_t length = 2;
    switch (text[pos + 1]) {
      case '"':
        cp = '"';
        break;
      case '\\':
        cp = '\\';
        break;
      case '/':
        cp = '/';
        break;
      case 'b':
        cp = '\b';
        break;
      case 'f':
        cp = '\f';
        break;
      case 'n':
        cp = '\n';
        break;
      case 'r':
        cp = '\r';
        break;
      case 't':
        cp = '\t';
        break;
      case 'u': {
        if (pos + 6 > text.size()) return Scan::kMore;
        if (!Hex4(text, pos + 2, cp)) return Scan::kBad;
        length = 6;
        if (cp >= 0xdc00 && cp <= 0xdfff) return Scan::kBad;  // a lone low surrogate
        if (cp >= 0xd800 && cp <= 0xdbff) {
          if (pos + 12 > text.size()) return Scan::kMore;
          uint32_t low = 0;
          if (text[pos + 6] != '\\' || text[pos + 7] != 'u' || !Hex4(text, pos + 8, low) ||
              low < 0xdc00 || low > 0xdfff) {
            return Scan::kBad;
          }
          cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          length = 12;
        }
        break;
      }
      default:
        return Scan::kBad;
    }
    if (decoded != nullptr) common::AppendUtf8(cp, *decoded);
    if (compact != nullptr) AppendEscaped(cp, *compact);
    pos += length;
  }
  return Scan::kMore;
}

// Nesting beyond this is not scanned (a reply of 10,000 '[' must not exhaust the stack):
// such a call streams nothing more and arrives with the whole parse.
constexpr int kMaxDepth = 128;

// Any JSON value at text[pos]; `compact` (when given) receives it as nlohmann's compact
// dump writes it, as far as it is final (numbers and literals once whole).
Scan Value(std::string_view text, size_t& pos, std::string* compact, int depth = 0) {
  if (depth > kMaxDepth) return Scan::kBad;
  SkipSpace(text, pos);
  if (pos >= text.size()) return Scan::kMore;
  const char c = text[pos];
  if (c == '"') return String(text, pos, nullptr, compact);
  if (c == '{' || c == '[') {
    const char close = c == '{' ? '}' : ']';
    const auto closes = [&] {
      if (text[pos] != close) return false;
      ++pos;
      if (compact != nullptr) *compact += close;
      return true;
    };
    ++pos;
    if (compact != nullptr) *compact += c;
    SkipSpace(text, pos);
    if (pos >= text.size()) return Scan::kMore;
    if (closes()) return Scan::kDone;
    while (true) {
      if (c == '{') {
        SkipSpace(text, pos);
        if (pos >= text.size()) return Scan::kMore;
        if (Scan key = String(text, pos, nullptr, compact); key != Scan::kDone) return key;
        SkipSpace(text, pos);
        if (pos >= text.size()) return Scan::kMore;
        if (text[pos] != ':') return Scan::kBad;
        ++pos;
        if (compact != nullptr) *compact += ':';
      }
      if (Scan item = Value(text, pos, compact, depth + 1); item != Scan::kDone) return item;
      SkipSpace(text, pos);
      if (pos >= text.size()) return Scan::kMore;
      if (closes()) return Scan::kDone;
      if (text[pos] != ',') return Scan::kBad;
      ++pos;
      if (compact != nullptr) *compact += ',';
    }
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    size_t end = pos;
    while (end < text.size() &&
           (std::string_view("+-.eE0123456789").find(text[end]) != std::string_view::npos)) {
      ++end;
    }
    if (end == text.size()) return Scan::kMore;  // more digits may follow
    const Json number =
        Json::parse(text.substr(pos, end - pos), nullptr, /*allow_exceptions=*/false);
    if (number.is_discarded() || !number.is_number()) return Scan::kBad;
    if (compact != nullptr) *compact += number.dump();
    pos = end;
    return Scan::kDone;
  }
  for (std::string_view word : {"true", "false", "null"}) {
    if (word[0] != c) continue;
    const std::string_view have = text.substr(pos, word.size());
    if (word.substr(0, have.size()) != have) return Scan::kBad;
    if (have.size() < word.size()) return Scan::kMore;
    pos += word.size();
    if (compact != nullptr) *compact += word;
    return Scan::kDone;
  }
  return Scan::kBad;
}

// One call object at text[pos] ('{'): {"name": ..., "arguments"/"parameters": ...}, or
// {"function": {...}}.
Scan Call(std::string_view text, size_t& pos, PartialToolCall& call) {
  SkipSpace(text, pos);
  if (pos >= text.size()) return Scan::kMore;
  if (text[pos] != '{') return Scan::kBad;
  ++pos;
  bool has_arguments = false;
  while (true) {
    SkipSpace(text, pos);
    if (pos >= text.size()) return Scan::kMore;
    if (text[pos] == '}') {
      ++pos;
      if (!has_arguments && !call.complete) {
        call.arguments = "{}";
        call.complete = true;
      }
      return Scan::kDone;
    }
    std::string key;
    if (Scan read = String(text, pos, &key, nullptr); read != Scan::kDone) return read;
    SkipSpace(text, pos);
    if (pos >= text.size()) return Scan::kMore;
    if (text[pos] != ':') return Scan::kBad;
    ++pos;
    SkipSpace(text, pos);
    if (pos >= text.size()) return Scan::kMore;
    Scan value = Scan::kDone;
    if (key == "name" && text[pos] == '"') {
      std::string name;
      value = String(text, pos, &name, nullptr);
      if (value == Scan::kDone) call.name = name;
    } else if (key == "function" && text[pos] == '{') {
      value = Call(text, pos, call);
      has_arguments = has_arguments || call.complete;
    } else if ((key == "arguments" || key == "parameters") && !has_arguments) {
      has_arguments = true;
      call.arguments.clear();
      call.complete = false;
      if (text[pos] == '{') {
        value = Value(text, pos, &call.arguments);
      } else if (text[pos] == '"') {
        std::string decoded;
        value = String(text, pos, &decoded, nullptr);
        if (value == Scan::kDone) call.arguments = decoded;
      } else if (text.substr(pos, 4) == "null") {
        value = Value(text, pos, nullptr);
        if (value == Scan::kDone) call.arguments = "{}";
      } else {
        return Scan::kBad;
      }
      call.complete = value == Scan::kDone;
    } else {
      value = Value(text, pos, nullptr);
    }
    if (value != Scan::kDone) return value;
    SkipSpace(text, pos);
    if (pos >= text.size()) return Scan::kMore;
    if (text[pos] == ',') {
      ++pos;
    } else if (text[pos] != '}') {
      return Scan::kBad;
    }
  }
}

// Calls one after another: an array of call objects, or one object.
Scan Calls(std::string_view text, size_t& pos, std::vector<PartialToolCall>& out) {
  SkipSpace(text, pos);
  if (pos >= text.size()) return Scan::kMore;
  const bool array = text[pos] == '[';
  if (array) ++pos;
  while (true) {
    PartialToolCall call;
    const Scan scan = Call(text, pos, call);
    if (!call.name.empty()) out.push_back(std::move(call));
    if (scan != Scan::kDone || !array) return scan;
    SkipSpace(text, pos);
    if (pos >= text.size()) return Scan::kMore;
    if (text[pos] == ']') {
      ++pos;
      return Scan::kDone;
    }
    if (text[pos] != ',') return Scan::kBad;
    ++pos;
  }
}

// A reply that opens a Markdown code fence: past its first line.
void SkipFence(std::string_view text, size_t& pos) {
  if (text.substr(pos, 3) != "```") return;
  const size_t line_end = text.find('\n', pos);
  pos = line_end == std::string_view::npos ? text.size() : line_end + 1;
}

std::vector<PartialToolCall> Generic(std::string_view text) {
  std::vector<PartialToolCall> out;
  size_t pos = 0;
  SkipSpace(text, pos);
  SkipFence(text, pos);
  SkipSpace(text, pos);
  if (pos >= text.size() || text[pos] != '{') return out;
  // {"tool_calls": [...]}, {"tool_call": {...}}, or the call itself.
  size_t key_at = pos + 1;
  SkipSpace(text, key_at);
  std::string key;
  if (String(text, key_at, &key, nullptr) != Scan::kDone) return out;
  if (key == "tool_calls" || key == "tool_call") {
    SkipSpace(text, key_at);
    if (key_at >= text.size() || text[key_at] != ':') return out;
    ++key_at;
    Calls(text, key_at, out);
  } else {
    Calls(text, pos, out);
  }
  return out;
}

std::vector<PartialToolCall> Hermes(std::string_view text) {
  std::vector<PartialToolCall> out;
  size_t at = text.find(kHermesOpen);
  while (at != std::string_view::npos) {
    size_t pos = at + kHermesOpen.size();
    PartialToolCall call;
    const Scan scan = Call(text, pos, call);
    if (!call.name.empty()) out.push_back(std::move(call));
    if (scan != Scan::kDone) break;
    at = text.find(kHermesOpen, pos);
  }
  return out;
}

// Mistral's and Granite's: the JSON list after `marker_text`.
std::vector<PartialToolCall> CallList(std::string_view text, std::string_view marker_text) {
  std::vector<PartialToolCall> out;
  const size_t marker = text.find(marker_text);
  if (marker == std::string_view::npos) return out;
  size_t pos = marker + marker_text.size();
  Calls(text, pos, out);
  return out;
}

std::vector<PartialToolCall> Llama3(std::string_view text) {
  std::vector<PartialToolCall> out;
  size_t pos = 0;
  SkipSpace(text, pos);
  if (text.substr(pos, kPythonTag.size()) == kPythonTag) pos += kPythonTag.size();
  SkipSpace(text, pos);
  SkipFence(text, pos);
  while (true) {
    if (Calls(text, pos, out) != Scan::kDone) break;
    SkipSpace(text, pos);
    if (pos >= text.size() || text[pos] != ';') break;  // Llama 3.2's parallel form
    ++pos;
  }
  return out;
}

// Qwen3-Coder and GLM-4.5: a call once its name is whole; its arguments grow by each
// closed parameter (the value converted as the whole parse converts it).
std::vector<PartialToolCall> XmlPartialCalls(const XmlCallSyntax& syntax, std::string_view text,
                                             const StringParameters& string_parameters) {
  std::vector<PartialToolCall> out;
  for (const XmlCall& call : ScanXmlCalls(syntax, text).calls) {
    out.push_back(
        {call.name, XmlArgumentsJson(call, string_parameters, /*text_ended=*/false), call.closed});
  }
  return out;
}

// DeepSeek-V3: "function<sep>NAME\n```json\n{...}" (V3) or "NAME<sep>{...}" (V3.1).
std::vector<PartialToolCall> DeepSeekV3(std::string_view text) {
  std::vector<PartialToolCall> out;
  for (size_t at = text.find(kDsCallBegin); at != std::string_view::npos;
       at = text.find(kDsCallBegin, at + 1)) {
    const size_t head = at + kDsCallBegin.size();
    const size_t sep = text.find(kDsSep, head);
    if (sep == std::string_view::npos) break;
    const size_t end = text.find(kDsCallEnd, sep);
    std::string_view rest =
        text.substr(sep + kDsSep.size(), end == std::string_view::npos ? std::string_view::npos
                                                                       : end - sep - kDsSep.size());
    PartialToolCall call;
    if (TrimBlanks(text.substr(head, sep - head)) == "function") {
      const size_t newline = rest.find('\n');
      if (newline == std::string_view::npos) break;
      call.name = std::string(TrimBlanks(rest.substr(0, newline)));
      rest = rest.substr(newline + 1);
      size_t pos = 0;
      SkipSpace(rest, pos);
      SkipFence(rest, pos);
      rest = rest.substr(pos);
    } else {
      call.name = std::string(TrimBlanks(text.substr(head, sep - head)));
    }
    if (call.name.empty()) break;
    call.arguments = CompactJsonPrefix(rest);
    call.complete = end != std::string_view::npos;
    out.push_back(std::move(call));
    if (end == std::string_view::npos) break;
  }
  return out;
}

}  // namespace

std::string CompactJsonPrefix(std::string_view text) {
  size_t pos = 0;
  SkipSpace(text, pos);
  std::string out;
  if (pos < text.size() && text[pos] == '{') Value(text, pos, &out);
  return out;
}

std::vector<PartialToolCall> PartialToolCalls(ToolCallFormat format, std::string_view text,
                                              const StringParameters& string_parameters) {
  switch (format) {
    case ToolCallFormat::kGeneric:
      return Generic(text);
    case ToolCallFormat::kHermes:
      return Hermes(text);
    case ToolCallFormat::kMistral:
    case ToolCallFormat::kGranite:
      return CallList(text, CallListMarker(format));
    case ToolCallFormat::kLlama3Json:
      return Llama3(text);
    case ToolCallFormat::kGptOss:
      return HarmonyPartialCalls(text);
    case ToolCallFormat::kQwen3Coder:
      return XmlPartialCalls(kQwen3CoderSyntax, text, string_parameters);
    case ToolCallFormat::kGlm45:
      return XmlPartialCalls(kGlm45Syntax, text, string_parameters);
    case ToolCallFormat::kDeepSeekV3:
      return DeepSeekV3(text);
    case ToolCallFormat::kPythonic:
      return {};
  }
  return {};
}

}  // namespace loom::api
