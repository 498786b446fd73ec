#pragma once

// The Jinja parser's class, shared by its two source files: statements
// (jinja_parser.cc) and expressions (jinja_expression_parser.cc). Internal to common/jinja.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/jinja_ast.h"
#include "common/jinja/jinja_lexer.h"
#include "common/status_macros.h"

namespace loom::common::jinja::internal {

using Type = Token::Type;

// Deeper nesting than this is rejected rather than risking the native stack.
constexpr int kMaxNestingDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<std::unique_ptr<Template>> Run() {
    auto tmpl = std::make_unique<Template>();
    LOOM_ASSIGN_OR_RETURN(tmpl->body, ParseBody({}, ""));
    return tmpl;
  }

 private:
  // ---- token stream -------------------------------------------------------------
  const Token& Current() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[pos_ + 1 < tokens_.size() ? pos_ + 1 : pos_]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(absl::string_view op) const {
    return Current().type == Type::kOperator && Current().value == op;
  }
  bool IsName(absl::string_view name) const {
    return Current().type == Type::kName && Current().value == name;
  }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  static std::string Describe(const Token& token) {
    switch (token.type) {
      case Type::kText:
        return "template data";
      case Type::kVarBegin:
        return "begin of print statement";
      case Type::kVarEnd:
        return "end of print statement";
      case Type::kBlockBegin:
        return "begin of statement block";
      case Type::kBlockEnd:
        return "end of statement block";
      case Type::kEnd:
        return "end of template";
      case Type::kString:
        return "string";
      case Type::kInteger:
        return "integer";
      case Type::kFloat:
        return "float";
      default:
        return token.value;
    }
  }

  absl::Status ErrorAt(const Token& token, absl::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", token.line, ", column ", token.column, ": ", message));
  }
  absl::Status Error(absl::string_view message) const { return ErrorAt(Current(), message); }

  absl::Status ExpectOp(absl::string_view op) {
    if (SkipOp(op)) return absl::OkStatus();
    return Error(absl::StrCat("expected token '", op, "', got '", Describe(Current()), "'"));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Current().type != Type::kName) {
      return Error(absl::StrCat("expected token 'name', got '", Describe(Current()), "'"));
    }
    std::string name = Current().value;
    Next();
    return name;
  }
  absl::Status ExpectType(Type type) {
    if (Current().type == type) {
      Next();
      return absl::OkStatus();
    }
    Token expected{type, "", 0, 0, 0, 0};
    return Error(
        absl::StrCat("expected token '", Describe(expected), "', got '", Describe(Current()), "'"));
  }

  ExprPtr MakeExpr(Expr::Kind kind, const Token& at) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = at.line;
    expr->column = at.column;
    return expr;
  }
  StmtPtr MakeStmt(Stmt::Kind kind, const Token& at) {
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = kind;
    stmt->line = at.line;
    stmt->column = at.column;
    return stmt;
  }

  // Guards recursion in both statement and expression parsing.
  struct DepthGuard {
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }
    int& depth_;
  };
  absl::Status CheckDepth() const {
    if (depth_ > kMaxNestingDepth) {
      return Error(absl::StrCat("template nested deeper than ", kMaxNestingDepth, " levels"));
    }
    return absl::OkStatus();
  }

  // ---- statements (jinja_parser.cc) ---------------------------------------------
  // Parses until a `{% name %}` with name in `end_tags`; leaves the stream on that name.
  absl::StatusOr<Body> ParseBody(std::initializer_list<absl::string_view> end_tags,
                                 absl::string_view innermost);
  absl::StatusOr<StmtPtr> ParseStatement();
  absl::StatusOr<StmtPtr> ParseIf();
  // Assignment targets: a name, `a, b`, or `(a, b)`.
  absl::Status ParseTargets(Stmt& stmt, absl::string_view end_name);
  absl::StatusOr<StmtPtr> ParseFor();
  absl::StatusOr<StmtPtr> ParseSet();
  absl::StatusOr<StmtPtr> ParseMacro();
  absl::StatusOr<StmtPtr> ParseWith();
  absl::StatusOr<StmtPtr> ParseFilterBlock();

  // ---- expressions (jinja_expression_parser.cc) ---------------------------------
  bool IsTupleEnd(std::initializer_list<absl::string_view> extra_end) const;
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr,
                                     std::initializer_list<absl::string_view> extra_end,
                                     bool explicit_parentheses);
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr);
  ExprPtr MakeBinary(Expr::Kind kind, const Token& at, ExprPtr lhs, ExprPtr rhs,
                     std::string op = "");
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePrimary();
  absl::StatusOr<ExprPtr> ParseList();
  absl::StatusOr<ExprPtr> ParseDict();
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr expr);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr expr);
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr object);
  absl::Status ParseCallArgs(Expr& call);
  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee);
  // `| name(args) | name ...`; with `leading_pipe` false the first `|` is absent
  // ({% filter name %}).
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr input, bool leading_pipe = true);
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr input);

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace loom::common::jinja::internal
