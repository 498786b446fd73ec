#include "worker/health_service.h"

#include <utility>

#include "absl/time/time.h"

namespace loom::worker {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// How often a Watch stream looks whether its client went away (no status change wakes it).
constexpr absl::Duration kWatchPoll = absl::Milliseconds(200);

}  // namespace

HealthService::HealthService(std::string service_name) : service_name_(std::move(service_name)) {}

void HealthService::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (serving_ == serving) return;
  serving_ = serving;
  ++version_;
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  serving_ = false;
  shut_down_ = true;
  ++version_;
}

grpc::Status HealthService::Check(grpc::ServerContext* /*context*/,
                                  const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  if (!Knows(request->service())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "unknown service \"" + request->service() + "\"");
  }
  absl::MutexLock lock(&mu_);
  response->set_status(serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* context, const HealthCheckRequest* request,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  const bool known = Knows(request->service());
  {
    absl::MutexLock lock(&mu_);
    ++num_watching_;
  }
  uint64_t seen = 0;
  bool first = true;
  while (true) {
    HealthCheckResponse response;
    {
      absl::MutexLock lock(&mu_);
      if (!first) {
        // Until a change, the client leaving, or the shutdown (checked each poll).
        auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return version_ != seen || shut_down_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&changed), kWatchPoll);
      }
      if (shut_down_ && !first) break;
      if (context->IsCancelled()) break;
      if (!first && version_ == seen) continue;
      seen = version_;
      response.set_status(!known     ? HealthCheckResponse::SERVICE_UNKNOWN
                          : serving_ ? HealthCheckResponse::SERVING
                                     : HealthCheckResponse::NOT_SERVING);
    }
    first = false;
    if (!writer->Write(response)) break;  // the client went away
  }
  absl::MutexLock lock(&mu_);
  --num_watching_;
  return grpc::Status::OK;
}

}  // namespace loom::worker
