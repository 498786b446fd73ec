#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/leader_election.h"

namespace loom::coordinator {

struct KubernetesLeaseOptions {
  std::string name;       // the Lease object (coordination.k8s.io/v1) in `ns`
  std::string ns;         // namespace
  std::string identity;   // holderIdentity: the pod's name
  // The pod to label `loom.dev/role: leader|follower` (the Service that clients use selects
  // the leader by it); empty: no label.
  std::string pod_name;
  std::string advertise;  // this coordinator's gRPC address for workers (an annotation)
  // The API server: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT in a pod,
  // or LOOM_KUBERNETES_API_SERVER (e.g. `kubectl proxy`'s http://127.0.0.1:8001).
  std::string api_server;
  std::string
      token_file;       // the bearer token (re-read per request: kubelet rotates it); empty: none
  std::string ca_file;  // the API server's CA (the service account's ca.crt); empty: none
  absl::Duration lease_duration = absl::Seconds(4);  // a silent holder's lease lasts this
  absl::Duration renew_every = absl::Seconds(1);
  absl::Duration retry_every = absl::Milliseconds(500);  // a follower's look at the lease
  absl::Duration request_timeout = absl::Seconds(2);

  /// `name` and `advertise` with the rest from the pod's environment: the service
  /// account's token, CA and namespace (/var/run/secrets/kubernetes.io/serviceaccount, or
  /// LOOM_KUBERNETES_SERVICEACCOUNT_DIR), POD_NAME (else the host name and process id),
  /// POD_NAMESPACE overriding the namespace file. FailedPrecondition outside a pod without
  /// LOOM_KUBERNETES_API_SERVER.
  static absl::StatusOr<KubernetesLeaseOptions> FromEnvironment(std::string name,
                                                                std::string advertise);
};

/// Leader election through a Kubernetes Lease (`loom serve --leader-lease NAME`), the way
/// client-go's leader election works: a follower reads the Lease every `retry_every` and
/// takes it (an update guarded by its resourceVersion) once the holder has not renewed it
/// for `lease_duration` as measured on the follower's own clock (no clock skew matters);
/// the leader renews it every `renew_every`. A leader that cannot renew it within
/// `lease_duration` has lost it and exits (status 75), so that two coordinators never lead
/// at once for longer than that; Kubernetes restarts it as a follower. A leader that stops
/// (SIGTERM: a rolling update) releases the Lease, and a follower takes over within
/// `retry_every`. The leader's advertised address rides on the Lease as the annotation
/// `loom.dev/leader-address`. In a pod, the coordinator labels its pod
/// `loom.dev/role: follower` at start and `leader` once elected (a merge patch), so that a
/// Service can send clients to the leader alone. Thread-safe.
class KubernetesLease final : public LeaderElection {
 public:
  explicit KubernetesLease(KubernetesLeaseOptions options);
  ~KubernetesLease() override;  // stops campaigning; a leader releases the Lease

  void Start(std::function<void()> on_elected) override;
  bool leading() const override { return leading_.load(std::memory_order_acquire); }
  /// Releases the Lease (holder emptied) and labels the pod a follower.
  void Resign() override;
  std::string LeaderAddress() const override;
  std::string Describe() const override { return "--leader-lease " + options_.name; }

 private:
  struct Observed;  // the Lease as last read
  void Run(std::function<void()> on_elected);
  // One follower's look: true once this coordinator holds the Lease.
  bool TryAcquire();
  // The leader's renewal: false when the Lease is someone else's now.
  bool Renew();
  void Release();
  // Labels this pod with `role`; false when the API server refused.
  bool LabelPod(const char* role);
  // Sleeps `duration` or until stopping; false when stopping.
  bool Sleep(absl::Duration duration);

  const KubernetesLeaseOptions options_;
  std::atomic<bool> leading_{false};
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string leader_address_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Observed> observed_;  // the campaign thread's
  std::thread thread_;
};

}  // namespace loom::coordinator
