#include "common/jinja/jinja_parser.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jinja/jinja_filters.h"
#include "common/jinja/jinja_lexer.h"
#include "common/status_macros.h"

namespace loom::common::jinja {
namespace {

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

  // ---- statements -----------------------------------------------------------------
  // Parses until a `{% name %}` with name in `end_tags`; leaves the stream on that name.
  absl::StatusOr<Body> ParseBody(std::initializer_list<absl::string_view> end_tags,
                                 absl::string_view innermost) {
    DepthGuard guard(depth_);
    LOOM_RETURN_IF_ERROR(CheckDepth());
    Body body;
    while (true) {
      const Token& token = Current();
      switch (token.type) {
        case Type::kText: {
          StmtPtr stmt = MakeStmt(Stmt::Kind::kText, token);
          stmt->text = token.value;
          Next();
          body.push_back(std::move(stmt));
          break;
        }
        case Type::kVarBegin: {
          StmtPtr stmt = MakeStmt(Stmt::Kind::kOutput, token);
          Next();
          LOOM_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(true, {}, false));
          LOOM_RETURN_IF_ERROR(ExpectType(Type::kVarEnd));
          body.push_back(std::move(stmt));
          break;
        }
        case Type::kBlockBegin: {
          Next();
          if (Current().type == Type::kName) {
            for (absl::string_view end : end_tags) {
              if (Current().value == end) return body;
            }
          }
          LOOM_ASSIGN_OR_RETURN(StmtPtr stmt, ParseStatement());
          body.push_back(std::move(stmt));
          break;
        }
        case Type::kEnd: {
          if (end_tags.size() == 0) return body;
          std::vector<std::string> quoted;
          for (absl::string_view end : end_tags) quoted.push_back(absl::StrCat("'", end, "'"));
          return Error(
              absl::StrCat("Unexpected end of template. Jinja was looking for the following tags: ",
                           absl::StrJoin(quoted, " or "),
                           ". The innermost block that needs to be closed is '", innermost, "'."));
        }
        default:
          return Error(absl::StrCat("unexpected '", Describe(token), "'"));
      }
    }
  }

