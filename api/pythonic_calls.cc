#include "api/pythonic_calls.h"

#include <cctype>
#include <string>
#include <utility>

#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

using Json = nlohmann::ordered_json;

// A recursive-descent reader over `text`; every Read* leaves `at` after what it read and
// returns false (position unspecified) on anything it does not accept.
class Reader {
 public:
  explicit Reader(std::string_view text) : text_(text) {}

  bool AtEnd() {
    SkipSpace();
    return at_ == text_.size();
  }
  bool Accept(char c) {
    SkipSpace();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  bool Peek(char c) {
    SkipSpace();
    return at_ < text_.size() && text_[at_] == c;
  }

  bool ReadName(std::string& name) {
    SkipSpace();
    const size_t start = at_;
    while (at_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_' ||
            (at_ > start && (text_[at_] == '.' || text_[at_] == '-')))) {
      ++at_;
    }
    if (at_ == start || std::isdigit(static_cast<unsigned char>(text_[start]))) return false;
    name = std::string(text_.substr(start, at_ - start));
    return true;
  }

  // name(key=value, ...)
  bool ReadCall(ParsedToolCall& call) {
    if (!ReadName(call.name) || !Accept('(')) return false;
    Json arguments = Json::object();
    while (!Accept(')')) {
      if (!arguments.empty() && !Accept(',')) return false;
      if (Accept(')')) break;  // a trailing comma
      std::string key;
      Json value;
      if (!ReadName(key) || !Accept('=') || !ReadValue(value, 0)) return false;
      arguments[key] = std::move(value);
    }
    call.arguments = arguments.dump(-1, ' ', false, Json::error_handler_t::replace);
    return true;
  }

  bool ReadValue(Json& value, int depth) {
    if (depth > 64) return false;
    SkipSpace();
    if (at_ >= text_.size()) return false;
    const char c = text_[at_];
    if (c == '"' || c == '\'') return ReadString(value);
    if (c == '[' || c == '(') return ReadSequence(c == '[' ? ']' : ')', value, depth);
    if (c == '{') return ReadDict(value, depth);
    if (c == '-' || c == '+' || c == '.' || std::isdigit(static_cast<unsigned char>(c))) {
      return ReadNumber(value);
    }
    std::string word;
    if (!ReadName(word)) return false;
    if (word == "True" || word == "true") {
      value = true;
    } else if (word == "False" || word == "false") {
      value = false;
    } else if (word == "None" || word == "null") {
      value = nullptr;
    } else {
      return false;  // a variable or a call: not a literal
    }
    return true;
  }

 private:
  void SkipSpace() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }

  bool ReadString(Json& value) {
    const char quote = text_[at_++];
    std::string out;
    while (at_ < text_.size() && text_[at_] != quote) {
      char c = text_[at_++];
      if (c == '\\') {
        if (at_ >= text_.size()) return false;
        const char e = text_[at_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case '0': c = '\0'; break;
          default: c = e;  // \\, \', \" and anything else taken literally
        }
      }
      out += c;
    }
    if (at_ >= text_.size()) return false;
    ++at_;
    value = std::move(out);
    return true;
  }

  bool ReadNumber(Json& value) {
    const size_t start = at_;
    while (at_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[at_])) ||
                                  text_[at_] == '.' || text_[at_] == '-' || text_[at_] == '+')) {
      ++at_;
    }
    std::string number(text_.substr(start, at_ - start));
    if (!number.empty() && number[0] == '+') number.erase(0, 1);
    const Json parsed = Json::parse(number, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_number()) return false;
    value = parsed;
    return true;
  }

  bool ReadSequence(char close, Json& value, int depth) {
    ++at_;
    value = Json::array();
    while (!Accept(close)) {
      if (!value.empty() && !Accept(',')) return false;
      if (Accept(close)) break;
      Json item;
      if (!ReadValue(item, depth + 1)) return false;
      value.push_back(std::move(item));
    }
    return true;
  }

  bool ReadDict(Json& value, int depth) {
    ++at_;
    value = Json::object();
    while (!Accept('}')) {
      if (!value.empty() && !Accept(',')) return false;
      if (Accept('}')) break;
      Json key;
      Json item;
      if (!ReadValue(key, depth + 1) || !key.is_string() || !Accept(':') ||
          !ReadValue(item, depth + 1)) {
        return false;
      }
      value[key.get<std::string>()] = std::move(item);
    }
    return true;
  }

  std::string_view text_;
  size_t at_ = 0;
};

}  // namespace

std::optional<std::vector<ParsedToolCall>> ParsePythonicCalls(std::string_view text) {
  Reader reader(text);
  std::vector<ParsedToolCall> calls;
  const bool list = reader.Accept('[');
  do {
    ParsedToolCall call;
    if (!reader.ReadCall(call)) return std::nullopt;
    calls.push_back(std::move(call));
  } while (list && reader.Accept(','));
  if (list && !reader.Accept(']')) return std::nullopt;
  if (!reader.AtEnd()) return std::nullopt;
  return calls;
}

}  // namespace loom::api
