#include "common/jinja/jinja_builtins.h"

#include <ctime>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/jinja/jinja_string.h"
#include "common/status_macros.h"

namespace loom::common::jinja {
namespace {

// jinja2's sandbox refuses larger ranges (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

absl::Status TypeError(absl::string_view message) { return absl::InvalidArgumentError(message); }

absl::StatusOr<const std::string*> OptionalString(absl::string_view function, const Value& arg) {
  if (!IsGiven(arg) || arg.is_none()) return nullptr;
  if (!arg.is_string()) {
    return TypeError(
        absl::StrCat(function, "() argument must be str or None, not ", arg.TypeName()));
  }
  return &arg.AsString();
}

absl::StatusOr<int64_t> OptionalInt(absl::string_view function, const Value& arg,
                                    int64_t fallback) {
  if (!IsGiven(arg)) return fallback;
  if (arg.is_int()) return arg.AsInt();
  if (arg.is_bool()) return arg.AsBool() ? 1 : 0;
  return TypeError(absl::StrCat(function, "(): '", arg.TypeName(),
                                "' object cannot be interpreted as an integer"));
}

absl::StatusOr<std::string> RequireString(absl::string_view function, const Value& arg) {
  if (!arg.is_string()) {
    return TypeError(absl::StrCat(function, "() argument must be str, not ", arg.TypeName()));
  }
  return arg.AsString();
}

Value StringList(std::vector<std::string> parts) {
  ValueList items;
  items.reserve(parts.size());
  for (auto& part : parts) items.push_back(Value::String(std::move(part)));
  return Value::List(std::move(items));
}

// str.startswith / str.endswith with a str or a tuple of str.
absl::StatusOr<Value> AffixTest(absl::string_view function, const std::string& text,
                                const Value& affix, bool prefix) {
  auto matches = [&](const std::string& candidate) {
    if (candidate.size() > text.size()) return false;
    return prefix ? text.compare(0, candidate.size(), candidate) == 0
                  : text.compare(text.size() - candidate.size(), candidate.size(), candidate) == 0;
  };
  if (affix.is_string()) return Value::Bool(matches(affix.AsString()));
  if (affix.is_tuple()) {
    for (const Value& item : affix.AsList()) {
      LOOM_ASSIGN_OR_RETURN(std::string candidate, RequireString(function, item));
      if (matches(candidate)) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  return TypeError(
      absl::StrCat(function, " first arg must be str or a tuple of str, not ", affix.TypeName()));
}

absl::StatusOr<Value> CallStringMethod(const Value& self, const std::string& method,
                                       CallArgs& args) {
  const std::string& text = self.AsString();
  std::vector<Value> a;
  auto keep_markup = [&](std::string result) {
    return Value::String(std::move(result), self.is_markup());
  };
  if (method == "strip" || method == "lstrip" || method == "rstrip") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {"chars"}, a));
    LOOM_ASSIGN_OR_RETURN(const std::string* chars, OptionalString(method, a[0]));
    return keep_markup(PyStrip(text, chars, method != "rstrip", method != "lstrip"));
  }
  if (method == "split" || method == "rsplit") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {"sep", "maxsplit"}, a));
    LOOM_ASSIGN_OR_RETURN(const std::string* sep, OptionalString(method, a[0]));
    LOOM_ASSIGN_OR_RETURN(int64_t maxsplit, OptionalInt(method, a[1], -1));
    if (sep != nullptr && sep->empty()) return absl::InvalidArgumentError("empty separator");
    return StringList(method == "split" ? PySplit(text, sep, maxsplit)
                                        : PyRSplit(text, sep, maxsplit));
  }
  if (method == "splitlines") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {}, a));
    return StringList(PySplitLines(text));
  }
  if (method == "startswith" || method == "endswith") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {"affix"}, a));
    if (!IsGiven(a[0])) return TypeError(absl::StrCat(method, "() takes at least 1 argument"));
    return AffixTest(method, text, a[0], method == "startswith");
  }
  if (method == "upper" || method == "lower" || method == "title" || method == "capitalize") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {}, a));
    if (method == "upper") return keep_markup(PyUpper(text));
    if (method == "lower") return keep_markup(PyLower(text));
    if (method == "title") return keep_markup(PyTitle(text));
    return keep_markup(PyCapitalize(text));
  }
  if (method == "replace") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {"old", "new", "count"}, a));
    LOOM_ASSIGN_OR_RETURN(std::string old_text, RequireString(method, a[0]));
    LOOM_ASSIGN_OR_RETURN(std::string new_text, RequireString(method, a[1]));
    LOOM_ASSIGN_OR_RETURN(int64_t count, OptionalInt(method, a[2], -1));
    if (self.is_markup()) new_text = HtmlEscape(new_text);
    return keep_markup(PyReplace(text, old_text, new_text, count));
  }
  if (method == "join") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {"iterable"}, a));
    LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(a[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ",
                                      items[i].TypeName(), " found"));
      }
      if (i > 0) out += text;
      out += items[i].AsString();
    }
    return Value::String(std::move(out));
  }
  if (method == "find" || method == "count") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {"sub"}, a));
    LOOM_ASSIGN_OR_RETURN(std::string sub, RequireString(method, a[0]));
    if (method == "find") {
      size_t found = text.find(sub);
      if (found == std::string::npos) return Value::Int(-1);
      return Value::Int(CodePointLength(absl::string_view(text).substr(0, found)));
    }
    if (sub.empty()) return Value::Int(CodePointLength(text) + 1);
    int64_t count = 0;
    for (size_t at = text.find(sub); at != std::string::npos;
         at = text.find(sub, at + sub.size())) {
      ++count;
    }
    return Value::Int(count);
  }
  if (method == "isdigit" || method == "isspace" || method == "isalpha" || method == "isalnum") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {}, a));
    std::u32string cps = DecodeUtf8(text);
    if (cps.empty()) return Value::Bool(false);
    for (char32_t c : cps) {
      bool digit = c >= '0' && c <= '9';
      bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      bool ok = method == "isdigit"   ? digit
                : method == "isspace" ? IsPySpace(c)
                : method == "isalpha" ? alpha
                                      : alpha || digit;
      if (c >= 0x80 && method != "isspace") {
        return absl::InvalidArgumentError(
            absl::StrCat("str.", method, "() on non-ASCII text is not supported"));
      }
      if (!ok) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  return absl::InternalError(absl::StrCat("unhandled str method ", method));
}

