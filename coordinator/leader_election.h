#pragma once

#include <functional>
#include <string>

#include "grpcpp/server_context.h"

namespace loom::coordinator {

/// How coordinators that stand in for one another pick the one that leads (workers
/// register with it; the others follow until it goes): a lock file (LeaderLock,
/// --leader-lock) or a Kubernetes Lease (KubernetesLease, --leader-lease). Thread-safe.
class LeaderElection {
 public:
  virtual ~LeaderElection() = default;

  /// Campaigns in the background; `on_elected` runs once, when this coordinator leads.
  virtual void Start(std::function<void()> on_elected) = 0;
  virtual bool leading() const = 0;
  /// Stops leading (and campaigning) now: a follower takes over while this coordinator
  /// finishes (SIGTERM; the workers follow the new leader at their next heartbeat). Then
  /// leading() is false and LeaderAddress() no longer names this coordinator. Idempotent.
  virtual void Resign() = 0;
  /// The leader's advertised gRPC address as last known (empty when unknown).
  virtual std::string LeaderAddress() const = 0;
  /// The flag that configured it, for messages ("--leader-lock /run/loom.lock").
  virtual std::string Describe() const = 0;
};

/// OK while `election` is null or this coordinator leads; else UNAVAILABLE naming the
/// leader, with its address as trailing metadata `loom-leader` (workers and the SDK turn
/// there). For the calls a follower refuses: registration, heartbeats, generation.
grpc::Status FollowingStatus(const LeaderElection* election, grpc::ServerContextBase& context);

}  // namespace loom::coordinator
