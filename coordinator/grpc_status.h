#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace loom::coordinator {

/// The one place where internal errors become wire errors: absl and gRPC share the
/// canonical codes, so the code carries over and the message is kept.
inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace loom::coordinator
