#include "coordinator/coordinator_service.h"

#include "coordinator/grpc_status.h"

namespace loom::coordinator {

grpc::Status CoordinatorService::Register(grpc::ServerContext*,
                                          const loom::v1::RegisterRequest* request,
                                          loom::v1::RegisterResponse* response) {
  absl::StatusOr<loom::v1::RegisterResponse> registered = cluster_.Register(*request);
  if (!registered.ok()) return ToGrpcStatus(registered.status());
  *response = *std::move(registered);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext*,
                                           const loom::v1::HeartbeatRequest* request,
                                           loom::v1::HeartbeatResponse*) {
  return ToGrpcStatus(cluster_.Heartbeat(*request));
}

}  // namespace loom::coordinator
