#include "common/jinja/jinja_filters.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/jinja/jinja_builtins.h"
#include "common/jinja/jinja_operators.h"
#include "common/jinja/jinja_string.h"
#include "common/status_macros.h"

namespace loom::common::jinja {
namespace {

constexpr absl::string_view kFilters[] = {
    "abs",     "capitalize", "count",  "d",      "default",    "dictsort", "e",          "escape",
    "first",   "float",      "indent", "int",    "items",      "join",     "last",       "length",
    "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr", "replace",
    "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",     "sum",
    "title",   "tojson",     "trim",   "unique", "upper"};

constexpr absl::string_view kTests[] = {
    "boolean", "callable",  "defined", "divisibleby", "eq",     "equalto",     "escaped",
    "even",    "false",     "float",   "ge",          "gt",     "greaterthan", "in",
    "integer", "iterable",  "le",      "lessthan",    "lower",  "lt",          "mapping",
    "ne",      "none",      "number",  "odd",         "sameas", "sequence",    "string",
    "true",    "undefined", "upper",   "==",          "!=",     "<",           "<=",
    ">",       ">="};

// Large enough for any chat prompt; bounds `sum` on strings and lists.
constexpr size_t kMaxValueBytes = size_t{64} << 20;

absl::Status Error(absl::string_view message) { return absl::InvalidArgumentError(message); }

bool Flag(const Value& arg, bool fallback) { return IsGiven(arg) ? arg.Truthy() : fallback; }

// jinja2's make_attrgetter: "a.b.0" looks up item by item; `default` replaces an
// Undefined result.
absl::StatusOr<Value> GetAttrPath(const Value& item, const Value& attribute,
                                  const Value* default_value = nullptr) {
  Value current = item;
  if (attribute.is_int()) {
    LOOM_ASSIGN_OR_RETURN(current, GetItem(current, attribute));
  } else {
    for (absl::string_view part : absl::StrSplit(attribute.Str(), '.')) {
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                 [](char c) { return c >= '0' && c <= '9'; });
      Value key = digits ? Value::Int(std::strtoll(std::string(part).c_str(), nullptr, 10))
                         : Value::String(std::string(part));
      LOOM_ASSIGN_OR_RETURN(current, GetItem(current, key));
    }
  }
  if (default_value != nullptr && current.is_undefined()) return *default_value;
  return current;
}

Value IgnoreCase(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return Value::String(PyLower(v.AsString()));
}

// Sort/min/max key of `item`.
absl::StatusOr<Value> KeyOf(const Value& item, const Value& attribute, bool case_sensitive) {
  Value key = item;
  if (IsGiven(attribute) && !attribute.is_none()) {
    LOOM_ASSIGN_OR_RETURN(key, GetAttrPath(item, attribute));
  }
  return IgnoreCase(key, case_sensitive);
}

absl::Status SortValues(std::vector<std::pair<Value, Value>>& keyed, bool reverse) {
  absl::Status status;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (!status.ok()) return false;
    auto order = reverse ? Compare(b.first, a.first) : Compare(a.first, b.first);
    if (!order.ok()) {
      status = order.status();
      return false;
    }
    return *order < 0;
  });
  return status;
}

// Python's int(str, base).
std::optional<int64_t> ParsePyInt(absl::string_view text, int base) {
  std::string s = PyStrip(text, nullptr, true, true);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (base == 16 && s.size() >= i + 2 && s[i] == '0' && (s[i + 1] | 0x20) == 'x') i += 2;
  std::string digits;
  bool previous_digit = false;
  for (; i < s.size(); ++i) {
    if (s[i] == '_' && previous_digit && i + 1 < s.size() && s[i + 1] != '_') {
      previous_digit = false;
      continue;
    }
    int digit = std::isdigit(static_cast<unsigned char>(s[i]))   ? s[i] - '0'
                : std::isalpha(static_cast<unsigned char>(s[i])) ? (s[i] | 0x20) - 'a' + 10
                                                                 : 99;
    if (digit >= base) return std::nullopt;
    digits += s[i];
    previous_digit = true;
  }
  if (digits.empty()) return std::nullopt;
  errno = 0;
  long long value = std::strtoll(digits.c_str(), nullptr, base);
  if (errno == ERANGE) return std::nullopt;
  return negative ? -value : value;
}