bool IsStringMethod(absl::string_view name) {
  static constexpr absl::string_view kMethods[] = {
      "strip",    "lstrip", "rstrip",  "split",   "rsplit",     "splitlines", "startswith",
      "endswith", "upper",  "lower",   "title",   "capitalize", "replace",    "join",
      "find",     "count",  "isdigit", "isspace", "isalpha",    "isalnum"};
  for (absl::string_view method : kMethods) {
    if (method == name) return true;
  }
  return false;
}

absl::StatusOr<Value> CallDictMethod(const Value& self, const std::string& method, CallArgs& args) {
  std::vector<Value> a;
  const ValueDict& dict = self.AsDict();
  if (method == "get") {
    LOOM_RETURN_IF_ERROR(BindArgs(method, args, {"key", "default"}, a));
    if (!IsGiven(a[0])) return TypeError("get expected at least 1 argument, got 0");
    const Value* found = a[0].is_string() ? dict.Find(a[0].AsString()) : nullptr;
    if (found != nullptr) return *found;
    return IsGiven(a[1]) ? a[1] : Value::None();
  }
  LOOM_RETURN_IF_ERROR(BindArgs(method, args, {}, a));
  ValueList items;
  for (const auto& [key, value] : dict.entries()) {
    if (method == "keys") {
      items.push_back(Value::String(key));
    } else if (method == "values") {
      items.push_back(value);
    } else {
      items.push_back(Value::List({Value::String(key), value}, /*tuple=*/true));
    }
  }
  return Value::List(std::move(items));
}

Value BindMethod(const Value& self, const std::string& name, bool is_string) {
  return Value::Func(name, [self, name, is_string](CallArgs& args) {
    return is_string ? CallStringMethod(self, name, args) : CallDictMethod(self, name, args);
  });
}

absl::Status UndefinedError(const Value& undefined) {
  return absl::InvalidArgumentError(undefined.UndefinedMessage());
}

// Python's index normalization for item access: nullopt when out of range.
bool NormalizeIndex(int64_t index, int64_t size, int64_t* out) {
  if (index < 0) index += size;
  if (index < 0 || index >= size) return false;
  *out = index;
  return true;
}

absl::StatusOr<ValueList> MakeRange(CallArgs& args) {
  if (!args.keyword.empty()) return TypeError("range() takes no keyword arguments");
  std::vector<int64_t> bounds;
  for (const Value& arg : args.positional) {
    if (!arg.is_int() && !arg.is_bool()) {
      return TypeError(
          absl::StrCat("'", arg.TypeName(), "' object cannot be interpreted as an integer"));
    }
    bounds.push_back(arg.is_bool() ? arg.AsBool() : arg.AsInt());
  }
  if (bounds.empty() || bounds.size() > 3) {
    return TypeError(absl::StrCat("range expected 1 to 3 arguments, got ", bounds.size()));
  }
  int64_t start = bounds.size() == 1 ? 0 : bounds[0];
  int64_t stop = bounds.size() == 1 ? bounds[0] : bounds[1];
  int64_t step = bounds.size() == 3 ? bounds[2] : 1;
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  ValueList items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(items.size()) >= kMaxRange) {
      return absl::InvalidArgumentError(
          "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    items.push_back(Value::Int(i));
  }
  return items;
}

