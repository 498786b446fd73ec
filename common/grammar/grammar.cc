#include "common/grammar/grammar.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/unicode.h"

namespace loom::common {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxElements = 4'000'000;

GrammarExprPtr Make(GrammarExpr expr) { return std::make_shared<const GrammarExpr>(std::move(expr)); }

// Sorted, merged, surrogate-free code point ranges of a class.
Ranges Normalize(Ranges ranges, bool negated) {
  for (auto& r : ranges) {
    r.second = std::min(r.second, kMaxCodePoint);
  }
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [](const auto& r) { return r.first > r.second; }),
               ranges.end());
  std::sort(ranges.begin(), ranges.end());
  Ranges merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  if (negated) {
    Ranges complement;
    uint32_t next = 0;
    for (const auto& r : merged) {
      if (r.first > next) complement.emplace_back(next, r.first - 1);
      next = r.second + 1;
    }
    if (next <= kMaxCodePoint) complement.emplace_back(next, kMaxCodePoint);
    merged = std::move(complement);
  }
  Ranges out;  // without the surrogates, which UTF-8 cannot encode
  for (const auto& r : merged) {
    if (r.second < 0xD800 || r.first > 0xDFFF) {
      out.push_back(r);
      continue;
    }
    if (r.first < 0xD800) out.emplace_back(r.first, 0xD7FF);
    if (r.second > 0xDFFF) out.emplace_back(0xE000, r.second);
  }
  return out;
}

using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] into ranges whose UTF-8 encodings are byte-wise ranges (the method of
// Rust's utf8-ranges).
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
  if (lo > hi) return;
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && hi > boundary) {
      SplitUtf8(lo, boundary, out);
      SplitUtf8(boundary + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t mask = (1u << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        SplitUtf8(lo, lo | mask, out);
        SplitUtf8((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        SplitUtf8(lo, (hi & ~mask) - 1, out);
        SplitUtf8(hi & ~mask, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  AppendUtf8(lo, a);
  AppendUtf8(hi, b);
  ByteRangeSeq seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  }
  out.push_back(std::move(seq));
}

}  // namespace

GrammarExprPtr EmptyExpr() { return Make({}); }

GrammarExprPtr LiteralExpr(std::string bytes) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kLiteral;
  e.text = std::move(bytes);
  return Make(std::move(e));
}

GrammarExprPtr CharClassExpr(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kCharClass;
  e.ranges = std::move(ranges);
  e.negated = negated;
  return Make(std::move(e));
}

GrammarExprPtr RuleRefExpr(std::string name) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kRuleRef;
  e.text = std::move(name);
  return Make(std::move(e));
}

GrammarExprPtr SequenceExpr(std::vector<GrammarExprPtr> parts) {
  if (parts.size() == 1) return parts[0];
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kSequence;
  e.children = std::move(parts);
  return Make(std::move(e));
}

GrammarExprPtr ChoiceExpr(std::vector<GrammarExprPtr> alternatives) {
  if (alternatives.size() == 1) return alternatives[0];
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kChoice;
  e.children = std::move(alternatives);
  return Make(std::move(e));
}

GrammarExprPtr RepeatExpr(GrammarExprPtr body, int32_t min_count, int32_t max_count) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kRepeat;
  e.children = {std::move(body)};
  e.min_count = min_count;
  e.max_count = max_count;
  return Make(std::move(e));
}

const absl::flat_hash_map<std::string, size_t>& GrammarDefinition::Index() const {
  bool stale = index_.size() != rules.size();
  if (!stale && !rules.empty()) {
    // A spot check of the newest rule: rules replaced wholesale by as many others are
    // noticed too.
    auto it = index_.find(rules.back().first);
    stale = it == index_.end() || it->second != rules.size() - 1;
  }
  if (stale) {
    index_.clear();
    for (size_t i = 0; i < rules.size(); ++i) index_.try_emplace(rules[i].first, i);
  }
  return index_;
}

void GrammarDefinition::SetRule(const std::string& name, GrammarExprPtr body) {
  const auto& index = Index();
  if (auto it = index.find(name); it != index.end()) {
    rules[it->second].second = std::move(body);
    return;
  }
  rules.emplace_back(name, std::move(body));
  index_.emplace(name, rules.size() - 1);
}

bool GrammarDefinition::HasRule(const std::string& name) const { return Index().contains(name); }

