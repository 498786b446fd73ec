#include "common/jinja/jinja_interpreter.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/jinja/jinja_builtins.h"
#include "common/jinja/jinja_filters.h"
#include "common/jinja/jinja_operators.h"
#include "common/status_macros.h"

namespace loom::common::jinja {
namespace {

// Marks a Status whose message already carries a source position.
constexpr absl::string_view kPositionedPayloadUrl = "type.loom/jinja.Positioned";

struct Scope {
  explicit Scope(const Scope* parent_scope) : parent(parent_scope) {}
  absl::flat_hash_map<std::string, Value> vars;
  const Scope* parent;
};

enum class Flow { kNormal, kBreak, kContinue };

absl::Status WithPosition(absl::Status status, int line, int column) {
  if (status.ok() || status.GetPayload(kPositionedPayloadUrl).has_value() ||
      status.GetPayload(kRaisedPayloadUrl).has_value()) {
    return status;
  }
  absl::Status positioned(status.code(),
                          absl::StrCat("line ", line, ", column ", column, ": ", status.message()));
  positioned.SetPayload(kPositionedPayloadUrl, absl::Cord("1"));
  return positioned;
}

class Renderer {
 public:
  Renderer(const ValueDict& context, const RenderLimits& limits) : root_(nullptr), limits_(limits) {
    ValueDict globals = MakeGlobals();
    for (const auto& [name, value] : globals.entries()) root_.vars[name] = value;
    for (const auto& [name, value] : context.entries()) root_.vars[name] = value;
  }

  absl::StatusOr<std::string> Run(const Template& tmpl) {
    LOOM_ASSIGN_OR_RETURN(Flow flow, ExecBody(tmpl.body, root_));
    (void)flow;
    return std::move(out_);
  }

 private:
  // ---- statements -----------------------------------------------------------------
  absl::StatusOr<Flow> ExecBody(const Body& body, Scope& scope) {
    for (const StmtPtr& stmt : body) {
      auto flow = Exec(*stmt, scope);
      if (!flow.ok()) return WithPosition(flow.status(), stmt->line, stmt->column);
      if (*flow != Flow::kNormal) return *flow;
    }
    return Flow::kNormal;
  }

  absl::Status Step() {
    if (++steps_ > limits_.max_steps) {
      return absl::ResourceExhaustedError(
          absl::StrCat("template exceeded ", limits_.max_steps, " steps"));
    }
    return absl::OkStatus();
  }

  absl::Status Emit(absl::string_view text) {
    if (out_.size() + text.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("template output exceeds the limit of ",
                                                       limits_.max_output_bytes, " bytes"));
    }
    out_.append(text.data(), text.size());
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> Exec(const Stmt& stmt, Scope& scope) {
    LOOM_RETURN_IF_ERROR(Step());
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        LOOM_RETURN_IF_ERROR(Emit(stmt.text));
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        LOOM_ASSIGN_OR_RETURN(Value value, Eval(*stmt.expr, scope));
        if (value.is_generator()) {
          return absl::InvalidArgumentError("printing a generator is not supported");
        }
        LOOM_RETURN_IF_ERROR(Emit(value.Str()));
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (const auto& [condition, body] : stmt.branches) {
          LOOM_ASSIGN_OR_RETURN(Value test, Eval(*condition, scope));
          if (test.Truthy()) return ExecBody(body, scope);
        }
        return ExecBody(stmt.else_body, scope);
      case Stmt::Kind::kFor:
        return ExecFor(stmt, scope);
      case Stmt::Kind::kSet: {
        LOOM_ASSIGN_OR_RETURN(Value value, Eval(*stmt.expr, scope));
        if (!stmt.attribute.empty()) {
          Value target = Lookup(stmt.targets[0], scope);
          if (!target.is_namespace()) {
            return absl::InvalidArgumentError(
                absl::StrCat("can only assign attributes of a namespace, and '", stmt.targets[0],
                             "' is not one"));
          }
          target.MutableNamespace().Set(stmt.attribute, std::move(value));
          return Flow::kNormal;
        }
        LOOM_RETURN_IF_ERROR(Assign(stmt.targets, stmt.unpack, value, scope));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        LOOM_ASSIGN_OR_RETURN(Value value, Capture(stmt.body, scope));
        if (stmt.filter != nullptr) {
          LOOM_ASSIGN_OR_RETURN(value, EvalOnBlock(*stmt.filter, value, scope));
        }
        scope.vars[stmt.targets[0]] = std::move(value);
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        LOOM_ASSIGN_OR_RETURN(Value value, Capture(stmt.body, scope));
        LOOM_ASSIGN_OR_RETURN(value, EvalOnBlock(*stmt.filter, value, scope));
        LOOM_RETURN_IF_ERROR(Emit(value.Str()));
        return Flow::kNormal;
      }
      case Stmt::Kind::kWith: {
        Scope inner(&scope);
        for (const auto& [name, expr] : stmt.params) {
          LOOM_ASSIGN_OR_RETURN(Value value, Eval(*expr, scope));
          inner.vars[name] = std::move(value);
        }
        return ExecBody(stmt.body, inner);
      }
      case Stmt::Kind::kMacro:
        scope.vars[stmt.name] = MakeMacro(stmt);
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return absl::InternalError("unknown statement");
  }

