#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/worker.grpc.pb.h"

namespace loom::worker {

struct RegistrationOptions {
  // host:port of the Coordinator service, or several comma-separated (coordinators that
  // share a leader lock: the worker registers with the one that leads).
  std::string coordinator_address;
  loom::v1::RegisterRequest request;  // sent as is, but protocol_version is always ours
  absl::Duration initial_backoff = absl::Milliseconds(100);  // doubles after each failure
  absl::Duration max_backoff = absl::Seconds(2);
  absl::Duration rpc_timeout = absl::Seconds(5);  // per Register / Heartbeat call
  // Called with each registration's request before it is sent (the worker ends its step
  // stream and reports the KV blocks it holds); may be empty.
  std::function<void(loom::v1::RegisterRequest&)> prepare;
};

/// The worker's side of the Coordinator service, on a background thread: Register
/// (retried with backoff until it succeeds), then Heartbeat every interval the
/// coordinator asked for. NOT_FOUND on a heartbeat (the coordinator forgot this worker,
/// e.g. it restarted) registers again; other heartbeat errors are retried at the same
/// interval (UNAUTHENTICATED registers again). FAILED_PRECONDITION (wrong protocol version
/// or model) or UNAUTHENTICATED (not the coordinator's cluster secret) on Register is fatal: the
/// thread stops and fatal_status() says why. High availability: when a call fails UNAVAILABLE or
/// DEADLINE_EXCEEDED, the worker turns to the leader a follower named (trailing metadata
/// `loom-leader`), else to the next coordinator of the list, and registers there (the new leader's
/// step stream then replaces the old one's). Thread-safe.
class WorkerRegistration {
 public:
  /// Fills a heartbeat's worker state (num_sequences, progress) on the background thread
  /// before each heartbeat; it must not wait for the computing thread.
  using DescribeFn = std::function<void(loom::v1::HeartbeatRequest&)>;

  /// `describe` (may be empty: nothing but the worker id and pool size is reported).
  WorkerRegistration(RegistrationOptions options, DescribeFn describe);
  /// Stops the thread.
  ~WorkerRegistration();

  WorkerRegistration(const WorkerRegistration&) = delete;
  WorkerRegistration& operator=(const WorkerRegistration&) = delete;

  /// Starts the background thread (once).
  void Start();
  /// Stops the thread, cancelling a call in flight; returns when it has exited.
  void Stop();

  /// The coordinator's refusal (FAILED_PRECONDITION) once it happened, else OK.
  absl::Status fatal_status() const;
  /// The worker id of the current registration, empty while unregistered.
  std::string worker_id() const;
  /// Successful Register calls so far.
  int64_t num_registrations() const;
  /// Asks the coordinator to drain this worker's replica and waits (at most `timeout`,
  /// plus the RPC timeout for the answer) until it holds no request; returns the
  /// requests left. Keeps heartbeating meanwhile
  /// (call it before Stop()). A registration in flight is waited for (at most the RPC
  /// timeout); FailedPrecondition if the worker is still unregistered after that.
  absl::StatusOr<int64_t> Drain(absl::Duration timeout);

 private:
  void Run();
  // Sleeps `duration` or until Stop; false when stopping.
  bool Sleep(absl::Duration duration);
  // One RPC with the stop-cancellable context.
  grpc::Status Register(loom::v1::RegisterResponse& response);
  grpc::Status Heartbeat(const std::string& worker_id);
  // After a failed call: the leader a follower named, if any.
  void NoteLeader(const grpc::ClientContext& context, const grpc::Status& status);
  // Turns to another coordinator after `status` (the named leader, else the next of the
  // list); false when there is none to turn to.
  bool SwitchCoordinator(const grpc::Status& status);
  void Connect(const std::string& address);
  std::shared_ptr<loom::v1::Coordinator::Stub> stub() const;
  std::string target() const;

  const RegistrationOptions options_;
  const DescribeFn describe_;
  const std::vector<std::string> addresses_;  // the list given
  size_t next_ = 0;                           // registration thread: the next to try
  std::string leader_hint_;                   // registration thread: from a follower
  absl::Time last_switch_log_ = absl::InfinitePast();  // registration thread
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::shared_ptr<loom::v1::Coordinator::Stub> stub_ ABSL_GUARDED_BY(mu_);
  std::string target_ ABSL_GUARDED_BY(mu_);  // the coordinator stub_ calls
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // the RPC in flight
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  int64_t num_registrations_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace loom::worker