absl::StatusOr<ValueDict> KeywordDict(absl::string_view function, CallArgs& args) {
  ValueDict dict;
  if (args.positional.size() > 1) {
    return TypeError(absl::StrCat(function, " expected at most 1 argument"));
  }
  if (args.positional.size() == 1) {
    if (!args.positional[0].is_dict()) {
      return absl::InvalidArgumentError(absl::StrCat(function, "() argument must be a dict"));
    }
    for (const auto& [key, value] : args.positional[0].AsDict().entries()) dict.Set(key, value);
  }
  for (auto& [key, value] : args.keyword) dict.Set(key, value);
  return dict;
}

}  // namespace

absl::Status BindArgs(absl::string_view function, const CallArgs& args,
                      std::initializer_list<absl::string_view> names, std::vector<Value>& out) {
  out.assign(names.size(), Value::Undefined(""));
  if (args.positional.size() > names.size()) {
    return TypeError(absl::StrCat(function, "() takes at most ", names.size(), " argument(s) (",
                                  args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t index = 0;
    for (absl::string_view name : names) {
      if (name == key) break;
      ++index;
    }
    if (index == names.size()) {
      return TypeError(absl::StrCat(function, "() got an unexpected keyword argument '", key, "'"));
    }
    if (index < args.positional.size()) {
      return TypeError(absl::StrCat(function, "() got multiple values for argument '", key, "'"));
    }
    out[index] = value;
  }
  return absl::OkStatus();
}

bool IsGiven(const Value& arg) { return !arg.is_undefined() || !arg.UndefinedMessage().empty(); }

absl::StatusOr<Value> GetAttribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(object);
    case Value::Kind::kString:
      if (IsStringMethod(name)) return BindMethod(object, name, /*is_string=*/true);
      break;
    case Value::Kind::kDict:
      if (!object.is_namespace() &&
          (name == "items" || name == "keys" || name == "values" || name == "get")) {
        return BindMethod(object, name, /*is_string=*/false);
      }
      if (const Value* found = object.AsDict().Find(name)) return *found;
      break;
    default:
      break;
  }
  return Value::Undefined(absl::StrCat("'", object.TypeName(), "' has no attribute '", name, "'"));
}

absl::StatusOr<Value> GetItem(const Value& object, const Value& key) {
  if (object.is_undefined()) return UndefinedError(object);
  int64_t index = 0;
  if ((object.is_list() && !object.is_generator()) || object.is_string()) {
    if (key.is_int() || key.is_bool()) {
      int64_t raw = key.is_bool() ? key.AsBool() : key.AsInt();
      if (object.is_list()) {
        const ValueList& items = object.AsList();
        if (NormalizeIndex(raw, static_cast<int64_t>(items.size()), &index)) return items[index];
      } else {
        std::u32string cps = DecodeUtf8(object.AsString());
        if (NormalizeIndex(raw, static_cast<int64_t>(cps.size()), &index)) {
          return Value::String(EncodeUtf8(cps.substr(index, 1)));
        }
      }
      return Value::Undefined(absl::StrCat(object.TypeName(), " has no element ", raw));
    }
  } else if (object.is_dict() && !object.is_namespace() && key.is_string()) {
    if (const Value* found = object.AsDict().Find(key.AsString())) return *found;
  }
  if (key.is_string()) return GetAttribute(object, key.AsString());
  return Value::Undefined(absl::StrCat(object.TypeName(), " has no element ", key.Repr()));
}