  absl::Status Assign(const std::vector<std::string>& targets, bool unpack, const Value& value,
                      Scope& scope) {
    if (!unpack) {
      scope.vars[targets[0]] = value;
      return absl::OkStatus();
    }
    LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
    if (items.size() < targets.size()) {
      return absl::InvalidArgumentError(absl::StrCat("not enough values to unpack (expected ",
                                                     targets.size(), ", got ", items.size(), ")"));
    }
    if (items.size() > targets.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("too many values to unpack (expected ", targets.size(), ")"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& stmt, Scope& scope) {
    LOOM_ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.expr, scope));
    LOOM_ASSIGN_OR_RETURN(ValueList items, Iterate(iterable));
    if (stmt.condition != nullptr) {
      ValueList kept;
      for (Value& item : items) {
        LOOM_RETURN_IF_ERROR(Step());
        Scope probe(&scope);
        LOOM_RETURN_IF_ERROR(Assign(stmt.targets, stmt.unpack, item, probe));
        LOOM_ASSIGN_OR_RETURN(Value keep, Eval(*stmt.condition, probe));
        if (keep.Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      LOOM_RETURN_IF_ERROR(Step());
      Scope inner(&scope);
      LOOM_RETURN_IF_ERROR(Assign(stmt.targets, stmt.unpack, items[i], inner));
      inner.vars["loop"] = MakeLoop(items, i);
      LOOM_ASSIGN_OR_RETURN(Flow flow, ExecBody(stmt.body, inner));
      if (flow == Flow::kBreak) break;
    }
    if (length == 0) {
      Scope inner(&scope);
      LOOM_ASSIGN_OR_RETURN(Flow flow, ExecBody(stmt.else_body, inner));
      (void)flow;
    }
    return Flow::kNormal;
  }

  static Value MakeLoop(const ValueList& items, int64_t i) {
    const int64_t length = static_cast<int64_t>(items.size());
    ValueDict loop;
    loop.Set("index", Value::Int(i + 1));
    loop.Set("index0", Value::Int(i));
    loop.Set("revindex", Value::Int(length - i));
    loop.Set("revindex0", Value::Int(length - i - 1));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == length - 1));
    loop.Set("length", Value::Int(length));
    loop.Set("depth", Value::Int(1));
    loop.Set("depth0", Value::Int(0));
    if (i > 0) loop.Set("previtem", items[i - 1]);
    if (i + 1 < length) loop.Set("nextitem", items[i + 1]);
    loop.Set("cycle", Value::Func("cycle", [i](CallArgs& args) -> absl::StatusOr<Value> {
               if (args.positional.empty()) {
                 return absl::InvalidArgumentError("no items for cycling given");
               }
               return args.positional[i % args.positional.size()];
             }));
    return Value::Dict(std::move(loop));
  }

  // Renders `body` into a string of its own (block set, filter block, macro call).
  absl::StatusOr<Value> Capture(const Body& body, Scope& scope) {
    std::string saved = std::move(out_);
    out_.clear();
    auto flow = ExecBody(body, scope);
    std::string captured = std::move(out_);
    out_ = std::move(saved);
    if (!flow.ok()) return flow.status();
    return Value::String(std::move(captured));
  }

