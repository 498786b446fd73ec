#include "common/jinja/jinja_parser.h"

// The Jinja parser's statements (text, output, if, for, set, macro, with, filter blocks) and
// ParseTemplate; expressions are in jinja_expression_parser.cc (jinja_parser_internal.h).

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jinja/jinja_filters.h"
#include "common/jinja/jinja_lexer.h"
#include "common/jinja/jinja_parser_internal.h"
#include "common/status_macros.h"

namespace loom::common::jinja {
namespace internal {

// Parses until a `{% name %}` with name in `end_tags`; leaves the stream on that name.
absl::StatusOr<Body> Parser::ParseBody(std::initializer_list<absl::string_view> end_tags,
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
absl::StatusOr<StmtPtr> Parser::ParseStatement() {
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
absl::StatusOr<StmtPtr> Parser::ParseIf() {
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
absl::Status Parser::ParseTargets(Stmt& stmt, absl::string_view end_name) {
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
absl::StatusOr<StmtPtr> Parser::ParseFor() {
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
absl::StatusOr<StmtPtr> Parser::ParseSet() {
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
absl::StatusOr<StmtPtr> Parser::ParseMacro() {
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
absl::StatusOr<StmtPtr> Parser::ParseWith() {
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
absl::StatusOr<StmtPtr> Parser::ParseFilterBlock() {
  StmtPtr stmt = MakeStmt(Stmt::Kind::kFilterBlock, Current());
  Next();  // filter
  LOOM_ASSIGN_OR_RETURN(stmt->filter, ParseFilterChain(nullptr, /*leading_pipe=*/false));
  LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
  LOOM_ASSIGN_OR_RETURN(stmt->body, ParseBody({"endfilter"}, "filter"));
  Next();  // endfilter
  LOOM_RETURN_IF_ERROR(ExpectType(Type::kBlockEnd));
  return stmt;
}
}  // namespace internal

absl::StatusOr<std::unique_ptr<Template>> ParseTemplate(absl::string_view source) {
  LOOM_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return internal::Parser(std::move(tokens)).Run();
}

}  // namespace loom::common::jinja
