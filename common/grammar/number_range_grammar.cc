#include "common/grammar/number_range_grammar.h"

#include <cctype>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom::common {
namespace {

constexpr int kMaxFractionDigits = 16;

GrammarExprPtr Lit(std::string s) { return LiteralExpr(std::move(s)); }
GrammarExprPtr Seq(std::vector<GrammarExprPtr> v) { return SequenceExpr(std::move(v)); }
GrammarExprPtr Alt(std::vector<GrammarExprPtr> v) { return ChoiceExpr(std::move(v)); }
GrammarExprPtr Digits(int32_t lo, int32_t hi) { return RepeatExpr(CharClassExpr({{'0', '9'}}), lo, hi); }
GrammarExprPtr Digit(char lo, char hi) { return CharClassExpr({{uint32_t(lo), uint32_t(hi)}}); }

// Decimal strings of equal length between a and b (digits after the first may be 0).
GrammarExprPtr FixedWidthRange(const std::string& a, const std::string& b) {
  if (a.empty()) return EmptyExpr();
  if (a[0] == b[0]) return Seq({Lit(std::string(1, a[0])), FixedWidthRange(a.substr(1), b.substr(1))});
  const size_t k = a.size() - 1;
  std::vector<GrammarExprPtr> alts;
  alts.push_back(Seq({Lit(std::string(1, a[0])), FixedWidthRange(a.substr(1), std::string(k, '9'))}));
  if (a[0] + 1 <= b[0] - 1) alts.push_back(Seq({Digit(a[0] + 1, b[0] - 1), Digits(k, k)}));
  alts.push_back(Seq({Lit(std::string(1, b[0])), FixedWidthRange(std::string(k, '0'), b.substr(1))}));
  return Alt(std::move(alts));
}

// A non-negative decimal: integer digits (no leading zeros) and fraction digits (no
// trailing zeros).
struct Decimal {
  std::string integer = "0";
  std::string fraction;
  bool negative = false;
  bool zero() const { return integer == "0" && fraction.empty(); }
};

// `text`, a JSON number, as a Decimal (exponents shifted into the digits).
absl::StatusOr<Decimal> ParseDecimal(const std::string& text) {
  Decimal out;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') {
    out.negative = true;
    ++i;
  }
  std::string digits;
  int64_t point = -1;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'); ++i) {
    if (text[i] == '.') {
      point = static_cast<int64_t>(digits.size());
    } else {
      digits += text[i];
    }
  }
  if (point < 0) point = static_cast<int64_t>(digits.size());
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    int64_t exponent = 0;
    if (!absl::SimpleAtoi(std::string(text.substr(i + 1)), &exponent) || exponent > 20 || exponent < -20) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a bound Loom takes"));
    }
    point += exponent;
    i = text.size();
  }
  if (digits.empty() || i != text.size()) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a number"));
  }
  while (point <= 0) {
    digits.insert(digits.begin(), '0');
    ++point;
  }
  while (static_cast<int64_t>(digits.size()) < point) digits += '0';
  out.integer = digits.substr(0, point);
  out.fraction = digits.substr(point);
  while (out.integer.size() > 1 && out.integer[0] == '0') out.integer.erase(0, 1);
  while (!out.fraction.empty() && out.fraction.back() == '0') out.fraction.pop_back();
  if (out.integer.size() > 15) {
    return absl::InvalidArgumentError(absl::StrCat("bounds beyond 1e15 (", text, ") are not supported"));
  }
  if (out.fraction.size() > kMaxFractionDigits - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bounds with more than 15 fraction digits (", text, ") are not supported"));
  }
  if (out.zero()) out.negative = false;
  return out;
}

// -1, 0, 1 as a <, ==, > b (both non-negative).
int Compare(const Decimal& a, const Decimal& b) {
  if (a.integer.size() != b.integer.size()) return a.integer.size() < b.integer.size() ? -1 : 1;
  if (a.integer != b.integer) return a.integer < b.integer ? -1 : 1;
  if (a.fraction != b.fraction) return a.fraction < b.fraction ? -1 : 1;
  return 0;
}

// A bound on a non-negative magnitude.
struct MagnitudeBound {
  Decimal value;
  bool exclusive = false;
};

// Builds the fraction digits: the digit strings D whose value 0.D lies between a lower
// and an upper bound's remaining fraction digits, one rule per state (memoized).
class FractionBuilder {
 public:
  FractionBuilder(GrammarDefinition& d, std::string prefix) : d_(d), prefix_(std::move(prefix)) {}

