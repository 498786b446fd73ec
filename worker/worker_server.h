#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/process_metrics.h"
#include "prometheus/exposer.h"
#include "worker/health_service.h"
#include "worker/registration.h"
#include "worker/step_executor.h"
#include "worker/step_progress.h"
#include "worker/worker_metrics.h"
#include "worker/worker_service.h"

namespace loom::worker {

/// The host a worker registers when no address is given: `listen_host`, or this machine's
/// name when listening on every interface (127.0.0.1 when it has none).
std::string AdvertiseHost(const std::string& listen_host);

/// A worker process's serving side around its StepExecutor, started in the order a worker
/// comes up: the gRPC server (the loom.v1.Worker service and grpc.health.v1), then the
/// Prometheus endpoint if asked for, then the registration with the coordinator and its
/// heartbeats. Stop takes them down in the order that lets a stopping worker finish its
/// step and answer its stream. Not thread-safe (one thread starts and stops it); the
/// services it holds are.
class WorkerServer {
 public:
  /// Serves `executor` on `listen_address` (HOST:PORT; port 0: any free port), recording
  /// steps into `metrics`; both must outlive the server. Unavailable when it cannot listen.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(StepExecutor& executor,
                                                             WorkerMetrics& metrics,
                                                             const std::string& listen_address);
  /// Stop(), if not done yet.
  ~WorkerServer();

  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  /// The port the gRPC server is bound to.
  int port() const { return port_; }

  /// Serves the worker's and the process's metrics at http://`host`:`port`/metrics (port 0:
  /// any free port); returns the bound port. Unavailable when the port cannot be bound.
  absl::StatusOr<int> ServeMetrics(const std::string& host, int port);

  /// Registers with the coordinator and heartbeats on a background thread
  /// (WorkerRegistration), each heartbeat carrying the service's sequence count and
  /// `progress` (not owned, may be null), read without waiting for the running step.
  void StartRegistration(RegistrationOptions options, const StepProgress* progress);
  /// The coordinator's refusal once it happened (the worker should exit), else OK.
  absl::Status fatal_status() const;
  /// Scale-in: asks the coordinator to drain this worker's replica and waits up to
  /// `timeout` while the step stream keeps serving; the requests left
  /// (WorkerRegistration::Drain). FailedPrecondition before StartRegistration.
  absl::StatusOr<int64_t> Drain(absl::Duration timeout);

  /// Stops the heartbeats, ends a debug hang, reports NOT_SERVING, ends the step stream
  /// after its running step and shuts the server down (calls in flight get 2 s).
  void Stop();

  /// Steps executed since start, over every stream.
  int64_t num_steps() const { return service_.num_steps(); }
  /// The model's KV heads this worker's pool holds (WorkerService::SetKvHeads).
  void SetKvHeads(int64_t begin, int64_t count) { service_.SetKvHeads(begin, count); }
  /// Tests only (WorkerService::RefusePoolTransfers).
  void RefusePoolTransfers() { service_.RefusePoolTransfers(); }

 private:
  WorkerServer(StepExecutor& executor, WorkerMetrics& metrics);

  StepExecutor& executor_;
  WorkerService service_;
  // grpc.health.v1 from a synchronous service, not gRPC's built-in callback one: see
  // HealthService for why (no callback pollers competing for the step stream).
  HealthService health_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // The exposer holds its collectables weakly: this lives as long as it.
  std::shared_ptr<common::ProcessCollector> process_metrics_;
  std::shared_ptr<prometheus::Registry> worker_metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<WorkerRegistration> registration_;
  bool stopped_ = false;
};

}  // namespace loom::worker