// Lowers GrammarExpr rules into the flat element form.
class GrammarLowering {
 public:
  explicit GrammarLowering(const GrammarDefinition& definition) : definition_(definition) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Run() {
    for (const auto& [name, body] : definition_.rules) {
      if (rule_index_.contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat("grammar rule '", name, "' is defined twice"));
      }
      NewRule(name);
    }
    auto root = rule_index_.find(definition_.root);
    if (root == rule_index_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar has no root rule '", definition_.root, "'"));
    }
    for (size_t i = 0; i < definition_.rules.size(); ++i) {
      std::vector<std::vector<GrammarElement>> alts;
      if (absl::Status s = LowerAlternatives(*definition_.rules[i].second,
                                             definition_.rules[i].first, alts);
          !s.ok()) {
        return s;
      }
      pending_[i] = std::move(alts);
    }
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    auto grammar = std::shared_ptr<Grammar>(new Grammar());
    grammar->root_rule_ = root->second;
    grammar->rule_names_ = names_;
    grammar->byte_sets_ = byte_sets_;
    for (const auto& alts : pending_) {
      std::vector<int32_t> starts;
      for (const auto& alt : alts) {
        starts.push_back(static_cast<int32_t>(grammar->elements_.size()));
        grammar->elements_.insert(grammar->elements_.end(), alt.begin(), alt.end());
        grammar->elements_.push_back({GrammarElement::Kind::kEnd, 0});
      }
      grammar->rule_alternatives_.push_back(std::move(starts));
    }
    return std::shared_ptr<const Grammar>(std::move(grammar));
  }

 private:
  using Alt = std::vector<GrammarElement>;

  int32_t NewRule(const std::string& name) {
    const int32_t id = static_cast<int32_t>(names_.size());
    names_.push_back(name);
    rule_index_[name] = id;
    pending_.emplace_back();
    return id;
  }

  int32_t HelperRule(const std::string& base, std::vector<Alt> alts) {
    const int32_t id = static_cast<int32_t>(names_.size());
    names_.push_back(absl::StrCat(base, "#", id));
    pending_.push_back(std::move(alts));
    return id;
  }

  int32_t ByteSet(const std::bitset<256>& set) {
    const std::string key = set.to_string();
    auto it = byte_set_index_.find(key);
    if (it != byte_set_index_.end()) return it->second;
    const int32_t id = static_cast<int32_t>(byte_sets_.size());
    byte_sets_.push_back(set);
    byte_set_index_[key] = id;
    return id;
  }

  absl::Status CheckSize(size_t added = 1) {
    lowered_ += added;
    if (lowered_ > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grammar is too large (more than ", kMaxElements, " elements after expanding repetitions)"));
    }
    return absl::OkStatus();
  }

  absl::Status LowerAlternatives(const GrammarExpr& e, const std::string& base,
                                 std::vector<Alt>& alts) {
    if (e.kind == GrammarExpr::Kind::kChoice) {
      for (const auto& child : e.children) {
        Alt alt;
        if (absl::Status s = LowerSequence(*child, base, alt); !s.ok()) return s;
        alts.push_back(std::move(alt));
      }
      return absl::OkStatus();
    }
    Alt alt;
    if (absl::Status s = LowerSequence(e, base, alt); !s.ok()) return s;
    alts.push_back(std::move(alt));
    return absl::OkStatus();
  }

  absl::Status LowerSequence(const GrammarExpr& e, const std::string& base, Alt& out) {
    switch (e.kind) {
      case GrammarExpr::Kind::kEmpty:
        return absl::OkStatus();
      case GrammarExpr::Kind::kLiteral:
        for (unsigned char c : e.text) {
          std::bitset<256> set;
          set.set(c);
          out.push_back({GrammarElement::Kind::kBytes, ByteSet(set)});
          if (absl::Status s = CheckSize(); !s.ok()) return s;
        }
        return absl::OkStatus();
      case GrammarExpr::Kind::kCharClass:
        return LowerCharClass(e, base, out);
      case GrammarExpr::Kind::kRuleRef: {
        auto it = rule_index_.find(e.text);
        if (it == rule_index_.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("grammar rule '", base, "' refers to undefined rule '", e.text, "'"));
        }
        out.push_back({GrammarElement::Kind::kRule, it->second});
        return CheckSize();
      }
      case GrammarExpr::Kind::kSequence:
        for (const auto& child : e.children) {
          if (absl::Status s = LowerSequence(*child, base, out); !s.ok()) return s;
        }
        return absl::OkStatus();
      case GrammarExpr::Kind::kChoice: {
        std::vector<Alt> alts;
        if (absl::Status s = LowerAlternatives(e, base, alts); !s.ok()) return s;
        out.push_back({GrammarElement::Kind::kRule, HelperRule(base, std::move(alts))});
        return CheckSize();
      }
      case GrammarExpr::Kind::kRepeat:
        return LowerRepeat(e, base, out);
    }
    return absl::InternalError("unknown grammar expression");
  }

  absl::Status LowerCharClass(const GrammarExpr& e, const std::string& base, Alt& out) {
    const Ranges ranges = Normalize(e.ranges, e.negated);
    if (ranges.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar rule '", base, "' has a character class that matches nothing"));
    }
    std::vector<ByteRangeSeq> seqs;
    for (const auto& r : ranges) SplitUtf8(r.first, r.second, seqs);
    std::bitset<256> single;
    std::vector<Alt> alts;
    for (const auto& seq : seqs) {
      if (seq.size() == 1) {
        for (int b = seq[0].first; b <= seq[0].second; ++b) single.set(b);
        continue;
      }
      Alt alt;
      for (const auto& [lo, hi] : seq) {
        std::bitset<256> set;
        for (int b = lo; b <= hi; ++b) set.set(b);
        alt.push_back({GrammarElement::Kind::kBytes, ByteSet(set)});
      }
      alts.push_back(std::move(alt));
    }
    if (alts.empty()) {
      out.push_back({GrammarElement::Kind::kBytes, ByteSet(single)});
      return CheckSize();
    }
    if (single.any()) alts.push_back({{GrammarElement::Kind::kBytes, ByteSet(single)}});
    std::string key;
    for (const auto& r : ranges) absl::StrAppend(&key, r.first, "-", r.second, ",");
    auto it = class_rules_.find(key);
    if (it == class_rules_.end()) {
      it = class_rules_.emplace(key, HelperRule(base + "-class", std::move(alts))).first;
    }
    out.push_back({GrammarElement::Kind::kRule, it->second});
    return CheckSize();
  }

  absl::Status LowerRepeat(const GrammarExpr& e, const std::string& base, Alt& out) {
    if (e.max_count >= 0 && e.max_count < e.min_count) {
      return absl::InvalidArgumentError(absl::StrCat("grammar rule '", base, "' has repetition {",
                                                     e.min_count, ",", e.max_count, "}"));
    }
    Alt body;
    if (absl::Status s = LowerSequence(*e.children[0], base, body); !s.ok()) return s;
    if (body.size() > 2) {  // repeated copies refer to one rule instead
      body = {{GrammarElement::Kind::kRule, HelperRule(base + "-item", {std::move(body)})}};
    }
    for (int32_t i = 0; i < e.min_count; ++i) {
      if (absl::Status s = CheckSize(body.size()); !s.ok()) return s;
      out.insert(out.end(), body.begin(), body.end());
    }
    if (e.max_count == e.min_count) return absl::OkStatus();
    if (e.max_count < 0) {  // R ::= body R | ε (a tail call: the matcher's stack stays flat)
      const int32_t id = HelperRule(base + "-star", {});
      Alt loop = body;
      loop.push_back({GrammarElement::Kind::kRule, id});
      pending_[id] = {std::move(loop), Alt{}};
      out.push_back({GrammarElement::Kind::kRule, id});
      return CheckSize();
    }
    // O_1 ::= body | ε; O_k ::= body O_{k-1} | ε.
    int32_t previous = -1;
    for (int32_t k = 1; k <= e.max_count - e.min_count; ++k) {
      Alt alt = body;
      if (previous >= 0) alt.push_back({GrammarElement::Kind::kRule, previous});
      if (absl::Status s = CheckSize(alt.size()); !s.ok()) return s;
      previous = HelperRule(base + "-upto", {std::move(alt), Alt{}});
    }
    out.push_back({GrammarElement::Kind::kRule, previous});
    return CheckSize();
  }

  absl::Status CheckLeftRecursion() {
    const size_t n = pending_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : pending_[r]) {
          bool all = true;
          for (const auto& el : alt) {
            if (el.kind == GrammarElement::Kind::kBytes ||
                (el.kind == GrammarElement::Kind::kRule && !nullable[el.value])) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    // Edges r -> s where s can be the first thing r matches.
    std::vector<std::vector<int32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : pending_[r]) {
        for (const auto& el : alt) {
          if (el.kind == GrammarElement::Kind::kBytes) break;
          left[r].push_back(el.value);
          if (!nullable[el.value]) break;
        }
      }
    }
    std::vector<int8_t> state(n, 0);  // 0 unvisited, 1 on the path, 2 done
    for (size_t start = 0; start < n; ++start) {
      if (state[start] != 0) continue;
      std::vector<std::pair<int32_t, size_t>> stack = {{static_cast<int32_t>(start), 0}};
      state[start] = 1;
      while (!stack.empty()) {
        auto& [rule, next] = stack.back();
        if (next == left[rule].size()) {
          state[rule] = 2;
          stack.pop_back();
          continue;
        }
        const int32_t to = left[rule][next++];
        if (state[to] == 1) {
          const std::string& name = names_[to];
          if (name.find("-star#") != std::string::npos || name.find("-upto#") != std::string::npos) {
            return absl::InvalidArgumentError(absl::StrCat(
                "grammar rule '", name.substr(0, name.find('-')),
                "' repeats an expression that can match the empty string"));
          }
          return absl::InvalidArgumentError(
              absl::StrCat("grammar rule '", name, "' is left-recursive"));
        }
        if (state[to] == 0) {
          state[to] = 1;
          stack.emplace_back(to, 0);
        }
      }
    }
    return absl::OkStatus();
  }

  const GrammarDefinition& definition_;
  absl::flat_hash_map<std::string, int32_t> rule_index_;
  std::vector<std::string> names_;
  std::vector<std::vector<Alt>> pending_;
  std::vector<std::bitset<256>> byte_sets_;
  absl::flat_hash_map<std::string, int32_t> byte_set_index_;
  absl::flat_hash_map<std::string, int32_t> class_rules_;
  size_t lowered_ = 0;
};

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::Compile(
    const GrammarDefinition& definition) {
  return GrammarLowering(definition).Run();
}

}  // namespace loom::common
