#include "common/grammar/tool_call_grammar.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/grammar/json_schema_grammar.h"
#include "common/json_depth.h"
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

// Rules "text without$I" (I = how many characters of `trigger` the text so far ends with):
// every text in which `trigger` does not occur (a KMP automaton over its characters).
void AddTextWithout(const std::string& trigger, GrammarDefinition& definition) {
  const int n = static_cast<int>(trigger.size());
  std::vector<int> fail(n + 1, 0);  // fail[i]: longest proper border of trigger[0, i)
  for (int i = 1, k = 0; i < n; ++i) {
    while (k > 0 && trigger[i] != trigger[k]) k = fail[k];
    if (trigger[i] == trigger[k]) ++k;
    fail[i + 1] = k;
  }
  std::string alphabet;
  for (char c : trigger) {
    if (alphabet.find(c) == std::string::npos) alphabet += c;
  }
  std::vector<std::pair<uint32_t, uint32_t>> letters;
  for (char c : alphabet)
    letters.emplace_back(static_cast<unsigned char>(c), static_cast<unsigned char>(c));
  const auto state = [](int i) { return "text without$" + std::to_string(i); };
  for (int i = 0; i < n; ++i) {
    std::vector<GrammarExprPtr> next = {EmptyExpr()};
    for (char c : alphabet) {
      int j = i;
      while (j > 0 && trigger[j] != c) j = fail[j];
      if (trigger[j] == c) ++j;
      if (j == n) continue;  // the trigger itself: only the calls may write it
      next.push_back(SequenceExpr({LiteralExpr(std::string(1, c)), RuleRefExpr(state(j))}));
    }
    next.push_back(SequenceExpr({CharClassExpr(letters, /*negated=*/true), RuleRefExpr(state(0))}));
    definition.SetRule(state(i), ChoiceExpr(std::move(next)));
  }
}

// Rules "text unlike$I": every text that does not start with `trigger` (I of its
// characters matched so far), the empty one included.
void AddTextNotStartingWith(const std::string& trigger, GrammarDefinition& definition) {
  const int n = static_cast<int>(trigger.size());
  const auto state = [](int i) { return "text unlike$" + std::to_string(i); };
  definition.SetRule("any text$", RepeatExpr(CharClassExpr({}, /*negated=*/true), 0, -1));
  for (int i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(trigger[i]);
    std::vector<GrammarExprPtr> next = {
        EmptyExpr(),
        SequenceExpr({CharClassExpr({{c, c}}, /*negated=*/true), RuleRefExpr("any text$")})};
    if (i + 1 < n)
      next.push_back(
          SequenceExpr({LiteralExpr(std::string(1, trigger[i])), RuleRefExpr(state(i + 1))}));
    definition.SetRule(state(i), ChoiceExpr(std::move(next)));
  }
}

}  // namespace

absl::StatusOr<GrammarDefinition> ToolCallGrammar(std::string_view spec_json) {
  LOOM_RETURN_IF_ERROR(CheckJsonNestingDepth(spec_json, "the tool-call grammar's spec"));
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
  LOOM_ASSIGN_OR_RETURN(std::string trigger, StringField(spec, "trigger"));
  if (trigger.empty()) return definition;
  // tool_choice "auto": free text, and once the reply writes the trigger, calls.
  for (char c : trigger) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      return absl::InvalidArgumentError("tool-call grammar: 'trigger' must be ASCII");
    }
  }
  LOOM_ASSIGN_OR_RETURN(std::string trigger_at, StringField(spec, "trigger_at"));
  const GrammarExprPtr calls = RuleRefExpr(definition.root);
  const GrammarExprPtr blank = RepeatExpr(CharClassExpr({{' ', ' '}, {'\n', '\n'}}), 0, -1);
  if (trigger_at == "start") {
    AddTextNotStartingWith(trigger, definition);
    definition.SetRule(
        "auto$", ChoiceExpr({SequenceExpr({blank, calls, blank}), RuleRefExpr("text unlike$0")}));
  } else if (trigger_at.empty() || trigger_at == "anywhere") {
    AddTextWithout(trigger, definition);
    definition.SetRule("auto$", SequenceExpr({RuleRefExpr("text without$0"),
                                              RepeatExpr(SequenceExpr({calls, blank}), 0, 1)}));
  } else {
    return absl::InvalidArgumentError(
        "tool-call grammar: 'trigger_at' must be \"start\" or \"anywhere\"");
  }
  definition.root = "auto$";
  return definition;
}

}  // namespace loom::common
