#pragma once

// Internal to loom::client (not installed): when a failed call may be tried again.

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client_options.h"

namespace loom::client {

/// Whether a call that failed with `status` may be tried again: UNAVAILABLE only (no
/// replica, draining, connection refused); every other code is the server's answer.
bool IsRetryable(const absl::Status& status);

/// The wait before attempt `attempt` (1 is the first retry):
/// min(max_backoff, initial_backoff * multiplier^(attempt - 1)).
absl::Duration BackoffBefore(const RetryPolicy& policy, int attempt);

}  // namespace loom::client
