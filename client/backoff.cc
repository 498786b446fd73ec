#include "client/backoff.h"

#include <algorithm>
#include <cmath>

namespace loom::client {

bool IsRetryable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable;
}

absl::Duration BackoffBefore(const RetryPolicy& policy, int attempt) {
  const double factor =
      std::pow(std::max(policy.backoff_multiplier, 1.0), std::max(attempt - 1, 0));
  // The cap is applied in floating point first: factor may be huge after many attempts.
  const double seconds = std::min(absl::ToDoubleSeconds(policy.initial_backoff) * factor,
                                  absl::ToDoubleSeconds(policy.max_backoff));
  return absl::Seconds(std::max(seconds, 0.0));
}

}  // namespace loom::client
