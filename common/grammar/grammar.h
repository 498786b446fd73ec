#pragma once

// A context-free grammar over bytes, the form every structured-output constraint
// (JSON Schema, regex, choice list, GBNF) is compiled to before decoding.
//
// Front ends build a GrammarDefinition: named rules whose bodies are GrammarExpr trees
// (literals, Unicode character classes, rule references, sequences, choices and bounded
// or unbounded repetition). Grammar::Compile lowers it to flat byte-level rules: every
// character class becomes alternatives of UTF-8 byte-range sequences, every repetition a
// right-recursive helper rule (matched without stack growth, see GrammarMatcher), and
// rejects what the matcher cannot run (undefined rules, left recursion) naming the rule.

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace loom::common {

/// How deep groups may nest in a regex or GBNF text: the parsers and the lowering recurse
/// per group (a request nested far deeper overflowed the coordinator's stack). Repetition
/// operators cannot be stacked on one item either (`a**`, as Python's re and llama.cpp
/// refuse it). Rule references nest without a limit: the matcher expands them iteratively.
inline constexpr int kMaxGrammarNesting = 256;

struct GrammarExpr;
using GrammarExprPtr = std::shared_ptr<const GrammarExpr>;

/// One node of a rule body. Immutable once built (shared between rules).
struct GrammarExpr {
  enum class Kind { kEmpty, kLiteral, kCharClass, kRuleRef, kSequence, kChoice, kRepeat };
  Kind kind = Kind::kEmpty;
  /// kLiteral: the bytes to match; kRuleRef: the rule's name.
  std::string text;
  /// kCharClass: inclusive code point ranges (any order, may overlap).
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  /// kCharClass: matches every code point outside `ranges` instead.
  bool negated = false;
  /// kSequence, kChoice: the parts; kRepeat: the one repeated expression.
  std::vector<GrammarExprPtr> children;
  /// kRepeat: between min_count and max_count matches; max_count -1 is unbounded.
  int32_t min_count = 0;
  int32_t max_count = -1;
};

/// Builders for GrammarExpr trees.
GrammarExprPtr EmptyExpr();
GrammarExprPtr LiteralExpr(std::string bytes);
GrammarExprPtr CharClassExpr(std::vector<std::pair<uint32_t, uint32_t>> ranges,
                             bool negated = false);
GrammarExprPtr RuleRefExpr(std::string name);
GrammarExprPtr SequenceExpr(std::vector<GrammarExprPtr> parts);
GrammarExprPtr ChoiceExpr(std::vector<GrammarExprPtr> alternatives);
GrammarExprPtr RepeatExpr(GrammarExprPtr body, int32_t min_count, int32_t max_count);

/// Named rules and the rule a document must match.
struct GrammarDefinition {
  std::vector<std::pair<std::string, GrammarExprPtr>> rules;  // names unique
  std::string root = "root";

  /// Adds or replaces rule `name`. Constant time (a grammar of 100,000 rules once took
  /// 17 s to parse through linear look-ups).
  void SetRule(const std::string& name, GrammarExprPtr body);
  bool HasRule(const std::string& name) const;

 private:
  // Position of each name in `rules`; rebuilt when `rules` was changed directly.
  const absl::flat_hash_map<std::string, size_t>& Index() const;
  mutable absl::flat_hash_map<std::string, size_t> index_;
};

/// One element of a lowered alternative.
struct GrammarElement {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  /// kBytes: index into Grammar::byte_sets(); kRule: rule index.
  int32_t value = 0;
};

/// A compiled byte-level grammar. Immutable; thread-safe to share.
class Grammar {
 public:
  /// Lowers `definition`. InvalidArgument naming the construct for an undefined rule, a
  /// missing root, a left-recursive rule or a repetition of something that can match
  /// nothing (both would loop the matcher), or a grammar beyond the size limit.
  static absl::StatusOr<std::shared_ptr<const Grammar>> Compile(
      const GrammarDefinition& definition);

  /// All elements; every alternative is a run ending in a kEnd element.
  const std::vector<GrammarElement>& elements() const { return elements_; }
  /// Per rule: the element index where each of its alternatives starts.
  const std::vector<std::vector<int32_t>>& rule_alternatives() const {
    return rule_alternatives_;
  }
  const std::vector<std::string>& rule_names() const { return rule_names_; }
  const std::vector<std::bitset<256>>& byte_sets() const { return byte_sets_; }
  int32_t root_rule() const { return root_rule_; }

 private:
  friend class GrammarLowering;
  Grammar() = default;

  std::vector<GrammarElement> elements_;
  std::vector<std::vector<int32_t>> rule_alternatives_;
  std::vector<std::string> rule_names_;
  std::vector<std::bitset<256>> byte_sets_;
  int32_t root_rule_ = 0;
};

}  // namespace loom::common
