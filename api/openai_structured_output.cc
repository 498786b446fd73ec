#include "api/openai_structured_output.h"

#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"
#include "api/openai_request.h"
#include "common/grammar/grammar_spec.h"
#include "common/json_depth.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

// Ordered: a schema's properties keep the order the client wrote them in, which is the
// order the constrained output lists them.
using Json = nlohmann::ordered_json;

struct Constraint {
  std::string param;  // where it came from, for errors
  common::GrammarSpec spec;
};

absl::Status Schema(const Json& value, const std::string& param, std::vector<Constraint>& out) {
  if (value.is_string()) {  // a schema sent as JSON text
    if (absl::Status depth = common::CheckJsonNestingDepth(value.get_ref<const std::string&>(),
                                                           absl::StrCat("'", param, "'"));
        !depth.ok()) {
      return InvalidOpenAiParam(param, std::string(depth.message()));
    }
    Json parsed = Json::parse(value.get<std::string>(), nullptr, false);
    if (parsed.is_discarded())
      return InvalidOpenAiParam(param, absl::StrFormat("'%s' is not valid JSON", param));
    out.push_back({param, {common::GrammarKind::kJsonSchema, parsed.dump()}});
    return absl::OkStatus();
  }
  if (!value.is_object() && !value.is_boolean()) {
    return InvalidOpenAiParam(param, absl::StrFormat("'%s' must be a JSON Schema object", param));
  }
  out.push_back({param, {common::GrammarKind::kJsonSchema, value.dump()}});
  return absl::OkStatus();
}

absl::Status Text(const Json& value, const std::string& param, common::GrammarKind kind,
                  std::vector<Constraint>& out) {
  if (!value.is_string() || value.get<std::string>().empty()) {
    return InvalidOpenAiParam(param, absl::StrFormat("'%s' must be a non-empty string", param));
  }
  out.push_back({param, {kind, value.get<std::string>()}});
  return absl::OkStatus();
}

absl::Status Choice(const Json& value, const std::string& param, std::vector<Constraint>& out) {
  if (!value.is_array() || value.empty()) {
    return InvalidOpenAiParam(param,
                              absl::StrFormat("'%s' must be a non-empty list of strings", param));
  }
  for (const Json& item : value) {
    if (!item.is_string() || item.get<std::string>().empty()) {
      return InvalidOpenAiParam(
          param, absl::StrFormat("'%s' must be a non-empty list of non-empty strings", param));
    }
  }
  out.push_back({param, {common::GrammarKind::kChoice, value.dump()}});
  return absl::OkStatus();
}

const Json* Field(const Json& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

absl::Status ResponseFormat(const Json& format, std::vector<Constraint>& out) {
  if (!format.is_object())
    return InvalidOpenAiParam("response_format", "'response_format' must be an object");
  const Json* type = Field(format, "type");
  if (type == nullptr || !type->is_string()) {
    return InvalidOpenAiParam("response_format", "'response_format' needs a 'type'");
  }
  const std::string kind = type->get<std::string>();
  if (kind == "text") return absl::OkStatus();
  if (kind == "json_object") {
    out.push_back({"response_format", {common::GrammarKind::kJsonObject, ""}});
    return absl::OkStatus();
  }
  if (kind != "json_schema") {
    return InvalidOpenAiParam(
        "response_format",
        absl::StrFormat("'response_format' type '%s' is not one of text, json_object, json_schema",
                        kind));
  }
  const Json* spec = Field(format, "json_schema");
  if (spec == nullptr || !spec->is_object()) {
    return InvalidOpenAiParam("response_format",
                              "'response_format' of type json_schema needs a 'json_schema' object");
  }
  if (const Json* strict = Field(*spec, "strict"); strict != nullptr && !strict->is_boolean()) {
    return InvalidOpenAiParam("response_format",
                              "'response_format.json_schema.strict' must be a boolean");
  }
  // strict or not, the output follows the schema exactly (decoding is constrained either way).
  const Json* schema = Field(*spec, "schema");
  if (schema == nullptr) {
    return InvalidOpenAiParam("response_format", "'response_format.json_schema' needs a 'schema'");
  }
  return Schema(*schema, "response_format", out);
}

}  // namespace

absl::Status ParseStructuredOutput(const Json& parsed, loom::v1::SamplingParams& sampling) {
  std::vector<Constraint> found;
  if (const Json* format = Field(parsed, "response_format")) {
    if (absl::Status s = ResponseFormat(*format, found); !s.ok()) return s;
  }
  if (const Json* v = Field(parsed, "guided_json")) {
    if (absl::Status s = Schema(*v, "guided_json", found); !s.ok()) return s;
  }
  if (const Json* v = Field(parsed, "guided_regex")) {
    if (absl::Status s = Text(*v, "guided_regex", common::GrammarKind::kRegex, found); !s.ok()) return s;
  }
  if (const Json* v = Field(parsed, "guided_choice")) {
    if (absl::Status s = Choice(*v, "guided_choice", found); !s.ok()) return s;
  }
  if (const Json* v = Field(parsed, "guided_grammar")) {
    if (absl::Status s = Text(*v, "guided_grammar", common::GrammarKind::kGbnf, found); !s.ok()) return s;
  }
  if (const Json* so = Field(parsed, "structured_outputs")) {
    if (!so->is_object())
      return InvalidOpenAiParam("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [key, value] : so->items()) {
      if (value.is_null()) continue;
      const std::string param = "structured_outputs." + key;
      absl::Status s;
      if (key == "json") s = Schema(value, param, found);
      else if (key == "regex") s = Text(value, param, common::GrammarKind::kRegex, found);
      else if (key == "choice") s = Choice(value, param, found);
      else if (key == "grammar") s = Text(value, param, common::GrammarKind::kGbnf, found);
      else if (key == "json_object") {
        if (!value.is_boolean())
          s = InvalidOpenAiParam(param, "'structured_outputs.json_object' must be a boolean");
        else if (value.get<bool>()) found.push_back({param, {common::GrammarKind::kJsonObject, ""}});
      } else {
        s = InvalidOpenAiParam(param,
                               absl::StrFormat("'structured_outputs' has no field '%s'", key));
      }
      if (!s.ok()) return s;
    }
  }
  if (found.empty()) return absl::OkStatus();
  if (found.size() > 1) {
    return InvalidOpenAiParam(found[1].param,
                              absl::StrFormat("'%s' and '%s' both constrain the output; give one",
                                              found[0].param, found[1].param));
  }
  const Constraint& constraint = found[0];
  absl::StatusOr<std::shared_ptr<const common::Grammar>> compiled =
      common::SharedGrammarCache().Get(constraint.spec);
  if (!compiled.ok()) {
    return InvalidOpenAiParam(
        constraint.param,
        absl::StrFormat("'%s' cannot be used: %s", constraint.param, compiled.status().message()));
  }
  sampling.mutable_grammar()->set_kind(common::GrammarKindName(constraint.spec.kind));
  sampling.mutable_grammar()->set_text(constraint.spec.text);
  return absl::OkStatus();
}

}  // namespace loom::api
