#include "worker/registration.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/strings/str_split.h"
#include "common/cluster_secret.h"
#include "common/grpc_status.h"

namespace loom::worker {
namespace {

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
}

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    default:
      return "ERROR";
  }
}

}  // namespace

WorkerRegistration::WorkerRegistration(RegistrationOptions options, DescribeFn describe)
    : options_(std::move(options)),
      describe_(std::move(describe)),
      addresses_(absl::StrSplit(options_.coordinator_address, ',', absl::SkipEmpty())) {
  next_ = addresses_.size() > 1 ? 1 : 0;
  Connect(addresses_.empty() ? options_.coordinator_address : addresses_.front());
}

void WorkerRegistration::Connect(const std::string& address) {
  grpc::ChannelArguments args;
  // Reconnect quickly after the coordinator comes (back) up: gRPC's default backoff
  // grows to two minutes, far slower than our own retry schedule.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.initial_backoff)));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.initial_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.max_backoff)));
  std::shared_ptr<loom::v1::Coordinator::Stub> stub =
      loom::v1::Coordinator::NewStub(common::CreateClusterChannel(address, args));
  absl::MutexLock lock(&mu_);
  stub_ = std::move(stub);
  target_ = address;
}

std::shared_ptr<loom::v1::Coordinator::Stub> WorkerRegistration::stub() const {
  absl::MutexLock lock(&mu_);
  return stub_;
}

std::string WorkerRegistration::target() const {
  absl::MutexLock lock(&mu_);
  return target_;
}

void WorkerRegistration::NoteLeader(const grpc::ClientContext& context,
                                    const grpc::Status& status) {
  if (status.ok()) return;
  const auto& trailers = context.GetServerTrailingMetadata();
  auto leader = trailers.find("loom-leader");
  if (leader != trailers.end()) leader_hint_.assign(leader->second.data(), leader->second.size());
}

bool WorkerRegistration::SwitchCoordinator(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
      status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return false;
  }
  const std::string current = target();
  std::string next;
  if (!leader_hint_.empty() && leader_hint_ != current) {
    next = std::exchange(leader_hint_, std::string());
  } else if (addresses_.size() > 1) {
    next = addresses_[next_];
    next_ = (next_ + 1) % addresses_.size();
    if (next == current) {
      next = addresses_[next_];
      next_ = (next_ + 1) % addresses_.size();
    }
  }
  leader_hint_.clear();
  if (next.empty() || next == current) return false;
  // While no coordinator leads, this cycles every backoff: logged at most every 2 s.
  if (const absl::Time now = absl::Now(); now - last_switch_log_ >= absl::Seconds(2)) {
    last_switch_log_ = now;
    std::fprintf(stderr, "loom-worker: coordinator %s: %s; turning to %s\n", current.c_str(),
                 status.error_message().c_str(), next.c_str());
  }
  Connect(next);
  return true;
}

WorkerRegistration::~WorkerRegistration() { Stop(); }

void WorkerRegistration::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void WorkerRegistration::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (call_ != nullptr) call_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status WorkerRegistration::fatal_status() const {
  absl::MutexLock lock(&mu_);
  return fatal_;
}

std::string WorkerRegistration::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

int64_t WorkerRegistration::num_registrations() const {
  absl::MutexLock lock(&mu_);
  return num_registrations_;
}

absl::StatusOr<int64_t> WorkerRegistration::Drain(absl::Duration timeout) {
  loom::v1::DrainRequest request;
  {
    // A SIGTERM soon after start-up can come while the Register answer is on its way (the
    // coordinator may already count this worker as connected): wait for it, at most one
    // RPC timeout, so that the replica is drained rather than lost.
    absl::MutexLock lock(&mu_);
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !worker_id_.empty() || stopping_ || !fatal_.ok();
    };
    mu_.AwaitWithTimeout(absl::Condition(&settled), options_.rpc_timeout);
    request.set_worker_id(worker_id_);
  }
  if (request.worker_id().empty()) {
    return absl::FailedPreconditionError("not registered with the coordinator");
  }
  request.set_timeout_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(timeout)));
  loom::v1::DrainResponse response;
  grpc::ClientContext context;
  // The coordinator answers at `timeout`; the slack carries its answer back.
  context.set_deadline(DeadlineAfter(timeout + options_.rpc_timeout));
  const grpc::Status status = stub()->Drain(&context, request, &response);
  if (!status.ok()) return common::FromGrpcStatus(status);
  return response.num_requests_left();
}