// Python's float(str).
std::optional<double> ParsePyFloat(absl::string_view text) {
  std::string s = PyStrip(text, nullptr, true, true);
  std::string cleaned;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        return std::nullopt;
      }
      continue;
    }
    cleaned += s[i];
  }
  std::string lower = PyLower(cleaned);
  size_t sign = (!lower.empty() && (lower[0] == '+' || lower[0] == '-')) ? 1 : 0;
  std::string body = lower.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    double v = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -v : v;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != std::string::npos) {
    return std::nullopt;
  }
  char* end = nullptr;
  double value = std::strtod(cleaned.c_str(), &end);
  if (end != cleaned.c_str() + cleaned.size()) return std::nullopt;
  return value;
}

absl::StatusOr<Value> ToInt(const Value& value, const Value& fallback, int base) {
  if (value.is_string()) {
    if (auto parsed = ParsePyInt(value.AsString(), base)) return Value::Int(*parsed);
    if (auto parsed = ParsePyFloat(value.AsString())) {
      if (std::isinf(*parsed)) return Error("cannot convert float infinity to integer");
      if (std::isnan(*parsed)) return fallback;
      return Value::Int(static_cast<int64_t>(std::trunc(*parsed)));
    }
    return fallback;
  }
  if (value.is_bool() || value.is_int())
    return Value::Int(value.is_bool() ? value.AsBool() : value.AsInt());
  if (value.is_float()) {
    double d = value.AsDouble();
    if (std::isinf(d)) return Error("cannot convert float infinity to integer");
    if (std::isnan(d)) return fallback;
    if (std::fabs(d) >= 9.2e18)
      return Error("integer overflow: Loom's templates use 64-bit integers");
    return Value::Int(static_cast<int64_t>(std::trunc(d)));
  }
  return fallback;
}

