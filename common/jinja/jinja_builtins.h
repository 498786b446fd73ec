#pragma once

// What jinja2 gets from Python itself: attribute and item access (Environment.getattr /
// getitem), slicing, iteration, the methods of str and dict, and the global functions
// (range, dict, namespace, plus Hugging Face's raise_exception and strftime_now).

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/jinja_value.h"

namespace loom::common::jinja {

/// Binds `args` to parameters `names` like a Python signature: `out[i]` is the i-th
/// parameter, Undefined("") when not given. InvalidArgument for extra or unknown
/// arguments, naming `function`.
absl::Status BindArgs(absl::string_view function, const CallArgs& args,
                      std::initializer_list<absl::string_view> names, std::vector<Value>& out);

/// True when a bound argument was passed (BindArgs leaves missing ones Undefined("")).
bool IsGiven(const Value& arg);

/// `object.name`: a method of str/dict, else the item `name`, else an Undefined that
/// says which attribute was missing. UndefinedError when `object` is Undefined.
absl::StatusOr<Value> GetAttribute(const Value& object, const std::string& name);

/// `object[key]`: the item, else an attribute for string keys, else an Undefined.
/// UndefinedError when `object` is Undefined.
absl::StatusOr<Value> GetItem(const Value& object, const Value& key);

/// `object[start:stop:step]` on str, list and tuple (bounds may be Undefined = absent).
absl::StatusOr<Value> GetSlice(const Value& object, const Value& start, const Value& stop,
                               const Value& step);

/// The items `for x in value` visits: list items, dict keys, str code points; nothing
/// for Undefined. InvalidArgument for values that are not iterable.
absl::StatusOr<ValueList> Iterate(const Value& value);

/// Python's len(). InvalidArgument for values without a length.
absl::StatusOr<int64_t> Length(const Value& value);

/// The global functions every render sees: range, dict, namespace, raise_exception,
/// strftime_now.
ValueDict MakeGlobals();

/// Status payload type URL marking the error of raise_exception(): its message is the
/// template's own text and gets no source position.
inline constexpr absl::string_view kRaisedPayloadUrl = "type.loom/jinja.RaiseException";

}  // namespace loom::common::jinja
