#include "common/grammar/json_array_grammar.h"

#include <algorithm>

namespace loom::common {

GrammarExprPtr TupleArrayExpr(const std::vector<GrammarExprPtr>& prefix, GrammarExprPtr rest,
                              int64_t min_items, int64_t max_items) {
  const auto n = static_cast<int64_t>(prefix.size());
  const GrammarExprPtr separator =
      SequenceExpr({RuleRefExpr("ws"), LiteralExpr(","), RuleRefExpr("ws")});
  // What may follow the n prefix items.
  GrammarExprPtr tail = EmptyExpr();
  if (rest != nullptr && (max_items < 0 || max_items > n)) {
    tail = RepeatExpr(SequenceExpr({separator, rest}),
                      static_cast<int32_t>(std::max<int64_t>(min_items - n, 0)),
                      max_items < 0 ? -1 : static_cast<int32_t>(max_items - n));
  } else if (min_items > n) {
    return nullptr;
  }
  // Right to left: item i and everything after it; optional once i items are enough.
  for (int64_t i = n - 1; i >= 0; --i) {
    if (max_items >= 0 && i >= max_items) {
      tail = EmptyExpr();
      continue;
    }
    GrammarExprPtr here = SequenceExpr({i > 0 ? separator : EmptyExpr(), prefix[i], tail});
    tail = i >= min_items ? RepeatExpr(here, 0, 1) : here;
  }
  return SequenceExpr(
      {LiteralExpr("["), RuleRefExpr("ws"), tail, RuleRefExpr("ws"), LiteralExpr("]")});
}

}  // namespace loom::common
