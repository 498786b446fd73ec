#pragma once

#include <exception>

#include "absl/status/status.h"

namespace loom::worker {

/// gloo reports failures as exceptions: a timeout is an IoException whose message says
/// "Timed out" (DeadlineExceeded); other I/O errors (a peer's connection reset) and broken
/// invariants are failures of the peer set (Unavailable). `scope` and `what` prefix the
/// message ("gloo all-reduce: ...", "pipeline receive: ...").
absl::Status GlooStatus(const char* scope, const char* what, const std::exception& error);

}  // namespace loom::worker
