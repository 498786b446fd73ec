#pragma once

// What a request constrains its output with (a JSON Schema, any JSON object, a regex, a
// choice list or a GBNF grammar), compiled once per distinct spec.

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grammar/grammar.h"

namespace loom::common {

enum class GrammarKind { kJsonSchema, kJsonObject, kRegex, kChoice, kGbnf, kToolCalls };

/// A constraint as a request states it. `text`: the schema (JSON), the regex, the
/// choices (a JSON array of strings), the GBNF, or a framed tool-call spec (kToolCalls,
/// see common/grammar/tool_call_grammar.h); empty for kJsonObject.
struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text;
};

/// "json_schema", "json_object", "regex", "choice", "grammar", "tool_calls".
std::string GrammarKindName(GrammarKind kind);
/// The inverse of GrammarKindName; InvalidArgument for other names.
absl::StatusOr<GrammarKind> ParseGrammarKind(std::string_view name);

/// Compiles `spec`. InvalidArgument naming the construct it cannot compile.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileGrammarSpec(const GrammarSpec& spec);

/// Compiled grammars keyed by (kind, text), least recently used dropped past `capacity`.
/// Failures are not cached. Thread-safe.
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 256) : capacity_(capacity) {}

  /// The compiled grammar of `spec`, compiling it on first use.
  absl::StatusOr<std::shared_ptr<const Grammar>> Get(const GrammarSpec& spec);

  /// Compilations done (misses) and look-ups answered from the cache (hits).
  int64_t misses() const;
  int64_t hits() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Grammar>>;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
};

/// A process-wide cache (what the coordinator checks requests with). Thread-safe.
GrammarCache& SharedGrammarCache();

}  // namespace loom::common