  // An optional fraction part ("" or "." D) whose value lies within the bounds; null when
  // none does. `lo`/`hi` are fraction digits (trailing zeros stripped) or null.
  GrammarExprPtr OptionalFraction(const std::string* lo, bool lo_strict, const std::string* hi,
                                  bool hi_strict) {
    const State state = Build(lo ? std::optional<std::string>(*lo) : std::nullopt, lo_strict,
                              hi ? std::optional<std::string>(*hi) : std::nullopt, hi_strict,
                              kMaxFractionDigits);
    std::vector<GrammarExprPtr> alts;
    if (state.empty_ok) alts.push_back(EmptyExpr());
    if (state.nonempty) alts.push_back(Seq({Lit("."), state.nonempty}));
    if (alts.empty()) return nullptr;
    return alts.size() == 1 ? alts[0] : Alt(std::move(alts));
  }

 private:
  struct State {
    bool empty_ok = false;
    GrammarExprPtr nonempty;  // null: no non-empty digit string
  };

  State Build(const std::optional<std::string>& lo, bool lo_strict,
              const std::optional<std::string>& hi, bool hi_strict, int budget) {
    State state;
    // An empty D is the value 0.
    state.empty_ok = (!lo || (lo->empty() && !lo_strict)) && (!hi || !hi->empty() || !hi_strict);
    if (budget == 0) return state;
    if (!lo && !hi) {
      state.nonempty = Digits(1, budget);
      return state;
    }
    const std::string key = absl::StrCat(lo ? *lo : "-", lo_strict ? "s" : "i", "|", hi ? *hi : "-",
                                         hi_strict ? "s" : "i", "|", budget);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const char c0 = lo ? (lo->empty() ? '0' : (*lo)[0]) : '0';
    const char e0 = hi ? (hi->empty() ? '0' : (*hi)[0]) : '9';
    std::vector<GrammarExprPtr> alts;
    auto add = [&](char from, char to, const std::optional<std::string>& lo_next,
                   const std::optional<std::string>& hi_next) {
      if (from > to) return;
      const State next = Build(lo_next, lo_strict, hi_next, hi_strict, budget - 1);
      std::vector<GrammarExprPtr> tails;
      if (next.empty_ok) tails.push_back(EmptyExpr());
      if (next.nonempty) tails.push_back(next.nonempty);
      if (tails.empty()) return;
      GrammarExprPtr first = from == to ? Lit(std::string(1, from)) : Digit(from, to);
      alts.push_back(Seq({first, tails.size() == 1 ? tails[0] : Alt(std::move(tails))}));
    };
    auto rest = [](const std::optional<std::string>& s) -> std::optional<std::string> {
      return s->empty() ? std::string() : s->substr(1);
    };
    const char low = lo ? c0 : '0';
    const char high = hi ? e0 : '9';
    if (low > high) {
      memo_[key] = state;
      return state;
    }
    if (low == high) {
      add(low, low, lo ? rest(lo) : std::nullopt, hi ? rest(hi) : std::nullopt);
    } else {
      add(low, low, lo ? rest(lo) : std::nullopt, std::nullopt);
      add(low + 1, high - 1, std::nullopt, std::nullopt);
      add(high, high, std::nullopt, hi ? rest(hi) : std::nullopt);
    }
    if (!alts.empty()) {
      const std::string name = absl::StrCat(prefix_, "-frac", memo_.size());
      d_.SetRule(name, alts.size() == 1 ? alts[0] : Alt(std::move(alts)));
      state.nonempty = RuleRefExpr(name);
    }
    memo_[key] = state;
    return state;
  }

  GrammarDefinition& d_;
  std::string prefix_;
  absl::flat_hash_map<std::string, State> memo_;
};