  absl::StatusOr<StmtPtr> ParseStatement() {
    const Token& token = Current();
    if (token.type != Type::kName) return Error("tag name expected");
    const std::string& tag = token.value;
    StmtPtr stmt;
    if (tag == "if") {
      LOOM_ASSIGN_OR_RETURN(stmt, ParseIf());
    } else if (tag == "for") {
      LOOM_ASSIGN_OR_RETURN(stmt, ParseFor());
    } else if (tag == "set") {
      LOOM_ASSIGN_OR_RETURN(stmt, ParseSet());
    } else if (tag == "macro") {
      LOOM_ASSIGN_OR_RETURN(stmt, ParseMacro());
    } else if (tag == "with") {
      LOOM_ASSIGN_OR_RETURN(stmt, ParseWith());
    } else if (tag == "filter") {
      LOOM_ASSIGN_OR_RETURN(stmt, ParseFilterBlock());
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return Error(absl::StrCat("'", tag, "' outside loop"));
      stmt = MakeStmt(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, token);
      Next();
      LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    } else if (tag == "extends" || tag == "include" || tag == "import" || tag == "from" ||
               tag == "block" || tag == "call" || tag == "autoescape" || tag == "raw") {
      return Error(absl::StrCat("unsupported tag '", tag,
                                "': Loom's chat template engine does not implement it"));
    } else {
      return Error(absl::StrCat("Encountered unknown tag '", tag, "'."));
    }
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseIf() {
    StmtPtr stmt = MakeStmt(Stmt::Kind::kIf, Current());
    Next();  // if
    while (true) {
      LOOM_ASSIGN_OR_RETURN(ExprPtr condition, ParseTuple(true, {}, false));
      LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
      LOOM_ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, "if"));
      stmt->branches.emplace_back(std::move(condition), std::move(body));
      if (SkipName("elif")) continue;
      if (SkipName("else")) {
        LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
        LOOM_ASSIGN_OR_RETURN(stmt->else_body, ParseBody({"endif"}, "if"));
      }
      Next();  // endif
      LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
      return stmt;
    }
  }

  // Assignment targets: a name, `a, b`, or `(a, b)`.
  absl::Status ParseTargets(Stmt& stmt, absl::string_view end_name) {
    bool parenthesized = SkipOp("(");
    while (true) {
      LOOM_ASSIGN_OR_RETURN(std::string name, ExpectName());
      stmt.targets.push_back(std::move(name));
      if (!SkipOp(",")) break;
      stmt.unpack = true;
      if ((parenthesized && IsOp(")")) || (!end_name.empty() && IsName(end_name)) || IsOp("=")) {
        break;
      }
    }
    if (parenthesized) LOOM_RETURN_IF_ERROR(ExpectOp(")"));
    return absl::OkStatus();
  }

  absl::StatusOr<StmtPtr> ParseFor() {
    StmtPtr stmt = MakeStmt(Stmt::Kind::kFor, Current());
    Next();  // for
    LOOM_RETURN_IF_ERROR(ParseTargets(*stmt, "in"));
    if (!SkipName("in")) return Error("expected token 'in'");
    LOOM_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(false, {"recursive"}, false));
    if (SkipName("if")) {
      LOOM_ASSIGN_OR_RETURN(stmt->condition, ParseExpression(true));
    }
    if (IsName("recursive")) return Error("unsupported: recursive for loops");
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    ++loop_depth_;
    auto body = ParseBody({"endfor", "else"}, "for");
    --loop_depth_;
    if (!body.ok()) return body.status();
    stmt->body = *std::move(body);
    if (SkipName("else")) {
      LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
      LOOM_ASSIGN_OR_RETURN(stmt->else_body, ParseBody({"endfor"}, "for"));
    }
    Next();  // endfor
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseSet() {
    StmtPtr stmt = MakeStmt(Stmt::Kind::kSet, Current());
    Next();  // set
    if (Current().type == Type::kName && Look().type == Type::kOperator && Look().value == ".") {
      stmt->targets.push_back(Current().value);
      Next();
      Next();
      LOOM_ASSIGN_OR_RETURN(stmt->attribute, ExpectName());
    } else {
      LOOM_RETURN_IF_ERROR(ParseTargets(*stmt, ""));
    }
    if (SkipOp("=")) {
      LOOM_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(true, {}, false));
      LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
      return stmt;
    }
    if (stmt->unpack || !stmt->attribute.empty()) return Error("expected token '='");
    stmt->kind = Stmt::Kind::kSetBlock;
    if (IsOp("|")) {
      LOOM_ASSIGN_OR_RETURN(stmt->filter, ParseFilterChain(nullptr));
    }
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    LOOM_ASSIGN_OR_RETURN(stmt->body, ParseBody({"endset"}, "set"));
    Next();  // endset
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseMacro() {
    StmtPtr stmt = MakeStmt(Stmt::Kind::kMacro, Current());
    Next();  // macro
    LOOM_ASSIGN_OR_RETURN(stmt->name, ExpectName());
    LOOM_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!stmt->params.empty()) LOOM_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      LOOM_ASSIGN_OR_RETURN(std::string param, ExpectName());
      ExprPtr default_value;
      if (SkipOp("=")) {
        LOOM_ASSIGN_OR_RETURN(default_value, ParseExpression(true));
      }
      stmt->params.emplace_back(std::move(param), std::move(default_value));
    }
    Next();  // )
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    auto body = ParseBody({"endmacro"}, "macro");
    loop_depth_ = saved_loop_depth;
    if (!body.ok()) return body.status();
    stmt->body = *std::move(body);
    Next();  // endmacro
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseWith() {
    StmtPtr stmt = MakeStmt(Stmt::Kind::kWith, Current());
    Next();  // with
    while (Current().type != Type::kBlockEnd) {
      if (!stmt->params.empty()) LOOM_RETURN_IF_ERROR(ExpectOp(","));
      LOOM_ASSIGN_OR_RETURN(std::string name, ExpectName());
      LOOM_RETURN_IF_ERROR(ExpectOp("="));
      LOOM_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      stmt->params.emplace_back(std::move(name), std::move(value));
    }
    Next();
    LOOM_ASSIGN_OR_RETURN(stmt->body, ParseBody({"endwith"}, "with"));
    Next();  // endwith
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseFilterBlock() {
    StmtPtr stmt = MakeStmt(Stmt::Kind::kFilterBlock, Current());
    Next();  // filter
    LOOM_ASSIGN_OR_RETURN(stmt->filter, ParseFilterChain(nullptr, /*leading_pipe=*/false));
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    LOOM_ASSIGN_OR_RETURN(stmt->body, ParseBody({"endfilter"}, "filter"));
    Next();  // endfilter
    LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
    return stmt;
  }

  // ---- expressions ----------------------------------------------------------------
  bool IsTupleEnd(std::initializer_list<absl::string_view> extra_end) const {
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

  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr,
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

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
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

  ExprPtr MakeBinary(Expr::Kind kind, const Token& at, ExprPtr lhs, ExprPtr rhs,
                     std::string op = "") {
    ExprPtr expr = MakeExpr(kind, at);
    expr->name = std::move(op);
    expr->args.push_back(std::move(lhs));
    expr->args.push_back(std::move(rhs));
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseAnd());
    while (IsName("or")) {
      const Token& at = Current();
      Next();
      LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseAnd());
      lhs = MakeBinary(Expr::Kind::kOr, at, std::move(lhs), std::move(rhs));
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseNot());
    while (IsName("and")) {
      const Token& at = Current();
      Next();
      LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseNot());
      lhs = MakeBinary(Expr::Kind::kAnd, at, std::move(lhs), std::move(rhs));
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
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

  absl::StatusOr<ExprPtr> ParseCompare() {
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

  absl::StatusOr<ExprPtr> ParseMath1() {
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

  absl::StatusOr<ExprPtr> ParseConcat() {
    LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseMath2());
    while (IsOp("~")) {
      const Token& at = Current();
      Next();
      LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath2());
      lhs = MakeBinary(Expr::Kind::kBinary, at, std::move(lhs), std::move(rhs), "~");
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
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

  absl::StatusOr<ExprPtr> ParsePow() {
    LOOM_ASSIGN_OR_RETURN(ExprPtr lhs, ParseUnary(true));
    while (IsOp("**")) {
      const Token& at = Current();
      Next();
      LOOM_ASSIGN_OR_RETURN(ExprPtr rhs, ParseUnary(true));
      lhs = MakeBinary(Expr::Kind::kBinary, at, std::move(lhs), std::move(rhs), "**");
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
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

  absl::StatusOr<ExprPtr> ParsePrimary() {
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

  absl::StatusOr<ExprPtr> ParseList() {
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

  absl::StatusOr<ExprPtr> ParseDict() {
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

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr expr) {
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

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr expr) {
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

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr object) {
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

  absl::Status ParseCallArgs(Expr& call) {
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

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    ExprPtr call = MakeExpr(Expr::Kind::kCall, Current());
    call->args.push_back(std::move(callee));
    LOOM_RETURN_IF_ERROR(ParseCallArgs(*call));
    return call;
  }

  // `| name(args) | name ...`; with `leading_pipe` false the first `|` is absent
  // ({% filter name %}).
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr input, bool leading_pipe = true) {
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

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr input) {
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
                next.type == Type::kInteger || next.type == Type::kFloat || IsOp("[") ||
                IsOp("{")) &&
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

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> ParseTemplate(absl::string_view source) {
  LOOM_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).Run();
}

}  // namespace loom::common::jinja
