#include "common/jinja/jinja_value.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/jinja/jinja_string.h"
#include "common/status_macros.h"

namespace loom::common::jinja {

const Value* ValueDict::Find(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void ValueDict::Set(std::string key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string message) {
  return Value(UndefinedData{std::move(message)}, false);
}
Value Value::None() { return Value(nullptr, false); }
Value Value::Bool(bool value) { return Value(value, false); }
Value Value::Int(int64_t value) { return Value(value, false); }
Value Value::Float(double value) { return Value(value, false); }
Value Value::String(std::string value, bool markup) { return Value(std::move(value), markup); }
Value Value::List(ValueList items, bool tuple) {
  return Value(std::make_shared<const ValueList>(std::move(items)), tuple ? kTupleFlag : 0);
}
Value Value::Generator(ValueList items) {
  return Value(std::make_shared<const ValueList>(std::move(items)), kGeneratorFlag);
}
Value Value::Dict(ValueDict dict) {
  return Value(std::make_shared<ValueDict>(std::move(dict)), false);
}
Value Value::Namespace(ValueDict dict) {
  return Value(std::make_shared<ValueDict>(std::move(dict)), true);
}
Value Value::Func(std::string name, NativeFunction call) {
  return Value(std::make_shared<const Function>(Function{std::move(name), std::move(call)}), false);
}

namespace {

template <typename Json>
Value ValueFromJson(const Json& json) {
  switch (json.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(json.template get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(json.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      auto value = json.template get<uint64_t>();
      if (value > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(value));
      return Value::Int(static_cast<int64_t>(value));
    }
    case Json::value_t::number_float:
      return Value::Float(json.template get<double>());
    case Json::value_t::string:
      return Value::String(json.template get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(ValueFromJson(item));
      return Value::List(std::move(items));
    }
    case Json::value_t::object: {
      ValueDict dict;
      for (const auto& [key, item] : json.items()) dict.Set(key, ValueFromJson(item));
      return Value::Dict(std::move(dict));
    }
    default:
      return Value::None();
  }
}

}  // namespace

Value Value::FromJson(const nlohmann::json& json) { return ValueFromJson(json); }
Value Value::FromJson(const nlohmann::ordered_json& json) { return ValueFromJson(json); }

double Value::AsDouble() const {
  if (is_float()) return std::get<double>(data_);
  if (is_bool()) return AsBool() ? 1.0 : 0.0;
  return static_cast<double>(AsInt());
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return AsBool();
    case Kind::kInt:
      return AsInt() != 0;
    case Kind::kFloat:
      return AsDouble() != 0.0;
    case Kind::kString:
      return !AsString().empty();
    case Kind::kList:
      return is_generator() || !AsList().empty();
    case Kind::kDict:
      return is_namespace() || AsDict().size() > 0;
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::Str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return AsString();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return AsBool() ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(AsInt());
    case Kind::kFloat:
      return PyFloatRepr(AsDouble());
    case Kind::kString:
      return is_markup() ? absl::StrCat("Markup(", PyRepr(AsString()), ")") : PyRepr(AsString());
    case Kind::kList: {
      const ValueList& items = AsList();
      std::string out = is_tuple() ? "(" : "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        out += items[i].Repr();
      }
      if (is_tuple() && items.size() == 1) out += ",";
      out += is_tuple() ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, item] : AsDict().entries()) {
        if (!first) out += ", ";
        first = false;
        absl::StrAppend(&out, PyRepr(key), ": ", item.Repr());
      }
      out += is_namespace() ? "}>" : "}";
      return out;
    }
    case Kind::kFunction:
      return absl::StrCat("<function ", AsFunction().name, ">");
  }
  return "";
}

std::string Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool object";
    case Kind::kInt:
      return "int object";
    case Kind::kFloat:
      return "float object";
    case Kind::kString:
      return "str object";
    case Kind::kList:
      return is_tuple() ? "tuple object" : is_generator() ? "generator object" : "list object";
    case Kind::kDict:
      return is_namespace() ? "Namespace object" : "dict object";
    case Kind::kFunction:
      return "function object";
  }
  return "object";
}

namespace {

// Python's type(x).__name__, for TypeError messages.
std::string PyTypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.is_tuple() ? "tuple" : v.is_generator() ? "generator" : "list";
    case Value::Kind::kDict:
      return v.is_namespace() ? "Namespace" : "dict";
    case Value::Kind::kFunction:
      return "function";
  }
  return "object";
}

void AppendJson(const Value& value, const JsonOptions& options, int level, std::string& out,
                absl::Status& status) {
  if (!status.ok()) return;
  if (level > 512) {
    status = absl::InvalidArgumentError("tojson: value nested too deeply");
    return;
  }
  const std::string item_sep = !options.item_separator.empty() ? options.item_separator
                               : options.indent >= 0           ? ","
                                                               : ", ";
  const std::string key_sep = !options.key_separator.empty() ? options.key_separator : ": ";
  auto newline = [&](int depth) {
    if (options.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(options.indent) * depth, ' ');
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += value.AsBool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      absl::StrAppend(&out, value.AsInt());
      return;
    case Value::Kind::kFloat: {
      double d = value.AsDouble();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += PyFloatRepr(d);
      }
      return;
    }
    case Value::Kind::kString:
      AppendJsonString(value.AsString(), options.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      if (value.is_generator()) break;
      const ValueList& items = value.AsList();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(level + 1);
        AppendJson(items[i], options, level + 1, out, status);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (value.is_namespace()) break;
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : value.AsDict().entries()) entries.push_back(&entry);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(level + 1);
        AppendJsonString(entries[i]->first, options.ensure_ascii, out);
        out += key_sep;
        AppendJson(entries[i]->second, options, level + 1, out, status);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      break;
  }
  status = absl::InvalidArgumentError(
      absl::StrCat("Object of type ", PyTypeName(value), " is not JSON serializable"));
}

}  // namespace

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.AsDouble() == b.AsDouble();
    int64_t x = a.is_bool() ? a.AsBool() : a.AsInt();
    int64_t y = b.is_bool() ? b.AsBool() : b.AsInt();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.AsString() == b.AsString();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      if (a.is_generator() || b.is_generator()) return &a.AsList() == &b.AsList();
      const ValueList& x = a.AsList();
      const ValueList& y = b.AsList();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.is_namespace() || b.is_namespace()) return &a.AsDict() == &b.AsDict();
      const ValueDict& x = a.AsDict();
      const ValueDict& y = b.AsDict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, item] : x.entries()) {
        const Value* other = y.Find(key);
        if (other == nullptr || !Equals(item, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kFunction:
      return &a.AsFunction() == &b.AsFunction();
    default:
      return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.AsDouble();
      double y = b.AsDouble();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.is_bool() ? a.AsBool() : a.AsInt();
    int64_t y = b.is_bool() ? b.AsBool() : b.AsInt();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.AsString().compare(b.AsString());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() &&
      !b.is_generator()) {
    const ValueList& x = a.AsList();
    const ValueList& y = b.AsList();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 PyTypeName(a), "' and '", PyTypeName(b), "'"));
}

absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options) {
  std::string out;
  absl::Status status;
  AppendJson(value, options, 0, out, status);
  LOOM_RETURN_IF_ERROR(status);
  return out;
}

}  // namespace loom::common::jinja