absl::StatusOr<Value> Round(const Value& value, const Value& precision_arg,
                            const Value& method_arg) {
  std::string method = IsGiven(method_arg) ? method_arg.Str() : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return Error("method must be common, ceil or floor");
  }
  int64_t precision = 0;
  if (IsGiven(precision_arg)) {
    if (!precision_arg.is_int()) return Error("round: precision must be an integer");
    precision = precision_arg.AsInt();
  }
  if (!value.is_number()) {
    return Error(absl::StrCat("type ", value.TypeName(), " doesn't define __round__ method"));
  }
  if (precision < 0 || precision > 30) return Error("round: unsupported precision");
  if (method == "common") {
    if (!value.is_float()) return Value::Int(value.is_bool() ? value.AsBool() : value.AsInt());
    double d = value.AsDouble();
    if (!std::isfinite(d)) return value;
    // printf rounds the exact binary value half-to-even, as Python's round() does.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), d);
    return Value::Float(std::strtod(buf, nullptr));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double scaled = value.AsDouble() * scale;
  return Value::Float((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

absl::StatusOr<Value> Indent(const Value& input, const Value& width_arg, const Value& first_arg,
                             const Value& blank_arg) {
  if (!input.is_string()) return Error("indent: value must be a string");
  std::string indention = "    ";
  if (IsGiven(width_arg)) {
    if (width_arg.is_string()) {
      indention = width_arg.AsString();
    } else if (width_arg.is_int()) {
      indention = std::string(static_cast<size_t>(std::max<int64_t>(0, width_arg.AsInt())), ' ');
    } else {
      return Error("indent: width must be an int or a string");
    }
  }
  std::vector<std::string> lines = PySplitLines(input.AsString() + "\n");
  std::string out;
  if (Flag(blank_arg, false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + indention;
      out += lines[i];
    }
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += indention;
      out += lines[i];
    }
  }
  if (Flag(first_arg, false)) out = indention + out;
  return Value::String(std::move(out), input.is_markup());
}

absl::StatusOr<Value> ToJsonFilter(const Value& input, const std::vector<Value>& a) {
  JsonOptions options;
  options.ensure_ascii = Flag(a[0], false);
  if (IsGiven(a[1]) && !a[1].is_none()) {
    if (!a[1].is_int()) return Error("tojson: indent must be an integer");
    options.indent = static_cast<int>(std::max<int64_t>(0, a[1].AsInt()));
  }
  if (IsGiven(a[2]) && !a[2].is_none()) {
    if (!a[2].is_list() || a[2].AsList().size() != 2 || !a[2].AsList()[0].is_string() ||
        !a[2].AsList()[1].is_string()) {
      return Error("tojson: separators must be a pair of strings");
    }
    options.item_separator = a[2].AsList()[0].AsString();
    options.key_separator = a[2].AsList()[1].AsString();
    if (options.item_separator.empty() || options.key_separator.empty()) {
      return Error("tojson: empty separators are not supported");
    }
  }
  options.sort_keys = Flag(a[3], false);
  LOOM_ASSIGN_OR_RETURN(std::string json, ToJson(input, options));
  return Value::String(std::move(json));
}

// select/reject/selectattr/rejectattr.
absl::StatusOr<Value> SelectOrReject(const Value& input, CallArgs& args, bool lookup_attr,
                                     bool select) {
  LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  size_t offset = 0;
  Value attribute;
  if (lookup_attr) {
    if (args.positional.empty()) return Error("Missing parameter for attribute name");
    attribute = args.positional[0];
    offset = 1;
  }
  std::string test;
  CallArgs test_args;
  bool has_test = args.positional.size() > offset;
  if (has_test) {
    test = args.positional[offset].Str();
    if (!IsKnownTest(test)) return Error(absl::StrCat("No test named '", test, "'."));
    test_args.positional.assign(args.positional.begin() + offset + 1, args.positional.end());
    test_args.keyword = args.keyword;
  } else if (!args.keyword.empty()) {
    return Error("unexpected keyword arguments");
  }
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (lookup_attr) {
      LOOM_ASSIGN_OR_RETURN(subject, GetAttrPath(item, attribute));
    }
    bool passed = false;
    if (has_test) {
      CallArgs call = test_args;
      LOOM_ASSIGN_OR_RETURN(passed, ApplyTest(test, subject, call));
    } else {
      passed = subject.Truthy();
    }
    if (passed == select) out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> Map(const Value& input, CallArgs& args) {
  LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  ValueList out;
  if (args.positional.empty()) {
    Value attribute;
    Value default_value = Value::None();
    bool has_default = false;
    for (const auto& [key, value] : args.keyword) {
      if (key == "attribute") {
        attribute = value;
      } else if (key == "default") {
        default_value = value;
        has_default = true;
      } else {
        return Error(absl::StrCat("Unexpected keyword argument '", key, "'"));
      }
    }
    if (!IsGiven(attribute)) return Error("map: expected a filter name or attribute=");
    for (const Value& item : items) {
      LOOM_ASSIGN_OR_RETURN(Value mapped,
                            GetAttrPath(item, attribute, has_default ? &default_value : nullptr));
      out.push_back(std::move(mapped));
    }
    return Value::Generator(std::move(out));
  }
  std::string filter = args.positional[0].Str();
  if (!IsKnownFilter(filter)) return Error(absl::StrCat("No filter named '", filter, "'."));
  CallArgs filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.keyword = args.keyword;
  for (const Value& item : items) {
    CallArgs call = filter_args;
    LOOM_ASSIGN_OR_RETURN(Value mapped, ApplyFilter(filter, item, call));
    out.push_back(std::move(mapped));
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> Unique(const Value& input, const std::vector<Value>& a) {
  LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  bool case_sensitive = Flag(a[0], false);
  std::vector<Value> seen;
  ValueList out;
  for (const Value& item : items) {
    LOOM_ASSIGN_OR_RETURN(Value key, KeyOf(item, a[1], case_sensitive));
    if ((key.is_list() && !key.is_tuple()) || key.is_dict()) {
      return Error(absl::StrCat("unhashable type: '", key.is_dict() ? "dict" : "list", "'"));
    }
    bool duplicate = std::any_of(seen.begin(), seen.end(),
                                 [&](const Value& other) { return Equals(key, other); });
    if (duplicate) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> MinOrMax(const Value& input, const std::vector<Value>& a, bool max) {
  LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  bool case_sensitive = Flag(a[0], false);
  size_t best = 0;
  LOOM_ASSIGN_OR_RETURN(Value best_key, KeyOf(items[0], a[1], case_sensitive));
  for (size_t i = 1; i < items.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(Value key, KeyOf(items[i], a[1], case_sensitive));
    LOOM_ASSIGN_OR_RETURN(int order, Compare(key, best_key));
    if (max ? order > 0 : order < 0) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

absl::StatusOr<Value> Sort(const Value& input, const std::vector<Value>& a) {
  LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  bool case_sensitive = Flag(a[1], false);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    LOOM_ASSIGN_OR_RETURN(Value key, KeyOf(item, a[2], case_sensitive));
    keyed.emplace_back(std::move(key), item);
  }
  LOOM_RETURN_IF_ERROR(SortValues(keyed, Flag(a[0], false)));
  ValueList out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> DictSort(const Value& input, const std::vector<Value>& a) {
  if (!input.is_dict() || input.is_namespace()) {
    return Error("You can only sort by either 'key' or 'value'");
  }
  bool case_sensitive = Flag(a[0], false);
  std::string by = IsGiven(a[1]) ? a[1].Str() : "key";
  if (by != "key" && by != "value") return Error("You can only sort by either 'key' or 'value'");
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [key, value] : input.AsDict().entries()) {
    Value sort_key = by == "key" ? Value::String(key) : value;
    keyed.emplace_back(IgnoreCase(sort_key, case_sensitive),
                       Value::List({Value::String(key), value}, /*tuple=*/true));
  }
  LOOM_RETURN_IF_ERROR(SortValues(keyed, Flag(a[2], false)));
  ValueList out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Sum(const Value& input, const std::vector<Value>& a) {
  LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  Value total = IsGiven(a[1]) ? a[1] : Value::Int(0);
  for (const Value& item : items) {
    Value term = item;
    if (IsGiven(a[0]) && !a[0].is_none()) {
      LOOM_ASSIGN_OR_RETURN(term, GetAttrPath(item, a[0]));
    }
    if (total.is_string()) return Error("sum() can't sum strings");
    LOOM_ASSIGN_OR_RETURN(total, BinaryOp("+", total, term, kMaxValueBytes));
  }
  return total;
}

absl::StatusOr<Value> Last(const Value& input) {
  if (input.is_generator()) return Error("'generator' object is not reversible");
  if (input.is_string()) {
    std::u32string cps = DecodeUtf8(input.AsString());
    if (cps.empty()) return Value::Undefined("No last item, sequence was empty.");
    return Value::String(EncodeUtf8(cps.substr(cps.size() - 1)));
  }
  if (!input.is_undefined() && !input.is_list() && !input.is_dict()) {
    return Error(absl::StrCat("'", input.TypeName(), "' is not reversible"));
  }
  LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

}  // namespace

bool IsKnownFilter(absl::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool IsKnownTest(absl::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

namespace {

// join(d, attribute): the items' strings (or their attribute's) between separators.
absl::StatusOr<Value> Join(const Value& input, const std::vector<Value>& a) {
  LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  std::string separator = IsGiven(a[0]) ? a[0].Str() : "";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (IsGiven(a[1]) && !a[1].is_none()) {
      LOOM_ASSIGN_OR_RETURN(item, GetAttrPath(item, a[1]));
    }
    if (item.is_generator()) return Error("printing a generator is not supported");
    if (i > 0) out += separator;
    out += item.Str();
    if (out.size() > kMaxValueBytes) return Error("join: result too large");
  }
  return Value::String(std::move(out));
}

// int(default, base): Python's int() of the input, or the default.
absl::StatusOr<Value> IntFilter(const Value& input, const std::vector<Value>& a) {
  int base = 10;
  if (IsGiven(a[1])) {
    if (!a[1].is_int() || a[1].AsInt() < 2 || a[1].AsInt() > 36) {
      return Error("int: base must be an integer between 2 and 36");
    }
    base = static_cast<int>(a[1].AsInt());
  }
  return ToInt(input, IsGiven(a[0]) ? a[0] : Value::Int(0), base);
}

// float(default): Python's float() of the input, or the default.
absl::StatusOr<Value> FloatFilter(const Value& input, const std::vector<Value>& a) {
  Value fallback = IsGiven(a[0]) ? a[0] : Value::Float(0.0);
  if (input.is_number()) return Value::Float(input.AsDouble());
  if (input.is_string()) {
    if (auto parsed = ParsePyFloat(input.AsString())) return Value::Float(*parsed);
  }
  return fallback;
}

// title: each word capitalized, as jinja2's do_title.
Value Title(const Value& input) {
  // jinja2's do_title: capitalize each word after -, whitespace, (, {, [ or <.
  std::u32string cps = DecodeUtf8(input.Str());
  std::string out;
  size_t start = 0;
  auto is_separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPySpace(c);
  };
  while (start < cps.size()) {
    size_t end = start;
    bool separator = is_separator(cps[start]);
    while (end < cps.size() && is_separator(cps[end]) == separator) ++end;
    std::string word = EncodeUtf8(cps.substr(start, end - start));
    if (separator) {
      out += word;
    } else {
      out += PyUpper(EncodeUtf8(cps.substr(start, 1)));
      out += PyLower(EncodeUtf8(cps.substr(start + 1, end - start - 1)));
    }
    start = end;
  }
  return Value::String(std::move(out));
}

// The filters that take arguments (their names bound as jinja2 declares them); nullopt for
// any other name.
std::optional<absl::StatusOr<Value>> ApplyFilterWithArguments(absl::string_view name,
                                                              const Value& input, CallArgs& args) {
  std::vector<Value> a;
  const std::string filter(name);
  if (name == "default" || name == "d") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"default_value", "boolean"}, a));
    if (input.is_undefined() || (Flag(a[1], false) && !input.Truthy())) {
      return IsGiven(a[0]) ? a[0] : Value::String("");
    }
    return input;
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return SelectOrReject(input, args, name.size() > 6, name[0] == 's');
  }
  if (name == "map") return Map(input, args);
  if (name == "trim") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"chars"}, a));
    const std::string* chars = IsGiven(a[0]) && a[0].is_string() ? &a[0].AsString() : nullptr;
    return Value::String(PyStrip(input.Str(), chars, true, true), input.is_markup());
  }
  if (name == "join") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"d", "attribute"}, a));
    return Join(input, a);
  }
  if (name == "tojson") {
    LOOM_RETURN_IF_ERROR(
        BindArgs(filter, args, {"ensure_ascii", "indent", "separators", "sort_keys"}, a));
    return ToJsonFilter(input, a);
  }
  if (name == "replace") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"old", "new", "count"}, a));
    int64_t count = -1;
    if (IsGiven(a[2]) && !a[2].is_none()) {
      if (!a[2].is_int()) return Error("replace: count must be an integer");
      count = a[2].AsInt();
    }
    return Value::String(PyReplace(input.Str(), a[0].Str(), a[1].Str(), count));
  }
  if (name == "int") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"default", "base"}, a));
    return IntFilter(input, a);
  }
  if (name == "float") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"default"}, a));
    return FloatFilter(input, a);
  }
  if (name == "round") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"precision", "method"}, a));
    return Round(input, a[0], a[1]);
  }
  if (name == "indent") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"width", "first", "blank"}, a));
    return Indent(input, a[0], a[1], a[2]);
  }
  if (name == "unique") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"case_sensitive", "attribute"}, a));
    return Unique(input, a);
  }
  if (name == "min" || name == "max") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"case_sensitive", "attribute"}, a));
    return MinOrMax(input, a, name == "max");
  }
  if (name == "sort") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"reverse", "case_sensitive", "attribute"}, a));
    return Sort(input, a);
  }
  if (name == "dictsort") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"case_sensitive", "by", "reverse"}, a));
    return DictSort(input, a);
  }
  if (name == "sum") {
    LOOM_RETURN_IF_ERROR(BindArgs(filter, args, {"attribute", "start"}, a));
    return Sum(input, a);
  }
  return std::nullopt;
}

