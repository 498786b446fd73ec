// The Jinja parser's expressions: conditional expressions, boolean and comparison
// operators, arithmetic, literals, subscripts, calls, filters and tests
// (jinja_parser_internal.h).
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jinja/jinja_filters.h"
#include "common/jinja/jinja_parser_internal.h"
#include "common/status_macros.h"

namespace loom::common::jinja::internal {

bool Parser::IsTupleEnd(std::initializer_list<absl::string_view> extra_end) const {
  const Token& token = Current();
  if (token.type == Type::kVarEnd || token.type == Type::kBlockEnd || token.type == Type::kEnd ||
      (token.type == Type::kOperator && token.value == ")")) {
    return true;
  }
  for (absl::string_view name : extra_end) {
    if (IsName(name)) return true;
  }
  return false;
}
absl::StatusOr<ExprPtr> Parser::ParseTuple(bool with_condexpr,
                                           std::initializer_list<absl::string_view> extra_end,
                                           bool explicit_parentheses) {
  const Token& start = Current();
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) LOOM_RETURN_IF_ERROR(ExpectOp(","));
    if (IsTupleEnd(extra_end)) break;
    LOOM_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
    items.push_back(std::move(item));
    if (IsOp(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parentheses) {
      return Error(absl::StrCat("Expected an expression, got '", Describe(Current()), "'"));
    }
  }
  ExprPtr tuple = MakeExpr(Expr::Kind::kTuple, start);
  tuple->args = std::move(items);
  return tuple;
}
absl::StatusOr<ExprPtr> Parser::ParseExpression(bool with_condexpr) {
  DepthGuard guard(depth_);
  LOOM_RETURN_IF_ERROR(CheckDepth());
  if (!with_condexpr) return ParseOr();
  LOOM_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
  while (IsName("if")) {
    const Token& at = Current();
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr condition, ParseOr());
    ExprPtr otherwise;
    if (SkipName("else")) {
      LOOM_ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
    }
    ExprPtr cond = MakeExpr(Expr::Kind::kCondExpr, at);
    cond->args.push_back(std::move(expr));
    cond->args.push_back(std::move(condition));
    cond->args.push_back(std::move(otherwise));
    expr = std::move(cond);
  }
  return expr;
}
ExprPtr Parser::MakeBinary(Expr::Kind kind, const Token& at, ExprPtr lhs, ExprPtr rhs,
                           std::string op) {
  ExprPtr expr = MakeExpr(kind, at);
  expr->name = std::move(op);
  expr->args.push_back(std::move(lhs));
  expr->args.push_back(std::move(rhs));
  return expr;
}
absl::StatusOr<ExprPtr> Parser::ParseOr() {
  LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseAnd());
  while (IsName("or")) {
    const Token& at = Current();
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseAnd());
    lhs = MakeBinary(Expr::Kind::kOr, at, std::move(lhs), std::move(rhs));
  }
  return lhs;
}
absl::StatusOr<ExprPtr> Parser::ParseAnd() {
  LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseNot());
  while (IsName("and")) {
    const Token& at = Current();
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseNot());
    lhs = MakeBinary(Expr::Kind::kAnd, at, std::move(lhs), std::move(rhs));
  }
  return lhs;
}
absl::StatusOr<ExprPtr> Parser::ParseNot() {
  if (IsName("not")) {
    DepthGuard guard(depth_);
    LOOM_RETURN_IF_ERROR(CheckDepth());
    ExprPtr expr = MakeExpr(Expr::Kind::kNot, Current());
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    expr->args.push_back(std::move(operand));
    return expr;
  }
  return ParseCompare();
}
absl::StatusOr<ExprPtr> Parser::ParseCompare() {
  const Token& start = Current();
  LOOM_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
  ExprPtr compare;
  while (true) {
    std::string op;
    if (Current().type == Type::kOperator &&
        (Current().value == "==" || Current().value == "!=" || Current().value == "<" ||
         Current().value == "<=" || Current().value == ">" || Current().value == ">=")) {
      op = Current().value;
      Next();
    } else if (IsName("in")) {
      op = "in";
      Next();
    } else if (IsName("not") && Look().type == Type::kName && Look().value == "in") {
      op = "notin";
      Next();
      Next();
    } else {
      break;
    }
    LOOM_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
    if (compare == nullptr) {
      compare = MakeExpr(Expr::Kind::kCompare, start);
      compare->args.push_back(std::move(first));
    }
    compare->ops.push_back(std::move(op));
    compare->args.push_back(std::move(operand));
  }
  return compare != nullptr ? std::move(compare) : std::move(first);
}
absl::StatusOr<ExprPtr> Parser::ParseMath1() {
  LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseConcat());
  while (IsOp("+") || IsOp("-")) {
    const Token& at = Current();
    std::string op = at.value;
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseConcat());
    lhs = MakeBinary(Expr::Kind::kBinary, at, std::move(lhs), std::move(rhs), op);
  }
  return lhs;
}
absl::StatusOr<ExprPtr> Parser::ParseConcat() {
  LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseMath2());
  while (IsOp("~")) {
    const Token& at = Current();
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath2());
    lhs = MakeBinary(Expr::Kind::kBinary, at, std::move(lhs), std::move(rhs), "~");
  }
  return lhs;
}
absl::StatusOr<ExprPtr> Parser::ParseMath2() {
  LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParsePow());
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    const Token& at = Current();
    std::string op = at.value;
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParsePow());
    lhs = MakeBinary(Expr::Kind::kBinary, at, std::move(lhs), std::move(rhs), op);
  }
  return lhs;
}
absl::StatusOr<ExprPtr> Parser::ParsePow() {
  LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseUnary(true));
  while (IsOp("**")) {
    const Token& at = Current();
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseUnary(true));
    lhs = MakeBinary(Expr::Kind::kBinary, at, std::move(lhs), std::move(rhs), "**");
  }
  return lhs;
}
absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
  DepthGuard guard(depth_);
  LOOM_RETURN_IF_ERROR(CheckDepth());
  ExprPtr expr;
  if (IsOp("-") || IsOp("+")) {
    expr = MakeExpr(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Current());
    Next();
    LOOM_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    expr->args.push_back(std::move(operand));
  } else {
    LOOM_ASSIGN_OR_RETURN(expr, ParsePrimary());
  }
  LOOM_ASSIGN_OR_RETURN(expr, ParsePostfix(std::move(expr)));
  if (with_filter) {
    LOOM_ASSIGN_OR_RETURN(expr, ParseFilterExpr(std::move(expr)));
  }
  return expr;
}
absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
  const Token& token = Current();
  switch (token.type) {
    case Type::kName: {
      ExprPtr expr;
      if (token.value == "true" || token.value == "True" || token.value == "false" ||
          token.value == "False") {
        expr = MakeExpr(Expr::Kind::kLiteral, token);
        expr->literal = Value::Bool(token.value == "true" || token.value == "True");
      } else if (token.value == "none" || token.value == "None") {
        expr = MakeExpr(Expr::Kind::kLiteral, token);
        expr->literal = Value::None();
      } else {
        expr = MakeExpr(Expr::Kind::kName, token);
        expr->name = token.value;
      }
      Next();
      return expr;
    }
    case Type::kString: {
      ExprPtr expr = MakeExpr(Expr::Kind::kLiteral, token);
      std::string text;
      while (Current().type == Type::kString) {
        text += Current().value;
        Next();
      }
      expr->literal = Value::String(std::move(text));
      return expr;
    }
    case Type::kInteger:
    case Type::kFloat: {
      ExprPtr expr = MakeExpr(Expr::Kind::kLiteral, token);
      expr->literal = token.type == Type::kInteger ? Value::Int(token.int_value)
                                                   : Value::Float(token.float_value);
      Next();
      return expr;
    }
    case Type::kOperator:
      if (token.value == "(") {
        Next();
        LOOM_ASSIGN_OR_RETURN(ExprPtr expr, ParseTuple(true, {}, true));
        LOOM_RETURN_IF_ERROR(ExpectOp(")"));
        return expr;
      }
      if (token.value == "[") return ParseList();
      if (token.value == "{") return ParseDict();
      break;
    default:
      break;
  }
  if (token.type == Type::kVarEnd || token.type == Type::kBlockEnd || token.type == Type::kEnd) {
    return Error(absl::StrCat("Expected an expression, got '", Describe(token), "'"));
  }
  return Error(absl::StrCat("unexpected '", Describe(token), "'"));
}
absl::StatusOr<ExprPtr> Parser::ParseList() {
  ExprPtr list = MakeExpr(Expr::Kind::kList, Current());
  Next();  // [
  while (!IsOp("]")) {
    if (!list->args.empty()) LOOM_RETURN_IF_ERROR(ExpectOp(","));
    if (IsOp("]")) break;
    LOOM_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
    list->args.push_back(std::move(item));
  }
  Next();  // ]
  return list;
}
absl::StatusOr<ExprPtr> Parser::ParseDict() {
  ExprPtr dict = MakeExpr(Expr::Kind::kDict, Current());
  Next();  // {
  while (!IsOp("}")) {
    if (!dict->args.empty()) LOOM_RETURN_IF_ERROR(ExpectOp(","));
    if (IsOp("}")) break;
    LOOM_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
    LOOM_RETURN_IF_ERROR(ExpectOp(":"));
    LOOM_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
    dict->args.push_back(std::move(key));
    dict->args.push_back(std::move(value));
  }
  Next();  // }
  return dict;
}
absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr expr) {
  while (true) {
    if (IsOp(".") || IsOp("[")) {
      LOOM_ASSIGN_OR_RETURN(expr, ParseSubscript(std::move(expr)));
    } else if (IsOp("(")) {
      LOOM_ASSIGN_OR_RETURN(expr, ParseCall(std::move(expr)));
    } else {
      return expr;
    }
  }
}
absl::StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr expr) {
  while (true) {
    if (IsOp("|")) {
      LOOM_ASSIGN_OR_RETURN(expr, ParseFilterChain(std::move(expr)));
    } else if (IsName("is")) {
      LOOM_ASSIGN_OR_RETURN(expr, ParseTest(std::move(expr)));
    } else if (IsOp("(")) {
      LOOM_ASSIGN_OR_RETURN(expr, ParseCall(std::move(expr)));
    } else {
      return expr;
    }
  }
}
absl::StatusOr<ExprPtr> Parser::ParseSubscript(ExprPtr object) {
  const Token& at = Current();
  if (SkipOp(".")) {
    if (Current().type == Type::kName) {
      ExprPtr expr = MakeExpr(Expr::Kind::kGetAttr, at);
      expr->name = Current().value;
      expr->args.push_back(std::move(object));
      Next();
      return expr;
    }
    if (Current().type != Type::kInteger) return Error("expected name or number");
    ExprPtr expr = MakeExpr(Expr::Kind::kGetItem, at);
    ExprPtr index = MakeExpr(Expr::Kind::kLiteral, Current());
    index->literal = Value::Int(Current().int_value);
    Next();
    expr->args.push_back(std::move(object));
    expr->args.push_back(std::move(index));
    return expr;
  }
  Next();  // [
  // One subscript: an expression or a slice `start:stop:step`.
  ExprPtr bounds[3];
  int parts = 0;
  bool is_slice = false;
  while (true) {
    if (!IsOp(":") && !IsOp("]")) {
      LOOM_ASSIGN_OR_RETURN(bounds[parts], ParseExpression(true));
    }
    if (!IsOp(":")) break;
    Next();
    is_slice = true;
    if (++parts > 2) return Error("invalid slice");
  }
  if (IsOp(",")) return Error("unsupported: tuple subscripts");
  LOOM_RETURN_IF_ERROR(ExpectOp("]"));
  if (!is_slice) {
    if (bounds[0] == nullptr) return Error("expected subscript expression");
    ExprPtr expr = MakeExpr(Expr::Kind::kGetItem, at);
    expr->args.push_back(std::move(object));
    expr->args.push_back(std::move(bounds[0]));
    return expr;
  }
  ExprPtr expr = MakeExpr(Expr::Kind::kSlice, at);
  expr->args.push_back(std::move(object));
  for (auto& bound : bounds) expr->args.push_back(std::move(bound));
  return expr;
}
absl::Status Parser::ParseCallArgs(Expr& call) {
  LOOM_RETURN_IF_ERROR(ExpectOp("("));
  bool require_comma = false;
  while (!IsOp(")")) {
    if (require_comma) {
      LOOM_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
    }
    if (IsOp("*") || IsOp("**")) return Error("unsupported: *args and **kwargs in calls");
    if (Current().type == Type::kName && Look().type == Type::kOperator && Look().value == "=") {
      std::string key = Current().value;
      Next();
      Next();
      LOOM_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      call.kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      if (!call.kwargs.empty()) return Error("invalid syntax for function call expression");
      LOOM_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      call.args.push_back(std::move(value));
    }
    require_comma = true;
  }
  Next();  // )
  return absl::OkStatus();
}
absl::StatusOr<ExprPtr> Parser::ParseCall(ExprPtr callee) {
  ExprPtr call = MakeExpr(Expr::Kind::kCall, Current());
  call->args.push_back(std::move(callee));
  LOOM_RETURN_IF_ERROR(ParseCallArgs(*call));
  return call;
}
// `| name(args) | name ...`; with `leading_pipe` false the first `|` is absent
// ({% filter name %}).
absl::StatusOr<ExprPtr> Parser::ParseFilterChain(ExprPtr input, bool leading_pipe) {
  bool first = true;
  while ((first && !leading_pipe) || IsOp("|")) {
    if (!(first && !leading_pipe)) Next();  // |
    first = false;
    const Token& at = Current();
    LOOM_ASSIGN_OR_RETURN(std::string name, ExpectName());
    if (!IsKnownFilter(name)) {
      return ErrorAt(at, absl::StrCat("No filter named '", name, "'."));
    }
    ExprPtr filter = MakeExpr(Expr::Kind::kFilter, at);
    filter->name = std::move(name);
    filter->args.push_back(std::move(input));
    if (IsOp("(")) LOOM_RETURN_IF_ERROR(ParseCallArgs(*filter));
    input = std::move(filter);
  }
  return input;
}
absl::StatusOr<ExprPtr> Parser::ParseTest(ExprPtr input) {
  const Token& at = Current();
  Next();  // is
  bool negated = SkipName("not");
  const Token& name_token = Current();
  LOOM_ASSIGN_OR_RETURN(std::string name, ExpectName());
  if (!IsKnownTest(name)) {
    return ErrorAt(name_token, absl::StrCat("No test named '", name, "'."));
  }
  ExprPtr test = MakeExpr(Expr::Kind::kTest, at);
  test->name = std::move(name);
  test->args.push_back(std::move(input));
  const Token& next = Current();
  if (IsOp("(")) {
    LOOM_RETURN_IF_ERROR(ParseCallArgs(*test));
  } else if ((next.type == Type::kName || next.type == Type::kString ||
              next.type == Type::kInteger || next.type == Type::kFloat || IsOp("[") || IsOp("{")) &&
             !IsName("else") && !IsName("or") && !IsName("and")) {
    if (IsName("is")) return Error("You cannot chain multiple tests with is");
    LOOM_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    LOOM_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    test->args.push_back(std::move(arg));
  }
  if (!negated) return test;
  ExprPtr negation = MakeExpr(Expr::Kind::kNot, at);
  negation->args.push_back(std::move(test));
  return negation;
}
}  // namespace loom::common::jinja::internal
