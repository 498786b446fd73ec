#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace loom::common {

// The one place where errors cross the wire, both ways: absl and gRPC share the canonical
// codes, so the code carries over and the message is kept. Header-only: its users (the
// coordinator, the API and the workers) link gRPC; common itself does not.

/// Longest message ToGrpcStatus sends: the message travels as a trailer, and a client's
/// default metadata limit (16 KiB in grpcio) turns a longer one into RESOURCE_EXHAUSTED in
/// place of the real code (errors that quote a client's 1 MB model name or regex did).
inline constexpr size_t kMaxGrpcMessageBytes = 4096;

/// An internal error as a gRPC status (OK stays OK), its message cut to
/// kMaxGrpcMessageBytes (at a UTF-8 character boundary, marked with "...").
inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxGrpcMessageBytes) {
    size_t cut = kMaxGrpcMessageBytes;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
    message.resize(cut);
    message += "...";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(message));
}

/// A gRPC status (a call's outcome) as an absl::Status (OK stays OK).
inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

/// The same, its message after `what` ("what: message"): which call failed.
inline absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      what + ": " + status.error_message());
}

}  // namespace loom::common