bool WorkerRegistration::Sleep(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), duration);
  return !stopping_;
}

grpc::Status WorkerRegistration::Register(loom::v1::RegisterResponse& response) {
  loom::v1::RegisterRequest request = options_.request;
  request.set_protocol_version(loom::v1::PROTOCOL_VERSION_CURRENT);
  if (options_.prepare) options_.prepare(request);
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
    call_ = &context;
  }
  grpc::Status status = stub()->Register(&context, request, &response);
  NoteLeader(context, status);
  absl::MutexLock lock(&mu_);
  call_ = nullptr;
  return status;
}

grpc::Status WorkerRegistration::Heartbeat(const std::string& worker_id) {
  loom::v1::HeartbeatRequest request;
  request.set_worker_id(worker_id);
  request.set_num_kv_blocks(options_.request.num_kv_blocks());
  if (describe_) describe_(request);
  loom::v1::HeartbeatResponse response;
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
    call_ = &context;
  }
  grpc::Status status = stub()->Heartbeat(&context, request, &response);
  NoteLeader(context, status);
  absl::MutexLock lock(&mu_);
  call_ = nullptr;
  return status;
}

void WorkerRegistration::Run() {
  std::string coordinator = target();
  absl::Duration backoff = options_.initial_backoff;
  grpc::StatusCode last_logged = grpc::StatusCode::OK;
  absl::Time last_log_time = absl::InfinitePast();
  // Logs a failed call when its code changes, and at most every 10 s otherwise.
  auto log_failure = [&](const char* what, const grpc::Status& status) {
    const absl::Time now = absl::Now();
    if (status.error_code() == last_logged && now - last_log_time < absl::Seconds(10)) return;
    last_logged = status.error_code();
    last_log_time = now;
    std::fprintf(stderr, "loom-worker: %s with coordinator %s failed (%s: %s); retrying\n", what,
                 coordinator.c_str(), CodeName(status.error_code()),
                 status.error_message().c_str());
  };

  while (true) {
    // Register until it succeeds.
    loom::v1::RegisterResponse response;
    grpc::Status status = Register(response);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      std::fprintf(stderr, "loom-worker: the coordinator at %s refused this worker: %s\n",
                   coordinator.c_str(), status.error_message().c_str());
      absl::MutexLock lock(&mu_);
      fatal_ =
          absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
      return;
    }
    if (!status.ok()) {
      if (SwitchCoordinator(status)) {
        coordinator = target();
        // Not at once: coordinators that all refuse would be called in a tight loop.
        if (!Sleep(options_.initial_backoff)) return;
        continue;
      }
      log_failure("registration", status);
      if (!Sleep(backoff)) return;
      backoff = std::min(backoff * 2, options_.max_backoff);
      continue;
    }
    backoff = options_.initial_backoff;
    last_logged = grpc::StatusCode::OK;
    const absl::Duration interval =
        absl::Milliseconds(std::clamp(response.heartbeat_interval_ms(), 10, 60000));
    {
      absl::MutexLock lock(&mu_);
      worker_id_ = response.worker_id();
      ++num_registrations_;
    }
    std::fprintf(stderr, "loom-worker: registered with %s as %s (heartbeat every %lld ms)\n",
                 coordinator.c_str(), response.worker_id().c_str(),
                 static_cast<long long>(absl::ToInt64Milliseconds(interval)));

    // Heartbeat until the coordinator forgets us.
    while (Sleep(interval)) {
      status = Heartbeat(response.worker_id());
      if (status.ok()) {
        last_logged = grpc::StatusCode::OK;
        continue;
      }
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        std::fprintf(stderr, "loom-worker: the coordinator at %s forgot %s; registering again\n",
                     coordinator.c_str(), response.worker_id().c_str());
        break;
      }
      if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        // The coordinator's cluster secret changed under us (a restart with another):
        // registering again stops this worker with the reason if it is still refused.
        std::fprintf(stderr, "loom-worker: the coordinator at %s refused a heartbeat: %s\n",
                     coordinator.c_str(), status.error_message().c_str());
        break;
      }
      if (SwitchCoordinator(status)) {
        coordinator = target();
        break;
      }
      log_failure("heartbeat", status);
    }
    absl::MutexLock lock(&mu_);
    worker_id_.clear();
    if (stopping_) return;
  }
}

}  // namespace loom::worker
