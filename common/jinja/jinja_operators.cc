#include "common/jinja/jinja_operators.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/jinja/jinja_builtins.h"
#include "common/jinja/jinja_string.h"
#include "common/status_macros.h"

namespace loom::common::jinja {
namespace {

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t IntOf(const Value& v) { return v.is_bool() ? (v.AsBool() ? 1 : 0) : v.AsInt(); }

std::string PyType(const Value& v) {
  std::string name = v.TypeName();
  size_t space = name.find(' ');
  return space == std::string::npos ? (name == "None" ? "NoneType" : name) : name.substr(0, space);
}

absl::Status Unsupported(absl::string_view op, const Value& lhs, const Value& rhs) {
  return absl::InvalidArgumentError(absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                                 PyType(lhs), "' and '", PyType(rhs), "'"));
}

absl::Status Overflow() {
  return absl::InvalidArgumentError("integer overflow: Loom's templates use 64-bit integers");
}

absl::Status TooLarge(size_t max_bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat("template value exceeds the limit of ", max_bytes, " bytes"));
}

absl::StatusOr<Value> Repeat(const Value& sequence, int64_t count, size_t max_bytes) {
  if (count < 0) count = 0;
  if (sequence.is_string()) {
    const std::string& text = sequence.AsString();
    if (!text.empty() && static_cast<uint64_t>(count) > max_bytes / text.size()) {
      return TooLarge(max_bytes);
    }
    std::string out;
    out.reserve(text.size() * count);
    for (int64_t i = 0; i < count; ++i) out += text;
    return Value::String(std::move(out), sequence.is_markup());
  }
  const ValueList& items = sequence.AsList();
  if (!items.empty() && static_cast<uint64_t>(count) > max_bytes / items.size()) {
    return TooLarge(max_bytes);
  }
  ValueList out;
  for (int64_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::List(std::move(out), sequence.is_tuple());
}

absl::StatusOr<Value> Arithmetic(absl::string_view op, const Value& lhs, const Value& rhs) {
  if (IsIntLike(lhs) && IsIntLike(rhs)) {
    int64_t a = IntOf(lhs);
    int64_t b = IntOf(rhs);
    int64_t out = 0;
    if (op == "+") {
      if (__builtin_add_overflow(a, b, &out)) return Overflow();
      return Value::Int(out);
    }
    if (op == "-") {
      if (__builtin_sub_overflow(a, b, &out)) return Overflow();
      return Value::Int(out);
    }
    if (op == "*") {
      if (__builtin_mul_overflow(a, b, &out)) return Overflow();
      return Value::Int(out);
    }
    if (op == "/") {
      if (b == 0) return absl::InvalidArgumentError("division by zero");
      return Value::Float(static_cast<double>(a) / static_cast<double>(b));
    }
    if (op == "//" || op == "%") {
      if (b == 0) {
        return absl::InvalidArgumentError(op == "//" ? "integer division or modulo by zero"
                                                     : "integer modulo by zero");
      }
      if (a == std::numeric_limits<int64_t>::min() && b == -1) return Overflow();
      int64_t quotient = a / b;
      int64_t remainder = a % b;
      if (remainder != 0 && ((remainder < 0) != (b < 0))) {
        --quotient;
        remainder += b;
      }
      return Value::Int(op == "//" ? quotient : remainder);
    }
    if (op == "**") {
      if (b < 0) {
        if (a == 0) {
          return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
        }
        return Value::Float(std::pow(static_cast<double>(a), static_cast<double>(b)));
      }
      int64_t result = 1;
      int64_t base = a;
      while (b > 0) {
        if (b & 1) {
          if (__builtin_mul_overflow(result, base, &result)) return Overflow();
        }
        b >>= 1;
        if (b > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
      }
      return Value::Int(result);
    }
  }
  double a = lhs.AsDouble();
  double b = rhs.AsDouble();
  if (op == "+") return Value::Float(a + b);
  if (op == "-") return Value::Float(a - b);
  if (op == "*") return Value::Float(a * b);
  if (op == "/") {
    if (b == 0) return absl::InvalidArgumentError("float division by zero");
    return Value::Float(a / b);
  }
  if (op == "//" || op == "%") {
    if (b == 0) return absl::InvalidArgumentError("float floor division by zero");
    // CPython's float_divmod.
    double mod = std::fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0) {
      if ((b < 0) != (mod < 0)) {
        mod += b;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, b);
    }
    if (op == "%") return Value::Float(mod);
    double floordiv = 0;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, a / b);
    }
    return Value::Float(floordiv);
  }
  if (op == "**") {
    if (a == 0 && b < 0) {
      return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
    }
    if (a < 0 && b != std::floor(b)) {
      return absl::InvalidArgumentError("complex results are not supported");
    }
    return Value::Float(std::pow(a, b));
  }
  return absl::InternalError(absl::StrCat("unknown operator ", op));
}

}  // namespace

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& lhs, const Value& rhs,
                               size_t max_bytes) {
  if (op == "~") {
    if (lhs.is_generator() || rhs.is_generator()) {
      return absl::InvalidArgumentError("printing a generator is not supported");
    }
    std::string out = lhs.Str();
    std::string right = rhs.Str();
    if (out.size() + right.size() > max_bytes) return TooLarge(max_bytes);
    out += right;
    return Value::String(std::move(out));
  }
  if (lhs.is_undefined()) return absl::InvalidArgumentError(lhs.UndefinedMessage());
  if (rhs.is_undefined()) return absl::InvalidArgumentError(rhs.UndefinedMessage());
  if (lhs.is_number() && rhs.is_number()) return Arithmetic(op, lhs, rhs);
  if (op == "+") {
    if (lhs.is_string() && rhs.is_string()) {
      bool markup = lhs.is_markup() || rhs.is_markup();
      // Markup + str escapes the plain operand (markupsafe).
      std::string left = markup && !lhs.is_markup() ? HtmlEscape(lhs.AsString()) : lhs.AsString();
      std::string right = markup && !rhs.is_markup() ? HtmlEscape(rhs.AsString()) : rhs.AsString();
      if (left.size() + right.size() > max_bytes) return TooLarge(max_bytes);
      return Value::String(left + right, markup);
    }
    if (lhs.is_list() && rhs.is_list() && lhs.is_tuple() == rhs.is_tuple() && !lhs.is_generator() &&
        !rhs.is_generator()) {
      if (lhs.AsList().size() + rhs.AsList().size() > max_bytes) return TooLarge(max_bytes);
      ValueList items = lhs.AsList();
      items.insert(items.end(), rhs.AsList().begin(), rhs.AsList().end());
      return Value::List(std::move(items), lhs.is_tuple());
    }
    if (lhs.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("can only concatenate str (not \"", PyType(rhs), "\") to str"));
    }
    if (lhs.is_list() && !lhs.is_generator()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "can only concatenate ", PyType(lhs), " (not \"", PyType(rhs), "\") to ", PyType(lhs)));
    }
  }
  if (op == "*") {
    bool lhs_sequence = lhs.is_string() || (lhs.is_list() && !lhs.is_generator());
    bool rhs_sequence = rhs.is_string() || (rhs.is_list() && !rhs.is_generator());
    if (lhs_sequence && IsIntLike(rhs)) return Repeat(lhs, IntOf(rhs), max_bytes);
    if (rhs_sequence && IsIntLike(lhs)) return Repeat(rhs, IntOf(lhs), max_bytes);
  }
  if (op == "%" && lhs.is_string()) {
    return absl::InvalidArgumentError("unsupported: printf-style string formatting with '%'");
  }
  return Unsupported(op, lhs, rhs);
}