  Value MakeMacro(const Stmt& stmt) {
    return Value::Func(stmt.name, [this, &stmt](CallArgs& args) -> absl::StatusOr<Value> {
      if (call_depth_ >= limits_.max_call_depth) {
        return absl::ResourceExhaustedError(
            absl::StrCat("macro calls nested deeper than ", limits_.max_call_depth));
      }
      if (args.positional.size() > stmt.params.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "macro '", stmt.name, "' takes not more than ", stmt.params.size(), " argument(s)"));
      }
      Scope inner(&root_);
      for (size_t i = 0; i < stmt.params.size(); ++i) {
        const auto& [name, default_expr] = stmt.params[i];
        if (i < args.positional.size()) {
          inner.vars[name] = args.positional[i];
          continue;
        }
        bool given = false;
        for (const auto& [key, value] : args.keyword) {
          if (key == name) {
            inner.vars[name] = value;
            given = true;
          }
        }
        if (given) continue;
        if (default_expr != nullptr) {
          LOOM_ASSIGN_OR_RETURN(inner.vars[name], Eval(*default_expr, inner));
        } else {
          inner.vars[name] = Value::Undefined(absl::StrCat("'", name, "' is undefined"));
        }
      }
      for (const auto& [key, value] : args.keyword) {
        bool known = false;
        for (const auto& param : stmt.params) known = known || param.first == key;
        if (!known) {
          return absl::InvalidArgumentError(
              absl::StrCat("macro '", stmt.name, "' takes no keyword argument '", key, "'"));
        }
      }
      ++call_depth_;
      auto result = Capture(stmt.body, inner);
      --call_depth_;
      return result;
    });
  }

