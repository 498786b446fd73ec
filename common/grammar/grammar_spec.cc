#include "common/grammar/grammar_spec.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/gbnf_parser.h"
#include "common/grammar/grammar_matcher.h"
#include "common/grammar/json_schema_grammar.h"
#include "common/grammar/regex_grammar.h"
#include "common/grammar/tool_call_grammar.h"
#include "common/json_depth.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loom::common {

std::string GrammarKindName(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kJsonObject: return "json_object";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kChoice: return "choice";
    case GrammarKind::kGbnf: return "grammar";
    case GrammarKind::kToolCalls: return "tool_calls";
  }
  return "unknown";
}

absl::StatusOr<GrammarKind> ParseGrammarKind(std::string_view name) {
  for (GrammarKind kind : {GrammarKind::kJsonSchema, GrammarKind::kJsonObject, GrammarKind::kRegex,
                           GrammarKind::kChoice, GrammarKind::kGbnf, GrammarKind::kToolCalls}) {
    if (GrammarKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown grammar kind '", std::string(name), "'"));
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileGrammarSpec(const GrammarSpec& spec) {
  absl::StatusOr<GrammarDefinition> definition;
  switch (spec.kind) {
    case GrammarKind::kJsonSchema:
      definition = JsonSchemaGrammar(spec.text);
      break;
    case GrammarKind::kJsonObject:
      definition = JsonObjectGrammar();
      break;
    case GrammarKind::kRegex:
      // Only the empty output would match: refused as the HTTP API refuses it.
      if (spec.text.empty()) return absl::InvalidArgumentError("the regex is empty");
      definition = RegexGrammar(spec.text);
      break;
    case GrammarKind::kGbnf:
      definition = ParseGbnf(spec.text);
      break;
    case GrammarKind::kToolCalls:
      definition = ToolCallGrammar(spec.text);
      break;
    case GrammarKind::kChoice: {
      LOOM_RETURN_IF_ERROR(CheckJsonNestingDepth(spec.text, "the choice list"));
      nlohmann::json choices = nlohmann::json::parse(spec.text, nullptr, false);
      if (choices.is_discarded() || !choices.is_array() || choices.empty()) {
        return absl::InvalidArgumentError("choice list must be a non-empty JSON array of strings");
      }
      std::vector<GrammarExprPtr> alts;
      for (const auto& c : choices) {
        if (!c.is_string() || c.get<std::string>().empty()) {
          return absl::InvalidArgumentError("choice list entries must be non-empty strings");
        }
        alts.push_back(LiteralExpr(c.get<std::string>()));
      }
      GrammarDefinition d;
      d.SetRule("root", ChoiceExpr(std::move(alts)));
      definition = std::move(d);
      break;
    }
  }
  if (!definition.ok()) return definition.status();
  return Grammar::Compile(*definition);
}

absl::StatusOr<std::shared_ptr<const Grammar>> GrammarCache::Get(const GrammarSpec& spec) {
  const std::string key = absl::StrCat(GrammarKindName(spec.kind), "\n", spec.text);
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->second;
    }
  }
  // Compiled outside the lock: a large schema does not hold up other look-ups.
  auto grammar = CompileGrammarSpec(spec);
  if (!grammar.ok()) return grammar.status();
  // A grammar whose start is already past the matcher's bounds could only end its
  // sequences at once: the client's error, named here.
  LOOM_RETURN_IF_ERROR(GrammarAutomaton::CheckStartFits(*grammar));
  absl::MutexLock lock(&mu_);
  ++misses_;
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, *grammar);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return *grammar;
}

GrammarCache& SharedGrammarCache() {
  static GrammarCache* const cache = new GrammarCache(256);
  return *cache;
}

int64_t GrammarCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

int64_t GrammarCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

}  // namespace loom::common
