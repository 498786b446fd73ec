#pragma once

// Grammars for numbers within bounds, as JSON Schema's minimum, maximum,
// exclusiveMinimum and exclusiveMaximum ask: canonical integers in a range, and decimal
// numbers (`-?int(.frac)?`, no exponent) between real bounds, fractional and negative ones
// included.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace loom::common {

/// Canonical decimal integers in [lo, hi] (hi < 0: unbounded, up to 16 digits); null when
/// the range is empty.
GrammarExprPtr NonNegativeIntegerRange(uint64_t lo, int64_t hi);

/// One bound of a decimal range: `text` is the JSON number as written (`0.5`, `-3`,
/// `1e-3`); exclusive for exclusiveMinimum/exclusiveMaximum.
struct DecimalBound {
  std::string text;
  bool exclusive = false;
};

/// The decimal numbers between `lo` and `hi` (absent: unbounded), with at most 16
/// fraction digits, as an expression whose helper rules (named `rule_prefix`-...) are added
/// to `d`. Null when no number lies in the range. InvalidArgument for a bound that is not
/// a number, beyond 1e15 in magnitude or with more than 15 fraction digits.
absl::StatusOr<GrammarExprPtr> DecimalRangeExpr(GrammarDefinition& d, const std::string& rule_prefix,
                                                const std::optional<DecimalBound>& lo,
                                                const std::optional<DecimalBound>& hi);

}  // namespace loom::common