absl::StatusOr<Value> UnaryOp(bool negate, const Value& operand) {
  if (operand.is_undefined()) return absl::InvalidArgumentError(operand.UndefinedMessage());
  if (operand.is_float()) return Value::Float(negate ? -operand.AsDouble() : operand.AsDouble());
  if (IsIntLike(operand)) {
    int64_t value = IntOf(operand);
    if (!negate) return Value::Int(value);
    if (value == std::numeric_limits<int64_t>::min()) return Overflow();
    return Value::Int(-value);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad operand type for unary ", negate ? "-" : "+", ": '", PyType(operand), "'"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'in <string>' requires string as left operand, not ", PyType(item)));
      }
      return container.AsString().find(item.AsString()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& element : container.AsList()) {
        if (Equals(element, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (container.is_namespace()) break;
      if (item.is_list() && !item.is_tuple()) {
        return absl::InvalidArgumentError("unhashable type: 'list'");
      }
      if (item.is_dict()) return absl::InvalidArgumentError("unhashable type: 'dict'");
      return item.is_string() && container.AsDict().Find(item.AsString()) != nullptr;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("argument of type '", PyType(container), "' is not iterable"));
}

absl::StatusOr<bool> CompareOp(absl::string_view op, const Value& lhs, const Value& rhs) {
  if (op == "==") return Equals(lhs, rhs);
  if (op == "!=") return !Equals(lhs, rhs);
  if (op == "in") return Contains(rhs, lhs);
  if (op == "notin") {
    LOOM_ASSIGN_OR_RETURN(bool found, Contains(rhs, lhs));
    return !found;
  }
  if (lhs.is_undefined()) return absl::InvalidArgumentError(lhs.UndefinedMessage());
  if (rhs.is_undefined()) return absl::InvalidArgumentError(rhs.UndefinedMessage());
  auto order = Compare(lhs, rhs);
  if (!order.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", op,
                                                   "' not supported between instances of '",
                                                   PyType(lhs), "' and '", PyType(rhs), "'"));
  }
  if (op == "<") return *order < 0;
  if (op == "<=") return *order <= 0;
  if (op == ">") return *order > 0;
  if (op == ">=") return *order >= 0;
  return absl::InternalError(absl::StrCat("unknown comparison ", op));
}

}  // namespace loom::common::jinja