// Unsigned decimals (canonical integer part, optional fraction) within [lo, hi].
GrammarExprPtr MagnitudeRange(FractionBuilder& fractions, const MagnitudeBound& lo,
                              const std::optional<MagnitudeBound>& hi) {
  if (hi) {
    const int order = Compare(lo.value, hi->value);
    if (order > 0 || (order == 0 && (lo.exclusive || hi->exclusive))) return nullptr;
  }
  uint64_t lo_int = 0;
  absl::SimpleAtoi(lo.value.integer, &lo_int);
  std::vector<GrammarExprPtr> alts;
  auto with_fraction = [&](GrammarExprPtr integer, GrammarExprPtr fraction) {
    if (integer && fraction) alts.push_back(Seq({std::move(integer), std::move(fraction)}));
  };
  if (hi && hi->value.integer == lo.value.integer) {
    with_fraction(Lit(lo.value.integer),
                  fractions.OptionalFraction(&lo.value.fraction, lo.exclusive, &hi->value.fraction,
                                             hi->exclusive));
  } else {
    with_fraction(Lit(lo.value.integer),
                  fractions.OptionalFraction(&lo.value.fraction, lo.exclusive, nullptr, false));
    int64_t hi_int = -1;
    if (hi) absl::SimpleAtoi(hi->value.integer, &hi_int);
    if (!hi || hi_int - 1 >= static_cast<int64_t>(lo_int + 1)) {
      with_fraction(NonNegativeIntegerRange(lo_int + 1, hi ? hi_int - 1 : -1),
                    fractions.OptionalFraction(nullptr, false, nullptr, false));
    }
    if (hi) {
      with_fraction(Lit(hi->value.integer),
                    fractions.OptionalFraction(nullptr, false, &hi->value.fraction, hi->exclusive));
    }
  }
  if (alts.empty()) return nullptr;
  return alts.size() == 1 ? alts[0] : Alt(std::move(alts));
}

}  // namespace

GrammarExprPtr NonNegativeIntegerRange(uint64_t lo, int64_t hi) {
  std::vector<GrammarExprPtr> alts;
  uint64_t a = lo;
  const std::string top = hi < 0 ? std::string(16, '9') : std::to_string(static_cast<uint64_t>(hi));
  while (true) {
    const std::string as = std::to_string(a);
    if (as.size() > top.size()) break;
    const std::string bs = as.size() == top.size() ? top : std::string(as.size(), '9');
    if (as.size() == top.size() && as > bs) break;
    alts.push_back(FixedWidthRange(as, bs));
    if (as.size() == top.size()) break;
    if (hi < 0) {
      // No upper bound: every longer number is in range, one expression for all widths
      // (one per width gave the matcher ~9x the states to precompute: ~1 s per schema).
      alts.push_back(Seq({Digit('1', '9'), Digits(static_cast<int32_t>(as.size()),
                                                  static_cast<int32_t>(top.size()) - 1)}));
      break;
    }
    uint64_t next_power = 1;  // 10^as.size(): the first number with one more digit
    for (size_t digit = 0; digit < as.size(); ++digit) next_power *= 10;
    a = next_power;
  }
  if (alts.empty()) return nullptr;
  return Alt(std::move(alts));
}

absl::StatusOr<GrammarExprPtr> DecimalRangeExpr(GrammarDefinition& d, const std::string& rule_prefix,
                                                const std::optional<DecimalBound>& lo,
                                                const std::optional<DecimalBound>& hi) {
  std::optional<Decimal> lo_value;
  std::optional<Decimal> hi_value;
  if (lo) {
    absl::StatusOr<Decimal> parsed = ParseDecimal(lo->text);
    if (!parsed.ok()) return parsed.status();
    lo_value = *parsed;
  }
  if (hi) {
    absl::StatusOr<Decimal> parsed = ParseDecimal(hi->text);
    if (!parsed.ok()) return parsed.status();
    hi_value = *parsed;
  }
  FractionBuilder fractions(d, rule_prefix);
  std::vector<GrammarExprPtr> alts;
  // Non-negative numbers: from max(lo, 0) up to hi.
  if (!hi_value || !hi_value->negative) {
    MagnitudeBound from{Decimal{}, false};
    if (lo_value && !lo_value->negative) from = {*lo_value, lo->exclusive};
    std::optional<MagnitudeBound> to;
    if (hi_value) to = MagnitudeBound{*hi_value, hi->exclusive};
    if (GrammarExprPtr e = MagnitudeRange(fractions, from, to)) alts.push_back(e);
  }
  // Negative numbers, "-" and a magnitude above 0: from max(-hi, 0) up to -lo.
  if (!lo_value || lo_value->negative) {
    MagnitudeBound from{Decimal{}, true};
    if (hi_value && hi_value->negative) from = {*hi_value, hi->exclusive};
    std::optional<MagnitudeBound> to;
    if (lo_value) to = MagnitudeBound{*lo_value, lo->exclusive};
    if (from.value.zero()) from.exclusive = true;  // no "-0"
    if (GrammarExprPtr e = MagnitudeRange(fractions, from, to)) alts.push_back(Seq({Lit("-"), e}));
  }
  if (alts.empty()) return nullptr;
  return alts.size() == 1 ? alts[0] : Alt(std::move(alts));
}

}  // namespace loom::common
