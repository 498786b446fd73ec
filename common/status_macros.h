#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

/// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define LOOM_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::absl::Status loom_status_ = (expr);           \
    if (!loom_status_.ok()) return loom_status_;    \
  } while (0)

#define LOOM_STATUS_CONCAT_INNER_(a, b) a##b
#define LOOM_STATUS_CONCAT_(a, b) LOOM_STATUS_CONCAT_INNER_(a, b)

/// `LOOM_ASSIGN_OR_RETURN(auto x, FnReturningStatusOr());` assigns the value or returns
/// the error status from the enclosing function.
#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL_(LOOM_STATUS_CONCAT_(loom_statusor_, __LINE__), lhs, expr)

#define LOOM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                \
  if (!statusor.ok()) return statusor.status();          \
  lhs = std::move(statusor).value()