  // ---- expressions ----------------------------------------------------------------
  Value Lookup(const std::string& name, const Scope& scope) const {
    for (const Scope* s = &scope; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  absl::StatusOr<Value> EvalOnBlock(const Expr& filter, const Value& input, Scope& scope) {
    const Value* saved = block_input_;
    block_input_ = &input;
    auto result = Eval(filter, scope);
    block_input_ = saved;
    return result;
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& expr, size_t first, Scope& scope) {
    CallArgs args;
    for (size_t i = first; i < expr.args.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(Value value, Eval(*expr.args[i], scope));
      args.positional.push_back(std::move(value));
    }
    for (const auto& [key, value_expr] : expr.kwargs) {
      LOOM_ASSIGN_OR_RETURN(Value value, Eval(*value_expr, scope));
      args.keyword.emplace_back(key, std::move(value));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& expr, Scope& scope) {
    auto result = EvalNode(expr, scope);
    if (!result.ok()) return WithPosition(result.status(), expr.line, expr.column);
    return result;
  }

  absl::StatusOr<Value> EvalNode(const Expr& expr, Scope& scope) {
    switch (expr.kind) {
      case Expr::Kind::kLiteral:
        return expr.literal;
      case Expr::Kind::kName:
        return Lookup(expr.name, scope);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const ExprPtr& item : expr.args) {
          LOOM_ASSIGN_OR_RETURN(Value value, Eval(*item, scope));
          items.push_back(std::move(value));
        }
        return Value::List(std::move(items), expr.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        ValueDict dict;
        for (size_t i = 0; i + 1 < expr.args.size(); i += 2) {
          LOOM_ASSIGN_OR_RETURN(Value key, Eval(*expr.args[i], scope));
          LOOM_ASSIGN_OR_RETURN(Value value, Eval(*expr.args[i + 1], scope));
          if (!key.is_string()) {
            return absl::InvalidArgumentError("unsupported: dict keys other than strings");
          }
          dict.Set(key.AsString(), std::move(value));
        }
        return Value::Dict(std::move(dict));
      }
      case Expr::Kind::kGetAttr: {
        LOOM_ASSIGN_OR_RETURN(Value object, Eval(*expr.args[0], scope));
        return GetAttribute(object, expr.name);
      }
      case Expr::Kind::kGetItem: {
        LOOM_ASSIGN_OR_RETURN(Value object, Eval(*expr.args[0], scope));
        LOOM_ASSIGN_OR_RETURN(Value key, Eval(*expr.args[1], scope));
        return GetItem(object, key);
      }
      case Expr::Kind::kSlice: {
        LOOM_ASSIGN_OR_RETURN(Value object, Eval(*expr.args[0], scope));
        Value bounds[3];
        for (int i = 0; i < 3; ++i) {
          if (expr.args[i + 1] == nullptr) continue;
          LOOM_ASSIGN_OR_RETURN(bounds[i], Eval(*expr.args[i + 1], scope));
        }
        return GetSlice(object, bounds[0], bounds[1], bounds[2]);
      }
      case Expr::Kind::kCall: {
        LOOM_ASSIGN_OR_RETURN(Value callee, Eval(*expr.args[0], scope));
        LOOM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1, scope));
        if (callee.is_function()) return callee.AsFunction().call(args);
        if (callee.is_undefined()) return absl::InvalidArgumentError(callee.UndefinedMessage());
        return absl::InvalidArgumentError(
            absl::StrCat("'", callee.TypeName(), "' is not callable"));
      }
      case Expr::Kind::kFilter: {
        Value input;
        if (expr.args[0] == nullptr) {
          input = *block_input_;
        } else {
          LOOM_ASSIGN_OR_RETURN(input, Eval(*expr.args[0], scope));
        }
        LOOM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1, scope));
        return ApplyFilter(expr.name, input, args);
      }
      case Expr::Kind::kTest: {
        LOOM_ASSIGN_OR_RETURN(Value input, Eval(*expr.args[0], scope));
        LOOM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr, 1, scope));
        LOOM_ASSIGN_OR_RETURN(bool passed, ApplyTest(expr.name, input, args));
        return Value::Bool(passed);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        LOOM_ASSIGN_OR_RETURN(Value operand, Eval(*expr.args[0], scope));
        return UnaryOp(expr.kind == Expr::Kind::kNeg, operand);
      }
      case Expr::Kind::kNot: {
        LOOM_ASSIGN_OR_RETURN(Value operand, Eval(*expr.args[0], scope));
        return Value::Bool(!operand.Truthy());
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        LOOM_ASSIGN_OR_RETURN(Value lhs, Eval(*expr.args[0], scope));
        bool short_circuit = expr.kind == Expr::Kind::kAnd ? !lhs.Truthy() : lhs.Truthy();
        if (short_circuit) return lhs;
        return Eval(*expr.args[1], scope);
      }
      case Expr::Kind::kBinary: {
        LOOM_ASSIGN_OR_RETURN(Value lhs, Eval(*expr.args[0], scope));
        LOOM_ASSIGN_OR_RETURN(Value rhs, Eval(*expr.args[1], scope));
        return BinaryOp(expr.name, lhs, rhs, limits_.max_output_bytes);
      }
      case Expr::Kind::kCompare: {
        LOOM_ASSIGN_OR_RETURN(Value lhs, Eval(*expr.args[0], scope));
        for (size_t i = 0; i < expr.ops.size(); ++i) {
          LOOM_ASSIGN_OR_RETURN(Value rhs, Eval(*expr.args[i + 1], scope));
          LOOM_ASSIGN_OR_RETURN(bool holds, CompareOp(expr.ops[i], lhs, rhs));
          if (!holds) return Value::Bool(false);
          lhs = std::move(rhs);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCondExpr: {
        LOOM_ASSIGN_OR_RETURN(Value condition, Eval(*expr.args[1], scope));
        if (condition.Truthy()) return Eval(*expr.args[0], scope);
        if (expr.args[2] != nullptr) return Eval(*expr.args[2], scope);
        return Value::Undefined(absl::StrCat("the inline if-expression on line ", expr.line,
                                             " evaluated to false and no else section was "
                                             "defined."));
      }
    }
    return absl::InternalError("unknown expression");
  }

  Scope root_;
  const RenderLimits& limits_;
  std::string out_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  const Value* block_input_ = nullptr;  // input of a {% filter %} / {% set | f %} chain
};

}  // namespace

absl::StatusOr<std::string> RenderTemplate(const Template& tmpl, const ValueDict& context,
                                           const RenderLimits& limits) {
  Renderer renderer(context, limits);
  return renderer.Run(tmpl);
}

}  // namespace loom::common::jinja
