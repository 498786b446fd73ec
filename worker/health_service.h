#pragma once

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace loom::worker {

/// grpc.health.v1 for loom-worker, as a synchronous service. gRPC's built-in health service
/// (EnableDefaultHealthCheckService) uses the callback API, and a process with a callback service
/// runs gRPC's callback poller threads: they poll the same sockets as the synchronous server, so a
/// step plan often woke one of them, which read it and then woke the thread serving the step stream
/// (CPU and a thread hop per step). Answers for the server as a whole ("") and for `service_name`;
/// NOT_FOUND for any other name. Thread-safe.
class HealthService final : public grpc::health::v1::Health::Service {
 public:
  explicit HealthService(std::string service_name);

  /// SERVING or NOT_SERVING for every name served; Watch streams see the change.
  void SetServing(bool serving);
  /// NOT_SERVING, and open Watch streams end (with OK) so a server shutdown does not wait for them.
  /// A later Watch sends NOT_SERVING and ends.
  void Shutdown();

  /// Watch calls being served now.
  int num_watching() {
    absl::MutexLock lock(&mu_);
    return num_watching_;
  }

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  bool Knows(const std::string& name) const { return name.empty() || name == service_name_; }

  const std::string service_name_;
  absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = true;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by every change
  int num_watching_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace loom::worker
