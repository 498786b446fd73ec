#pragma once

#include "coordinator/cluster.h"
#include "loom/v1/worker.grpc.pb.h"

namespace loom::coordinator {

/// The loom.v1.Coordinator gRPC service (called by workers): registration and heartbeat,
/// delegated to the Cluster. Thread-safe.
class CoordinatorService final : public loom::v1::Coordinator::Service {
 public:
  explicit CoordinatorService(Cluster& cluster) : cluster_(cluster) {}

  grpc::Status Register(grpc::ServerContext* context, const loom::v1::RegisterRequest* request,
                        loom::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const loom::v1::HeartbeatRequest* request,
                         loom::v1::HeartbeatResponse* response) override;

 private:
  Cluster& cluster_;
};

}  // namespace loom::coordinator
