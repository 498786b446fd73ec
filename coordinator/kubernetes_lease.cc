#include "coordinator/kubernetes_lease.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace loom::coordinator {
namespace {

using Json = nlohmann::json;

constexpr char kAddressAnnotation[] = "loom.dev/leader-address";

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return std::string(absl::StripAsciiWhitespace(text.str()));
}

// Kubernetes' MicroTime: RFC 3339 with microseconds, UTC.
std::string MicroTime(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone());
}

struct Response {
  int status = 0;  // 0: no answer
  Json body;
};

}  // namespace

absl::StatusOr<KubernetesLeaseOptions> KubernetesLeaseOptions::FromEnvironment(
    std::string name, std::string advertise) {
  KubernetesLeaseOptions options;
  options.name = std::move(name);
  options.advertise = std::move(advertise);
  const char* dir_env = std::getenv("LOOM_KUBERNETES_SERVICEACCOUNT_DIR");
  const std::string dir =
      dir_env != nullptr ? dir_env : "/var/run/secrets/kubernetes.io/serviceaccount";
  if (const char* server = std::getenv("LOOM_KUBERNETES_API_SERVER"); server != nullptr) {
    options.api_server = server;
  } else if (const char* host = std::getenv("KUBERNETES_SERVICE_HOST"); host != nullptr) {
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    options.api_server = absl::StrFormat("https://%s:%s", host, port != nullptr ? port : "443");
  } else {
    return absl::FailedPreconditionError(
        "--leader-lease needs the Kubernetes API: run in a pod (KUBERNETES_SERVICE_HOST) or "
        "set LOOM_KUBERNETES_API_SERVER (e.g. kubectl proxy's http://127.0.0.1:8001)");
  }
  if (std::ifstream(dir + "/token").good()) options.token_file = dir + "/token";
  if (std::ifstream(dir + "/ca.crt").good()) options.ca_file = dir + "/ca.crt";
  if (const char* ns = std::getenv("POD_NAMESPACE"); ns != nullptr && *ns != '\0') {
    options.ns = ns;
  } else {
    options.ns = ReadFile(dir + "/namespace");
  }
  if (options.ns.empty()) options.ns = "default";
  if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && *pod != '\0') {
    options.identity = pod;
    options.pod_name = pod;
  } else {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    options.identity = absl::StrFormat("%s-%d", host, ::getpid());
  }
  return options;
}

// The Lease as this coordinator last read or wrote it.
struct KubernetesLease::Observed {
  Json object;  // the whole object (an update sends it back)
  std::string resource_version;
  absl::Time changed_at = absl::InfinitePast();  // local time its version last changed
};

namespace {

// One request to the API server; status 0 when it did not answer.
Response Call(const KubernetesLeaseOptions& options, const std::string& method,
              const std::string& path, const Json* body) {
  httplib::Client client(options.api_server);
  const auto timeout = absl::ToChronoMilliseconds(options.request_timeout);
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  if (!options.ca_file.empty()) client.set_ca_cert_path(options.ca_file.c_str());
  httplib::Headers headers = {{"Accept", "application/json"}};
  if (!options.token_file.empty()) {
    headers.emplace("Authorization", "Bearer " + ReadFile(options.token_file));
  }
  httplib::Result result =
      method == "GET"    ? client.Get(path, headers)
      : method == "POST" ? client.Post(path, headers, body->dump(), "application/json")
      : method == "PATCH"
          ? client.Patch(path, headers, body->dump(), "application/merge-patch+json")
          : client.Put(path, headers, body->dump(), "application/json");
  Response response;
  if (!result) return response;
  response.status = result->status;
  response.body = Json::parse(result->body, nullptr, /*allow_exceptions=*/false);
  return response;
}

std::string LeasesPath(const KubernetesLeaseOptions& options) {
  return absl::StrFormat("/apis/coordination.k8s.io/v1/namespaces/%s/leases", options.ns);
}

}  // namespace

KubernetesLease::KubernetesLease(KubernetesLeaseOptions options)
    : options_(std::move(options)), observed_(std::make_unique<Observed>()) {}

KubernetesLease::~KubernetesLease() { Resign(); }

void KubernetesLease::Resign() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();  // a leader's loop releases the Lease as it ends
  leading_.store(false, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  leader_address_.clear();
}

void KubernetesLease::Start(std::function<void()> on_elected) {
  thread_ = std::thread([this, on_elected = std::move(on_elected)] { Run(on_elected); });
}

std::string KubernetesLease::LeaderAddress() const {
  absl::MutexLock lock(&mu_);
  return leader_address_;
}

bool KubernetesLease::Sleep(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), duration);
  return !stopping_;
}