// The filters without arguments over sequences and mappings; nullopt for any other name.
std::optional<absl::StatusOr<Value>> ApplySequenceFilter(absl::string_view name,
                                                         const Value& input) {
  if (name == "length" || name == "count") {
    LOOM_ASSIGN_OR_RETURN(int64_t length, Length(input));
    return Value::Int(length);
  }
  if (name == "first") {
    LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
    return items.front();
  }
  if (name == "last") return Last(input);
  if (name == "list") {
    LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    return Value::List(std::move(items));
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::Generator({});
    if (!input.is_dict() || input.is_namespace()) {
      return Error("Can only get item pairs from a mapping.");
    }
    ValueList pairs;
    for (const auto& [key, value] : input.AsDict().entries()) {
      pairs.push_back(Value::List({Value::String(key), value}, /*tuple=*/true));
    }
    return Value::Generator(std::move(pairs));
  }
  if (name == "reverse") {
    if (input.is_string()) {
      std::u32string cps = DecodeUtf8(input.AsString());
      std::reverse(cps.begin(), cps.end());
      return Value::String(EncodeUtf8(cps));
    }
    LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    std::reverse(items.begin(), items.end());
    return Value::Generator(std::move(items));
  }
  return std::nullopt;
}

// The string filters (no arguments): the input's string form transformed.
absl::StatusOr<Value> ApplyStringFilter(absl::string_view name, const Value& input) {
  if (input.is_generator()) return Error("printing a generator is not supported");
  if (name == "string") return Value::String(input.Str(), input.is_markup());
  if (name == "upper") return Value::String(PyUpper(input.Str()), input.is_markup());
  if (name == "lower") return Value::String(PyLower(input.Str()), input.is_markup());
  if (name == "capitalize") return Value::String(PyCapitalize(input.Str()), input.is_markup());
  if (name == "title") return Title(input);
  if (name == "abs") {
    if (input.is_float()) return Value::Float(std::fabs(input.AsDouble()));
    if (input.is_int() || input.is_bool()) {
      int64_t v = input.is_bool() ? input.AsBool() : input.AsInt();
      if (v == INT64_MIN) return Error("integer overflow");
      return Value::Int(v < 0 ? -v : v);
    }
    return Error(absl::StrCat("bad operand type for abs(): '", input.TypeName(), "'"));
  }
  if (name == "safe") return Value::String(input.Str(), /*markup=*/true);
  if (name == "escape" || name == "e") {
    if (input.is_markup()) return input;
    return Value::String(HtmlEscape(input.Str()), /*markup=*/true);
  }
  return Error(absl::StrCat("No filter named '", name, "'."));
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, CallArgs& args) {
  if (std::optional<absl::StatusOr<Value>> out = ApplyFilterWithArguments(name, input, args)) {
    return *std::move(out);
  }
  // The remaining filters take no arguments.
  std::vector<Value> a;
  LOOM_RETURN_IF_ERROR(BindArgs(std::string(name), args, {}, a));
  if (std::optional<absl::StatusOr<Value>> out = ApplySequenceFilter(name, input)) {
    return *std::move(out);
  }
  return ApplyStringFilter(name, input);
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, CallArgs& args) {
  std::vector<Value> a;
  const std::string test(name);
  LOOM_RETURN_IF_ERROR(BindArgs(test, args, {"other"}, a));
  const Value& other = a[0];
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "boolean") return input.is_bool();
  if (name == "true") return input.is_bool() && input.AsBool();
  if (name == "false") return input.is_bool() && !input.AsBool();
  if (name == "integer") return input.is_int();
  if (name == "float") return input.is_float();
  if (name == "number") return input.is_number();
  if (name == "string") return input.is_string();
  if (name == "mapping") return input.is_dict() && !input.is_namespace();
  if (name == "iterable") {
    return input.is_undefined() || input.is_string() || input.is_list() ||
           (input.is_dict() && !input.is_namespace());
  }
  if (name == "sequence") {
    return input.is_undefined() || input.is_string() ||
           (input.is_list() && !input.is_generator()) || (input.is_dict() && !input.is_namespace());
  }
  if (name == "callable") return input.is_function();
  if (name == "escaped") return input.is_markup();
  if (name == "lower" || name == "upper") {
    std::string text = input.Str();
    std::string lower = PyLower(text);
    std::string upper = PyUpper(text);
    return name == "lower" ? (text == lower && text != upper) : (text == upper && text != lower);
  }
  if (name == "sameas") {
    if (input.is_none() || input.is_bool() || input.is_undefined()) {
      return input.kind() == other.kind() && Equals(input, other);
    }
    if (input.is_dict() && other.is_dict()) return &input.AsDict() == &other.AsDict();
    if (input.is_list() && other.is_list()) return &input.AsList() == &other.AsList();
    return false;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    Value divisor = name == "divisibleby" ? other : Value::Int(2);
    LOOM_ASSIGN_OR_RETURN(Value remainder, BinaryOp("%", input, divisor, kMaxValueBytes));
    bool zero = remainder.AsDouble() == 0;
    return name == "odd" ? !zero : zero;
  }
  if (name == "in") return Contains(other, input);
  std::string op = name == "eq" || name == "equalto"       ? "=="
                   : name == "ne"                          ? "!="
                   : name == "lt" || name == "lessthan"    ? "<"
                   : name == "le"                          ? "<="
                   : name == "gt" || name == "greaterthan" ? ">"
                   : name == "ge"                          ? ">="
                                                           : test;
  if (op == "==" || op == "!=" || op == "<" || op == "<=" || op == ">" || op == ">=") {
    return CompareOp(op, input, other);
  }
  return Error(absl::StrCat("No test named '", name, "'."));
}

}  // namespace loom::common::jinja
