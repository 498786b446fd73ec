#include "worker/worker_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <exception>
#include <utility>

#include "absl/strings/str_format.h"

namespace loom::worker {
namespace {

constexpr int kShutdownGraceMs = 2000;
// A plan that adds many long prompts at once can pass gRPC's 4 MiB default.
constexpr int kMaxPlanBytes = 256 << 20;
// The KV blocks reported at registration stay under the coordinator's 4 MiB message limit
// (about 40,000 blocks of 16 tokens; the most recently used chains go first).
constexpr int64_t kMaxKvReportBytes = 3 << 20;

}  // namespace

std::string AdvertiseHost(const std::string& listen_host) {
  if (listen_host != "0.0.0.0" && listen_host != "[::]" && listen_host != "::") {
    return listen_host;
  }
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "127.0.0.1";
  return name;
}

WorkerServer::WorkerServer(StepExecutor& executor, WorkerMetrics& metrics)
    : executor_(executor),
      service_(executor, &metrics),
      health_("loom.v1.Worker"),
      worker_metrics_(metrics.registry()) {}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(
    StepExecutor& executor, WorkerMetrics& metrics, const std::string& listen_address) {
  std::unique_ptr<WorkerServer> server(new WorkerServer(executor, metrics));
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, grpc::InsecureServerCredentials(), &server->port_);
  builder.SetMaxReceiveMessageSize(kMaxPlanBytes);
  builder.RegisterService(&server->service_);
  builder.RegisterService(&server->health_);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrFormat("cannot listen on %s", listen_address));
  }
  return server;
}

WorkerServer::~WorkerServer() { Stop(); }

absl::StatusOr<int> WorkerServer::ServeMetrics(const std::string& host, int port) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(absl::StrFormat("%s:%d", host, port));
  } catch (const std::exception& error) {
    return absl::UnavailableError(
        absl::StrFormat("cannot serve metrics on %s:%d: %s", host, port, error.what()));
  }
  process_metrics_ = std::make_shared<common::ProcessCollector>();
  exposer_->RegisterCollectable(worker_metrics_);
  exposer_->RegisterCollectable(process_metrics_);
  return static_cast<int>(exposer_->GetListeningPorts().front());
}

void WorkerServer::StartRegistration(RegistrationOptions options, const StepProgress* progress) {
  // The heartbeat thread reads the service's sequence count and the executor's progress
  // without ever waiting for the step that runs.
  // A coordinator taking this worker over adopts the KV blocks its pool still holds.
  options.prepare = [this](loom::v1::RegisterRequest& request) {
    service_.PrepareRegistration(request, kMaxKvReportBytes);
  };
  registration_ = std::make_unique<WorkerRegistration>(
      std::move(options), [this, progress](loom::v1::HeartbeatRequest& heartbeat) {
        heartbeat.set_num_sequences(service_.num_sequences());
        if (progress != nullptr) *heartbeat.mutable_progress() = progress->Snapshot();
      });
  registration_->Start();
}

absl::Status WorkerServer::fatal_status() const {
  return registration_ == nullptr ? absl::OkStatus() : registration_->fatal_status();
}

absl::StatusOr<int64_t> WorkerServer::Drain(absl::Duration timeout) {
  if (registration_ == nullptr) {
    return absl::FailedPreconditionError("the worker is not registered with a coordinator");
  }
  return registration_->Drain(timeout);
}

void WorkerServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (registration_ != nullptr) registration_->Stop();
  executor_.ReleaseDebugHang();
  health_.Shutdown();
  service_.BeginShutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(kShutdownGraceMs));
    server_->Wait();
  }
}

}  // namespace loom::worker