bool KubernetesLease::TryAcquire() {
  const std::string path = LeasesPath(options_) + "/" + options_.name;
  const Response got = Call(options_, "GET", path, nullptr);
  const absl::Time now = absl::Now();
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(options_.lease_duration));
  if (got.status == 404) {
    Json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                  {"kind", "Lease"},
                  {"metadata",
                   {{"name", options_.name},
                    {"namespace", options_.ns},
                    {"annotations", {{kAddressAnnotation, options_.advertise}}}}},
                  {"spec",
                   {{"holderIdentity", options_.identity},
                    {"leaseDurationSeconds", seconds},
                    {"acquireTime", MicroTime(now)},
                    {"renewTime", MicroTime(now)},
                    {"leaseTransitions", 0}}}};
    const Response created = Call(options_, "POST", LeasesPath(options_), &lease);
    if (created.status != 201 && created.status != 200) return false;
    observed_->object = created.body;
    observed_->resource_version = created.body["metadata"].value("resourceVersion", "");
    observed_->changed_at = now;
    return true;
  }
  if (got.status != 200 || !got.body.is_object()) {
    std::fprintf(stderr, "loom: the leader lease %s/%s could not be read (HTTP %d)\n",
                 options_.ns.c_str(), options_.name.c_str(), got.status);
    return false;
  }
  const Json& spec = got.body.value("spec", Json::object());
  const std::string version = got.body["metadata"].value("resourceVersion", "");
  if (version != observed_->resource_version) {
    observed_->resource_version = version;
    observed_->changed_at = now;
  }
  observed_->object = got.body;
  const std::string holder = spec.value("holderIdentity", "");
  {
    const Json annotations = got.body["metadata"].value("annotations", Json::object());
    absl::MutexLock lock(&mu_);
    leader_address_ = holder.empty() ? "" : annotations.value(kAddressAnnotation, "");
  }
  const absl::Duration held_for =
      absl::Seconds(spec.value("leaseDurationSeconds", static_cast<int64_t>(seconds)));
  // Someone else's, renewed within its duration (on this clock): follow.
  if (!holder.empty() && holder != options_.identity && now < observed_->changed_at + held_for) {
    return false;
  }
  Json lease = got.body;
  lease["metadata"]["annotations"][kAddressAnnotation] = options_.advertise;
  lease["spec"]["holderIdentity"] = options_.identity;
  lease["spec"]["leaseDurationSeconds"] = seconds;
  lease["spec"]["acquireTime"] = MicroTime(now);
  lease["spec"]["renewTime"] = MicroTime(now);
  if (holder != options_.identity) {
    lease["spec"]["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
  }
  const Response taken = Call(options_, "PUT", path, &lease);  // 409 when another won
  if (taken.status != 200) return false;
  observed_->object = taken.body;
  observed_->resource_version = taken.body["metadata"].value("resourceVersion", "");
  observed_->changed_at = now;
  return true;
}

bool KubernetesLease::Renew() {
  Json lease = observed_->object;
  lease["spec"]["renewTime"] = MicroTime(absl::Now());
  const Response renewed =
      Call(options_, "PUT", LeasesPath(options_) + "/" + options_.name, &lease);
  if (renewed.status != 200) return false;
  observed_->object = renewed.body;
  observed_->resource_version = renewed.body["metadata"].value("resourceVersion", "");
  return renewed.body["spec"].value("holderIdentity", "") == options_.identity;
}

void KubernetesLease::Release() {
  Json lease = observed_->object;
  lease["spec"]["holderIdentity"] = "";
  lease["spec"]["renewTime"] = MicroTime(absl::Now());
  Call(options_, "PUT", LeasesPath(options_) + "/" + options_.name, &lease);
}

bool KubernetesLease::LabelPod(const char* role) {
  if (options_.pod_name.empty()) return true;
  const Json patch = {{"metadata", {{"labels", {{"loom.dev/role", role}}}}}};
  const Response patched = Call(
      options_, "PATCH",
      absl::StrFormat("/api/v1/namespaces/%s/pods/%s", options_.ns, options_.pod_name), &patch);
  if (patched.status == 200) return true;
  std::fprintf(stderr, "loom: cannot label pod %s/%s loom.dev/role=%s (HTTP %d)\n",
               options_.ns.c_str(), options_.pod_name.c_str(), role, patched.status);
  return false;
}

void KubernetesLease::Run(std::function<void()> on_elected) {
  // A restarted container keeps its pod's labels: say "follower" before anything else.
  LabelPod("follower");
  while (!TryAcquire()) {
    if (!Sleep(options_.retry_every)) return;
  }
  {
    absl::MutexLock lock(&mu_);
    leader_address_ = options_.advertise;
  }
  leading_.store(true, std::memory_order_release);
  bool labelled = LabelPod("leader");
  on_elected();
  absl::Time renewed_at = absl::Now();
  while (Sleep(options_.renew_every)) {
    if (!labelled) labelled = LabelPod("leader");
    if (Renew()) {
      renewed_at = absl::Now();
      continue;
    }
    if (absl::Now() - renewed_at >= options_.lease_duration) {
      // Another coordinator may lead by now: this one must not go on as a leader.
      std::fprintf(stderr,
                   "loom: lost the leader lease %s/%s (not renewed for %s); exiting so that "
                   "one coordinator leads (it restarts as a follower)\n",
                   options_.ns.c_str(), options_.name.c_str(),
                   absl::FormatDuration(absl::Now() - renewed_at).c_str());
      std::fflush(stderr);
      std::_Exit(75);
    }
  }
  Release();  // stopping: a follower takes over at its next look
  leading_.store(false, std::memory_order_release);
  LabelPod("follower");  // the clients' Service turns to the next leader
}

}  // namespace loom::coordinator
