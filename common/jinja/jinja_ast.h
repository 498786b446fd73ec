#pragma once

// Syntax tree of a parsed Jinja template (the subset chat templates use).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/jinja/jinja_value.h"

namespace loom::common::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using KeywordArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args: items
    kTuple,     // args: items
    kDict,      // args: key0, value0, key1, value1, ...
    kGetAttr,   // args: [object]; name: attribute
    kGetItem,   // args: [object, index]
    kSlice,     // args: [object, start, stop, step], each bound may be null
    kCall,      // args: [callee, positional...]; kwargs
    kFilter,    // args: [input (null inside {% filter %}), positional...]; name; kwargs
    kTest,      // args: [input, positional...]; name; kwargs
    kNeg,       // args: [operand]
    kPos,       // args: [operand]
    kNot,       // args: [operand]
    kAnd,       // args: [lhs, rhs]
    kOr,        // args: [lhs, rhs]
    kBinary,    // args: [lhs, rhs]; name: "+", "-", "*", "/", "//", "%", "**", "~"
    kCompare,   // args: [first, operand...]; ops: one per operand ("==", "in", "notin", ...)
    kCondExpr,  // args: [then, condition, else (null: undefined)]
  };
  Kind kind;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::string> ops;
  KeywordArgs kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches, else_body
    kFor,       // targets in expr [if condition] body [else else_body]
    kSet,       // targets = expr, or targets[0].attribute = expr
    kSetBlock,  // {% set targets[0] %}body{% endset %}, optional filter
    kMacro,     // name(params) body
    kBreak,
    kContinue,
    kWith,         // params (assignments) body
    kFilterBlock,  // {% filter %}: filter (a kFilter with null input) applied to body
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  bool unpack = false;    // the targets form a tuple (`for k, v in ...`)
  std::string attribute;  // kSet on a namespace attribute: `ns.attribute = ...`
  ExprPtr condition;      // kFor's `if` filter
  ExprPtr filter;         // kSetBlock / kFilterBlock filter
  std::string name;       // kMacro
  KeywordArgs params;     // kMacro parameters (default may be null); kWith assignments
};

/// A parsed template: its top-level statements.
struct Template {
  Body body;
};

}  // namespace loom::common::jinja
