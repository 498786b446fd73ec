#include "api/xml_tool_calls.h"

#include <algorithm>

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kNpos = std::string_view::npos;

// Where the name after `from` ends when the syntax has no tag for it: at a newline, the
// first key or the call's close, whichever comes first.
size_t UntaggedNameEnd(const XmlCallSyntax& syntax, std::string_view text, size_t from) {
  return std::min(
      {text.find('\n', from), text.find(syntax.key_open, from), text.find(syntax.close, from)});
}

// The arguments of a call's `body`; false when a key is broken (see XmlCalls::broken).
bool ScanArguments(const XmlCallSyntax& syntax, std::string_view body, XmlCall& call) {
  for (size_t p = body.find(syntax.key_open); p != kNpos;) {
    const size_t key_start = p + syntax.key_open.size();
    const size_t key_end = body.find(syntax.key_close, key_start);
    if (key_end == kNpos) return false;
    size_t value = key_end + syntax.key_close.size();
    if (!syntax.value_open.empty()) {
      while (value < body.size() && IsBlank(body[value])) ++value;
      if (body.substr(value, syntax.value_open.size()) != syntax.value_open) return false;
      value += syntax.value_open.size();
    }
    XmlArgument argument;
    argument.key = std::string(TrimBlanks(body.substr(key_start, key_end - key_start)));
    const size_t value_end = body.find(syntax.value_close, value);
    argument.closed = value_end != kNpos;
    argument.value = body.substr(value, argument.closed ? value_end - value : kNpos);
    call.arguments.push_back(std::move(argument));
    if (!call.arguments.back().closed) break;
    p = body.find(syntax.key_open, value_end + syntax.value_close.size());
  }
  return true;
}

// Where the call whose opening tag is at `at` starts: at the wrapper before it (Qwen3-Coder's
// <tool_call>) when only blanks come between.
size_t CallStart(const XmlCallSyntax& syntax, std::string_view text, size_t at) {
  if (syntax.wrapper.empty()) return at;
  const size_t wrapper = text.rfind(syntax.wrapper, at);
  if (wrapper == kNpos) return at;
  const size_t inside = wrapper + syntax.wrapper.size();
  return TrimBlanks(text.substr(inside, at - inside)).empty() ? wrapper : at;
}

}  // namespace

XmlCalls ScanXmlCalls(const XmlCallSyntax& syntax, std::string_view text) {
  XmlCalls out;
  for (size_t at = text.find(syntax.open); at != kNpos;) {
    XmlCall call;
    call.start = CallStart(syntax, text, at);
    const size_t name_start = at + syntax.open.size();
    const size_t name_end = syntax.name_end.empty() ? UntaggedNameEnd(syntax, text, name_start)
                                                    : text.find(syntax.name_end, name_start);
    if (name_end == kNpos) {
      out.broken = true;
      break;
    }
    call.name = std::string(TrimBlanks(text.substr(name_start, name_end - name_start)));
    const size_t body_start = name_end + syntax.name_end.size();
    const size_t close = text.find(syntax.close, body_start);
    call.closed = close != kNpos;
    const std::string_view body = text.substr(body_start, call.closed ? close - body_start : kNpos);
    if (call.name.empty()) {
      out.broken = true;
      break;
    }
    if (!ScanArguments(syntax, body, call)) {
      // An open call keeps the arguments so far (the text may end inside its next key).
      out.broken = true;
      if (!call.closed) out.calls.push_back(std::move(call));
      break;
    }
    out.calls.push_back(std::move(call));
    if (!out.calls.back().closed) break;
    at = text.find(syntax.open, close + syntax.close.size());
  }
  return out;
}

Json XmlValueJson(std::string_view raw, bool as_string) {
  if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
  if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
  if (!as_string) {
    Json parsed = ParseGeneratedJson(TrimBlanks(raw));
    if (!parsed.is_discarded() && !parsed.is_string()) return parsed;
  }
  return Json(std::string(raw));
}

std::string XmlArgumentsJson(const XmlCall& call, const StringParameters& string_parameters,
                             bool text_ended) {
  const bool whole = text_ended || call.closed;
  const auto strings = string_parameters.find(call.name);
  std::string out = "{";
  for (const XmlArgument& argument : call.arguments) {
    if (!argument.closed && !whole) break;  // the value may still grow
    const bool as_string =
        strings != string_parameters.end() && strings->second.contains(argument.key);
    if (out.size() > 1) out += ',';
    out += Json(argument.key).dump(-1, ' ', false, Json::error_handler_t::replace) + ":" +
           XmlValueJson(argument.value, as_string)
               .dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  if (whole) out += '}';
  return out;
}

}  // namespace loom::api
