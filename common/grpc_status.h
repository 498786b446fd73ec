#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace loom::common {

// The one place where errors cross the wire, both ways: absl and gRPC share the canonical
// codes, so the code carries over and the message is kept. Header-only: its users (the
// coordinator, the API and the workers) link gRPC; common itself does not.

/// An internal error as a gRPC status (OK stays OK).
inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

/// A gRPC status (a call's outcome) as an absl::Status (OK stays OK).
inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace loom::common
