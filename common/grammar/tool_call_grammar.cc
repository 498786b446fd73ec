#include "common/grammar/tool_call_grammar.h"

#include <algorithm>
#include <cstdint>
#include <set>
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

// Rules "<name>I" (I = how many characters of `trigger` the text so far ends with): every
// text in which `trigger` does not occur (a KMP automaton over its characters).
void AddTextWithout(const std::string& trigger, GrammarDefinition& definition,
                    const std::string& name = "text without$") {
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
  const auto state = [&name](int i) { return name + std::to_string(i); };
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

// `expr` with every rule it references renamed to `prefix` + name.
GrammarExprPtr Renamed(const GrammarExprPtr& expr, const std::string& prefix) {
  std::vector<GrammarExprPtr> children;
  for (const GrammarExprPtr& child : expr->children) children.push_back(Renamed(child, prefix));
  switch (expr->kind) {
    case GrammarExpr::Kind::kRuleRef:
      return RuleRefExpr(prefix + expr->text);
    case GrammarExpr::Kind::kSequence:
      return SequenceExpr(std::move(children));
    case GrammarExpr::Kind::kChoice:
      return ChoiceExpr(std::move(children));
    case GrammarExpr::Kind::kRepeat:
      return RepeatExpr(std::move(children[0]), expr->min_count, expr->max_count);
    default:
      return expr;
  }
}

// A string parameter's fixed values (its enum or const, all strings), written bare; empty
// for another schema.
std::vector<std::string> BareStringChoices(const Json& schema) {
  std::vector<std::string> choices;
  if (!schema.is_object()) return choices;
  if (auto type = schema.find("type");
      type != schema.end() && *type != "string" && *type != Json::array({"string"})) {
    return choices;
  }
  Json values = Json::array();
  if (auto found = schema.find("enum"); found != schema.end() && found->is_array()) values = *found;
  if (auto found = schema.find("const"); found != schema.end()) values = Json::array({*found});
  for (const Json& value : values) {
    if (!value.is_string()) return {};
    choices.push_back(value.get<std::string>());
  }
  return choices;
}

// Whether a parameter's value is written as bare text: a string without a fixed set of
// values, or a schema that says nothing of the value's type (the call parsers read such a
// text as JSON where it parses, else as a string).
bool BareTextValue(const Json& schema) {
  if (!schema.is_object()) return true;
  for (const char* keyword :
       {"enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "items"}) {
    if (schema.contains(keyword)) return false;
  }
  auto type = schema.find("type");
  return type == schema.end() || *type == "string" || *type == Json::array({"string"});
}

// `text` as a literal, each newline in it optional where `optional_newlines` (GLM-4.7 writes
// GLM-4.5's calls without them).
GrammarExprPtr Text(const std::string& text, bool optional_newlines) {
  if (!optional_newlines || text.find('\n') == std::string::npos) return LiteralExpr(text);
  std::vector<GrammarExprPtr> parts;
  size_t from = 0;
  for (size_t newline = text.find('\n'); newline != std::string::npos;
       from = newline + 1, newline = text.find('\n', from)) {
    if (newline > from) parts.push_back(LiteralExpr(text.substr(from, newline - from)));
    parts.push_back(RepeatExpr(LiteralExpr("\n"), 0, 1));
  }
  if (from < text.size()) parts.push_back(LiteralExpr(text.substr(from)));
  return SequenceExpr(std::move(parts));
}

// The call rule of an "xml" spec: `begin` NAME name_end (key_begin KEY key_end VALUE
// value_end)* `end`, the tools' names and their parameters' keys as literals, the keys in
// any order, each value one of a string's fixed values, bare text without value_end
// (BareTextValue), or JSON of its schema.
// A call's parameters with at most this many take them in any order (2^n rules); with more,
// in the schema's order.
constexpr size_t kXmlAnyOrderParameters = 6;

// One call's `parameters` (each a key with its value), each written at most once and every
// `required` one written: in any order for up to kXmlAnyOrderParameters of them, a rule
// `name` + " " + the set written so far (a bit per parameter) offering the others and, once
// the required ones are in, the end; beyond that, in the schema's order.
GrammarExprPtr XmlParameters(const std::vector<GrammarExprPtr>& parameters,
                             const std::vector<bool>& required, const std::string& name,
                             GrammarDefinition& definition) {
  const size_t n = parameters.size();
  if (n > kXmlAnyOrderParameters) {
    std::vector<GrammarExprPtr> ordered;
    for (size_t p = 0; p < n; ++p) {
      ordered.push_back(required[p] ? parameters[p] : RepeatExpr(parameters[p], 0, 1));
    }
    return SequenceExpr(std::move(ordered));
  }
  uint32_t must = 0;
  for (size_t p = 0; p < n; ++p) must |= required[p] ? 1u << p : 0u;
  for (uint32_t written = 0; written < (1u << n); ++written) {
    std::vector<GrammarExprPtr> next;
    if ((written & must) == must) next.push_back(EmptyExpr());
    for (size_t p = 0; p < n; ++p) {
      if ((written & (1u << p)) != 0) continue;
      next.push_back(SequenceExpr(
          {parameters[p], RuleRefExpr(name + " " + std::to_string(written | (1u << p)))}));
    }
    definition.SetRule(name + " " + std::to_string(written), ChoiceExpr(std::move(next)));
  }
  return RuleRefExpr(name + " 0");
}

absl::Status AddXmlCall(const Json& xml, const std::string& begin, const std::string& end,
                        bool optional_newlines, GrammarDefinition& definition) {
  LOOM_ASSIGN_OR_RETURN(std::string name_end, StringField(xml, "name_end"));
  LOOM_ASSIGN_OR_RETURN(std::string key_begin, StringField(xml, "key_begin"));
  LOOM_ASSIGN_OR_RETURN(std::string key_end, StringField(xml, "key_end"));
  LOOM_ASSIGN_OR_RETURN(std::string value_end, StringField(xml, "value_end"));
  if (value_end.empty() || std::any_of(value_end.begin(), value_end.end(), [](char c) {
        return static_cast<unsigned char>(c) >= 0x80;
      })) {
    return absl::InvalidArgumentError("tool-call grammar: 'value_end' must be ASCII, not empty");
  }
  auto tools = xml.find("tools");
  if (tools == xml.end() || !tools->is_array() || tools->empty()) {
    return absl::InvalidArgumentError("tool-call grammar: 'xml.tools' must be a non-empty array");
  }
  // With optional newlines a value stops at value_end's text without them.
  std::string value_stop = value_end;
  if (optional_newlines) std::erase(value_stop, '\n');
  if (value_stop.empty()) {
    return absl::InvalidArgumentError("tool-call grammar: 'value_end' must not be only newlines");
  }
  AddTextWithout(value_stop, definition, "xml text$");
  std::vector<GrammarExprPtr> calls;
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& tool = (*tools)[i];
    if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string()) {
      return absl::InvalidArgumentError("tool-call grammar: each of 'xml.tools' needs a name");
    }
    std::vector<GrammarExprPtr> parameters;
    std::vector<bool> required;
    Json properties = Json::object();
    std::set<std::string> required_names;
    if (auto schema = tool.find("parameters"); schema != tool.end() && schema->is_object()) {
      if (auto found = schema->find("properties"); found != schema->end() && found->is_object()) {
        properties = *found;
      }
      if (auto found = schema->find("required"); found != schema->end() && found->is_array()) {
        for (const Json& key : *found) {
          if (!key.is_string()) {
            return absl::InvalidArgumentError(
                "tool-call grammar: a tool's 'required' must list parameter names");
          }
          required_names.insert(key.get<std::string>());
        }
      }
    }
    size_t j = 0;
    for (const auto& [key, schema] : properties.items()) {
      GrammarExprPtr value = RuleRefExpr("xml text$0");
      if (std::vector<std::string> choices = BareStringChoices(schema); !choices.empty()) {
        std::vector<GrammarExprPtr> literals;
        for (std::string& choice : choices) literals.push_back(LiteralExpr(std::move(choice)));
        value = ChoiceExpr(std::move(literals));
      } else if (!BareTextValue(schema)) {
        LOOM_ASSIGN_OR_RETURN(GrammarDefinition own, JsonSchemaGrammar(schema.dump()));
        const std::string prefix = "xml " + std::to_string(i) + " " + std::to_string(j) + "$";
        for (const auto& [name, body] : own.rules)
          definition.SetRule(prefix + name, Renamed(body, prefix));
        value = RuleRefExpr(prefix + own.root);
      }
      parameters.push_back(SequenceExpr({Text(key_begin + key + key_end, optional_newlines), value,
                                         Text(value_end, optional_newlines)}));
      required.push_back(required_names.erase(key) > 0);
      ++j;
    }
    // A required name without a property (JSON Schema allows it) cannot be written here,
    // where only declared keys are: it is not required of the call.
    std::vector<GrammarExprPtr> call = {
        Text(tool["name"].get<std::string>() + name_end, optional_newlines)};
    if (!parameters.empty()) {
      call.push_back(
          XmlParameters(parameters, required, "xml " + std::to_string(i) + " keys", definition));
    }
    calls.push_back(SequenceExpr(std::move(call)));
  }
  std::vector<GrammarExprPtr> framed;
  if (!begin.empty()) framed.push_back(Text(begin, optional_newlines));
  framed.push_back(ChoiceExpr(std::move(calls)));
  if (!end.empty()) framed.push_back(Text(end, optional_newlines));
  definition.SetRule("tool call$", SequenceExpr(std::move(framed)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GrammarDefinition> ToolCallGrammar(std::string_view spec_json) {
  LOOM_RETURN_IF_ERROR(CheckJsonNestingDepth(spec_json, "the tool-call grammar's spec"));
  const Json spec = Json::parse(spec_json, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded() || !spec.is_object()) {
    return absl::InvalidArgumentError("tool-call grammar: the spec must be a JSON object");
  }
  auto schema = spec.find("schema");
  auto xml = spec.find("xml");
  if (xml == spec.end() &&
      (schema == spec.end() || !(schema->is_object() || schema->is_boolean()))) {
    return absl::InvalidArgumentError(
        "tool-call grammar: 'schema' must be a JSON Schema object (or 'xml' given)");
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
  // Rule names with a character JSON Schema rule names never hold, so nothing collides.
  GrammarDefinition definition;
  bool optional_newlines = false;
  if (xml != spec.end()) {
    if (!xml->is_object()) {
      return absl::InvalidArgumentError("tool-call grammar: 'xml' must be an object");
    }
    if (auto it = xml->find("optional_newlines"); it != xml->end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return absl::InvalidArgumentError(
            "tool-call grammar: 'xml.optional_newlines' must be a boolean");
      }
      optional_newlines = it->get<bool>();
    }
    LOOM_RETURN_IF_ERROR(AddXmlCall(*xml, begin, end, optional_newlines, definition));
  } else {
    LOOM_ASSIGN_OR_RETURN(definition, JsonSchemaGrammar(schema->dump()));
    const std::string document = definition.root;
    std::vector<GrammarExprPtr> framed;
    if (!begin.empty()) framed.push_back(LiteralExpr(begin));
    framed.push_back(RuleRefExpr(document));
    if (!end.empty()) framed.push_back(LiteralExpr(end));
    definition.SetRule("tool call$", SequenceExpr(std::move(framed)));
  }
  if (repeat) {
    std::vector<GrammarExprPtr> next;
    if (!separator.empty()) next.push_back(Text(separator, optional_newlines));
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
