#include "common/grammar/tool_call_grammar.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/grammar/json_schema_grammar.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::common {
namespace {

// Ordered: the schema's properties keep the client's order (the order they are written).
using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> StringField(const Json& spec, const char* name) {
  auto it = spec.find(name);
  if (it == spec.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(std::string("tool-call grammar: '") + name +
                                      "' must be a string");
  }
  return it->get<std::string>();
}

}  // namespace

absl::StatusOr<GrammarDefinition> ToolCallGrammar(std::string_view spec_json) {
  const Json spec = Json::parse(spec_json, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded() || !spec.is_object()) {
    return absl::InvalidArgumentError("tool-call grammar: the spec must be a JSON object");
  }
  auto schema = spec.find("schema");
  if (schema == spec.end() || !(schema->is_object() || schema->is_boolean())) {
    return absl::InvalidArgumentError("tool-call grammar: 'schema' must be a JSON Schema object");
  }
  LOOM_ASSIGN_OR_RETURN(std::string begin, StringField(spec, "begin"));
  LOOM_ASSIGN_OR_RETURN(std::string end, StringField(spec, "end"));
  LOOM_ASSIGN_OR_RETURN(std::string separator, StringField(spec, "separator"));
  bool repeat = false;
  if (auto it = spec.find("repeat"); it != spec.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError("tool-call grammar: 'repeat' must be a boolean");
    }
    repeat = it->get<bool>();
  }
  LOOM_ASSIGN_OR_RETURN(GrammarDefinition definition, JsonSchemaGrammar(schema->dump()));
  // Rule names with a character JSON Schema rule names never hold, so nothing collides.
  const std::string document = definition.root;
  std::vector<GrammarExprPtr> framed;
  if (!begin.empty()) framed.push_back(LiteralExpr(begin));
  framed.push_back(RuleRefExpr(document));
  if (!end.empty()) framed.push_back(LiteralExpr(end));
  definition.SetRule("tool call$", SequenceExpr(std::move(framed)));
  if (repeat) {
    std::vector<GrammarExprPtr> next;
    if (!separator.empty()) next.push_back(LiteralExpr(separator));
    next.push_back(RuleRefExpr("tool call$"));
    definition.SetRule("tool calls$",
                       SequenceExpr({RuleRefExpr("tool call$"),
                                     RepeatExpr(SequenceExpr(std::move(next)), 0, -1)}));
    definition.root = "tool calls$";
  } else {
    definition.root = "tool call$";
  }
  return definition;
}

}  // namespace loom::common
