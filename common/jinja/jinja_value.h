#pragma once

// Runtime values of the Jinja interpreter, with Python's semantics for printing
// (str/repr), truthiness, equality and ordering, as jinja2 inherits them.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace loom::common::jinja {

class Value;
using ValueList = std::vector<Value>;

/// Insertion-ordered dict with string keys (Python dict as JSON fills it).
class ValueDict {
 public:
  /// The value under `key`, or null.
  const Value* Find(absl::string_view key) const;
  /// Inserts or replaces; a replaced key keeps its position (as in Python).
  void Set(std::string key, Value value);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;  // key -> position in entries_
};

/// Arguments of a call: positional, then keyword in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using NativeFunction = std::function<absl::StatusOr<Value>(CallArgs& args)>;

/// A callable value: a global (range, namespace, raise_exception), a bound method or
/// a macro.
struct Function {
  std::string name;
  NativeFunction call;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  /// An Undefined whose use as an object fails with "'x' is undefined"-like `message`.
  static Value Undefined(std::string message);
  static Value None();
  static Value Bool(bool value);
  static Value Int(int64_t value);
  static Value Float(double value);
  /// `markup`: a markupsafe.Markup string (from `safe`/`escape`): `+` escapes the
  /// other operand.
  static Value String(std::string value, bool markup = false);
  static Value List(ValueList items, bool tuple = false);
  /// The lazy iterator that jinja2's select/map/reverse/items filters return: always
  /// true, no len(), no subscripts, printing unsupported; iterating yields `items`.
  static Value Generator(ValueList items);
  static Value Dict(ValueDict dict);
  /// jinja2's namespace(): the one mutable object (`{% set ns.x = ... %}`).
  static Value Namespace(ValueDict dict);
  static Value Func(std::string name, NativeFunction call);
  /// Converts JSON. nlohmann::json has already sorted object keys; ordered_json keeps
  /// the document's order (as Python's json.loads does).
  static Value FromJson(const nlohmann::json& json);
  static Value FromJson(const nlohmann::ordered_json& json);

  Value() : Value(Undefined("")) {}

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  /// int, float or bool (Python's numbers.Number).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_function() const { return kind() == Kind::kFunction; }
  bool is_tuple() const { return is_list() && flag_ == kTupleFlag; }
  bool is_generator() const { return is_list() && flag_ == kGeneratorFlag; }
  bool is_markup() const { return is_string() && flag_ != 0; }
  bool is_namespace() const { return is_dict() && flag_ != 0; }

  bool AsBool() const { return std::get<bool>(data_); }
  int64_t AsInt() const { return std::get<int64_t>(data_); }
  /// int, bool or float as a double.
  double AsDouble() const;
  const std::string& AsString() const { return std::get<std::string>(data_); }
  const ValueList& AsList() const { return *std::get<std::shared_ptr<const ValueList>>(data_); }
  const ValueDict& AsDict() const { return *std::get<std::shared_ptr<ValueDict>>(data_); }
  /// The namespace's attributes, for assignment. Only for is_namespace().
  ValueDict& MutableNamespace() const { return *std::get<std::shared_ptr<ValueDict>>(data_); }
  const Function& AsFunction() const { return *std::get<std::shared_ptr<const Function>>(data_); }
  /// The UndefinedError message for using this Undefined as an object.
  const std::string& UndefinedMessage() const { return std::get<UndefinedData>(data_).message; }

  /// Python's bool(value).
  bool Truthy() const;
  /// Python's str(value), as `{{ value }}` prints it (Undefined prints empty).
  std::string Str() const;
  /// Python's repr(value), as str() of a list prints its items.
  std::string Repr() const;
  /// jinja2's object_type_repr: "dict object", "str object", "None".
  std::string TypeName() const;

 private:
  struct UndefinedData {
    std::string message;
  };
  using Data = std::variant<UndefinedData, std::nullptr_t, bool, int64_t, double, std::string,
                            std::shared_ptr<const ValueList>, std::shared_ptr<ValueDict>,
                            std::shared_ptr<const Function>>;

  static constexpr uint8_t kTupleFlag = 1;
  static constexpr uint8_t kGeneratorFlag = 2;

  Value(Data data, uint8_t flag) : data_(std::move(data)), flag_(flag) {}

  Data data_;
  uint8_t flag_ = 0;  // lists: tuple or generator; strings: Markup; dicts: namespace
};

/// Python's `a == b` (1 == 1.0 == True; a list never equals a tuple).
bool Equals(const Value& a, const Value& b);

/// Python's ordering: negative, zero or positive; InvalidArgument when Python would
/// raise TypeError ("'<' not supported between instances of ...").
absl::StatusOr<int> Compare(const Value& a, const Value& b);

/// Options of Hugging Face's `tojson` (json.dumps with ensure_ascii=False).
struct JsonOptions {
  int indent = -1;  // < 0: None (one line)
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator;   // empty: ": "
};

/// json.dumps(value, ...). InvalidArgument for values JSON cannot hold (Undefined,
/// functions, namespaces).
absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options);

}  // namespace loom::common::jinja