absl::StatusOr<Value> GetSlice(const Value& object, const Value& start, const Value& stop,
                               const Value& step) {
  if (object.is_undefined()) return UndefinedError(object);
  auto bound = [](const Value& v, int64_t* out) -> absl::StatusOr<bool> {
    if (v.is_undefined() || v.is_none()) return false;
    if (v.is_int() || v.is_bool()) {
      *out = v.is_bool() ? v.AsBool() : v.AsInt();
      return true;
    }
    return absl::InvalidArgumentError(
        "slice indices must be integers or None or have an __index__ method");
  };
  int64_t step_value = 1;
  LOOM_ASSIGN_OR_RETURN(bool has_step, bound(step, &step_value));
  if (has_step && step_value == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  const bool is_string = object.is_string();
  if (!is_string && !(object.is_list() && !object.is_generator())) {
    return Value::Undefined(absl::StrCat(object.TypeName(), " cannot be sliced"));
  }
  std::u32string cps;
  if (is_string) cps = DecodeUtf8(object.AsString());
  const int64_t size =
      is_string ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(object.AsList().size());
  // Python's slice.indices().
  int64_t lo = 0;
  int64_t hi = 0;
  LOOM_ASSIGN_OR_RETURN(bool has_start, bound(start, &lo));
  LOOM_ASSIGN_OR_RETURN(bool has_stop, bound(stop, &hi));
  auto clamp = [&](bool given, int64_t value, int64_t fallback) {
    if (!given) return fallback;
    if (value < 0) value += size;
    if (step_value > 0) return std::min(std::max<int64_t>(value, 0), size);
    return std::min(std::max<int64_t>(value, -1), size - 1);
  };
  lo = clamp(has_start, lo, step_value > 0 ? 0 : size - 1);
  hi = clamp(has_stop, hi, step_value > 0 ? size : -1);
  std::vector<int64_t> picked;
  for (int64_t i = lo; step_value > 0 ? i < hi : i > hi; i += step_value) picked.push_back(i);
  if (is_string) {
    std::u32string out;
    for (int64_t i : picked) out += cps[i];
    return Value::String(EncodeUtf8(out));
  }
  ValueList items;
  for (int64_t i : picked) items.push_back(object.AsList()[i]);
  return Value::List(std::move(items), object.is_tuple());
}

absl::StatusOr<ValueList> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
      return value.AsList();
    case Value::Kind::kDict: {
      if (value.is_namespace()) break;
      ValueList keys;
      for (const auto& entry : value.AsDict().entries()) keys.push_back(Value::String(entry.first));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (char32_t c : DecodeUtf8(value.AsString())) {
        std::string one;
        AppendUtf8(c, one);
        chars.push_back(Value::String(std::move(one)));
      }
      return chars;
    }
    default:
      break;
  }
  return TypeError(absl::StrCat("'", value.TypeName(), "' is not iterable"));
}

absl::StatusOr<int64_t> Length(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return CodePointLength(value.AsString());
    case Value::Kind::kList:
      if (value.is_generator()) break;
      return static_cast<int64_t>(value.AsList().size());
    case Value::Kind::kDict:
      if (value.is_namespace()) break;
      return static_cast<int64_t>(value.AsDict().size());
    default:
      break;
  }
  return TypeError(absl::StrCat("object of type '", value.TypeName(), "' has no len()"));
}

ValueDict MakeGlobals() {
  ValueDict globals;
  globals.Set("range", Value::Func("range", [](CallArgs& args) -> absl::StatusOr<Value> {
                LOOM_ASSIGN_OR_RETURN(ValueList items, MakeRange(args));
                return Value::List(std::move(items));
              }));
  globals.Set("dict", Value::Func("dict", [](CallArgs& args) -> absl::StatusOr<Value> {
                LOOM_ASSIGN_OR_RETURN(ValueDict dict, KeywordDict("dict", args));
                return Value::Dict(std::move(dict));
              }));
  globals.Set("namespace", Value::Func("namespace", [](CallArgs& args) -> absl::StatusOr<Value> {
                LOOM_ASSIGN_OR_RETURN(ValueDict dict, KeywordDict("namespace", args));
                return Value::Namespace(std::move(dict));
              }));
  globals.Set("raise_exception",
              Value::Func("raise_exception", [](CallArgs& args) -> absl::StatusOr<Value> {
                std::vector<Value> a;
                LOOM_RETURN_IF_ERROR(BindArgs("raise_exception", args, {"message"}, a));
                absl::Status status = absl::InvalidArgumentError(a[0].Str());
                status.SetPayload(kRaisedPayloadUrl, absl::Cord("1"));
                return status;
              }));
  globals.Set("strftime_now",
              Value::Func("strftime_now", [](CallArgs& args) -> absl::StatusOr<Value> {
                std::vector<Value> a;
                LOOM_RETURN_IF_ERROR(BindArgs("strftime_now", args, {"format"}, a));
                LOOM_ASSIGN_OR_RETURN(std::string format, RequireString("strftime_now", a[0]));
                std::time_t now = std::time(nullptr);
                std::tm local{};
                localtime_r(&now, &local);
                std::string out(256 + format.size() * 8, '\0');
                size_t written = std::strftime(out.data(), out.size(), format.c_str(), &local);
                if (written == 0 && !format.empty()) {
                  return absl::InvalidArgumentError("strftime_now: format produced no output");
                }
                out.resize(written);
                return Value::String(std::move(out));
              }));
  return globals;
}

}  // namespace loom::common::jinja
