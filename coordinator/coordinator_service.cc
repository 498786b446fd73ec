#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_format.h"
#include "common/cluster_secret.h"
#include "common/grpc_status.h"

namespace loom::coordinator {

grpc::Status CoordinatorService::Register(grpc::ServerContext* context,
                                          const loom::v1::RegisterRequest* request,
                                          loom::v1::RegisterResponse* response) {
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  if (grpc::Status following = FollowingStatus(election_.load(), *context); !following.ok()) {
    return following;
  }
  absl::StatusOr<loom::v1::RegisterResponse> registered = cluster_.Register(*request);
  if (!registered.ok()) return common::ToGrpcStatus(registered.status());
  *response = *std::move(registered);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const loom::v1::HeartbeatRequest* request,
                                           loom::v1::HeartbeatResponse*) {
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  if (grpc::Status following = FollowingStatus(election_.load(), *context); !following.ok()) {
    return following;
  }
  return common::ToGrpcStatus(cluster_.Heartbeat(*request));
}

grpc::Status CoordinatorService::Drain(grpc::ServerContext* context,
                                       const loom::v1::DrainRequest* request,
                                       loom::v1::DrainResponse* response) {
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  // The worker's drain timeout, and never past the call's deadline (an hour without
  // either).
  absl::Duration timeout =
      request->timeout_ms() > 0 ? absl::Milliseconds(request->timeout_ms()) : absl::Hours(1);
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    timeout = std::min(
        timeout, absl::FromChrono(context->deadline() - std::chrono::system_clock::now()));
  }
  absl::StatusOr<int64_t> left = cluster_.DrainReplica(request->worker_id(), timeout);
  if (!left.ok()) return common::ToGrpcStatus(left.status());
  response->set_num_requests_left(static_cast<int32_t>(*left));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::StoreSet(grpc::ServerContext* context,
                                          const loom::v1::StoreSetRequest* request,
                                          loom::v1::StoreSetResponse*) {
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  return common::ToGrpcStatus(store_.Set(request->key(), request->value()));
}

grpc::Status CoordinatorService::StoreGet(grpc::ServerContext* context,
                                          const loom::v1::StoreGetRequest* request,
                                          loom::v1::StoreGetResponse* response) {
  if (absl::Status secret = common::CheckClusterSecret(*context); !secret.ok()) {
    return common::ToGrpcStatus(secret);
  }
  absl::Duration timeout =
      request->timeout_ms() > 0 ? absl::Milliseconds(request->timeout_ms()) : absl::Seconds(30);
  // Never wait past the caller's own deadline.
  timeout = std::min(timeout, absl::FromChrono(context->deadline() - std::chrono::system_clock::now()));
  const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  absl::StatusOr<std::vector<std::string>> values = store_.Get(keys, timeout);
  if (!values.ok()) return common::ToGrpcStatus(values.status());
  for (std::string& value : *values) response->add_values(std::move(value));
  return grpc::Status::OK;
}

}  // namespace loom::coordinator
