#pragma once

// The grammar of a JSON array whose first items each have their own schema (JSON Schema
// `prefixItems`: tuples, as Pydantic writes tuple[int, str]).

#include <cstdint>
#include <vector>

#include "common/grammar/grammar.h"

namespace loom::common {

/// "[" prefix[0] "," prefix[1] ... then items matching `rest` (null: none may follow),
/// between `min_items` and `max_items` (< 0: no bound) items in all, with at most one space
/// around each ',' (rule `ws`). Null when no length is possible (min_items above what
/// `prefix` and a null `rest` allow). `prefix` is not empty.
GrammarExprPtr TupleArrayExpr(const std::vector<GrammarExprPtr>& prefix, GrammarExprPtr rest,
                              int64_t min_items, int64_t max_items);

}  // namespace loom::common
