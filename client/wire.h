#pragma once

// Internal to loom::client (not installed): the plain SDK types to and from loom.v1
// messages, and gRPC statuses to absl ones (the one place the client converts them).

#include "absl/status/status.h"
#include "client/cluster_info.h"
#include "client/completion.h"
#include "client/generate_request.h"
#include "grpcpp/support/status.h"
#include "loom/v1/inference.pb.h"

namespace loom::client {

loom::v1::GenerateRequest ToWire(const GenerateRequest& request);
GenerateChunk FromWire(const loom::v1::GenerateResponse& response);
ModelDescription FromWire(const loom::v1::ServedModel& model);
ClusterState FromWire(const loom::v1::ClusterState& state);

/// gRPC and absl share the canonical codes: the code carries over, the message is kept.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace loom::client
