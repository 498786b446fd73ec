#pragma once

#include <atomic>

#include "coordinator/cluster.h"
#include "coordinator/leader_election.h"
#include "coordinator/rendezvous_store.h"
#include "loom/v1/worker.grpc.pb.h"

namespace loom::coordinator {

/// The loom.v1.Coordinator gRPC service (called by workers): registration and heartbeat,
/// delegated to the Cluster, and the tensor-parallel rendezvous store. Thread-safe.
class CoordinatorService final : public loom::v1::Coordinator::Service {
 public:
  explicit CoordinatorService(Cluster& cluster) : cluster_(cluster) {}

  /// With a leader election, workers register and heartbeat only while this coordinator
  /// leads; a follower answers UNAVAILABLE naming the leader (trailing metadata
  /// `loom-leader: HOST:PORT`, where the worker goes next). Call before serving.
  void set_leader_election(const LeaderElection* election) { election_.store(election); }

  grpc::Status Register(grpc::ServerContext* context, const loom::v1::RegisterRequest* request,
                        loom::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const loom::v1::HeartbeatRequest* request,
                         loom::v1::HeartbeatResponse* response) override;
  grpc::Status StoreSet(grpc::ServerContext* context, const loom::v1::StoreSetRequest* request,
                        loom::v1::StoreSetResponse* response) override;
  grpc::Status StoreGet(grpc::ServerContext* context, const loom::v1::StoreGetRequest* request,
                        loom::v1::StoreGetResponse* response) override;
  /// Blocks until the worker's replica is drained or the call's deadline.
  grpc::Status Drain(grpc::ServerContext* context, const loom::v1::DrainRequest* request,
                     loom::v1::DrainResponse* response) override;

 private:
  Cluster& cluster_;
  std::atomic<const LeaderElection*> election_{nullptr};  // set after the server started
  RendezvousStore store_;
};

}  // namespace loom::coordinator
