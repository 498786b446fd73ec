#pragma once

#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/endpoint_picker.h"
#include "api/http_server.h"
#include "api/inference_service.h"
#include "common/formats/gguf_file.h"
#include "common/formats/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/leader_election.h"
#include "coordinator/metric_naming.h"
#include "grpcpp/grpcpp.h"

namespace loom::api {

struct ServeOptions {
  std::string model_path;
  std::string served_model_name;  // empty: the GGUF file's stem
  // --chat-template (vLLM's): a Jinja file that replaces the model's chat template, or
  // the template itself when no such file exists and it holds `{{` or `{%`. Empty: the
  // model's.
  std::string chat_template;
  std::string host = "127.0.0.1";
  int grpc_port = 50051;  // 0: any free port
  HttpOptions http;       // host is `host`
  coordinator::ClusterOptions cluster;
  absl::Duration drain_timeout = absl::Seconds(30);
  // The least time between two messages of one stream, gRPC and HTTP alike (the first
  // and the final ones go out at once): one handler wakeup then carries several tokens.
  absl::Duration stream_interval = absl::Milliseconds(10);  // --stream-interval-ms
  // Tests only: every prefix-cache block hash ignores its tokens (forced collisions,
  // which hit verification must catch). --debug-colliding-block-hashes on|off.
  bool debug_colliding_block_hashes = false;
  // API keys (api/api_keys.h): --api-key (repeatable) and the keys of each
  // --api-key-file; neither given: LOOM_API_KEY. None: the APIs are open.
  std::vector<std::string> api_keys;
  std::vector<std::string> api_key_files;
  // --cluster-secret-file: what the workers and this coordinator present to each other
  // (common/cluster_secret.h); installed by the command before Start. Empty:
  // LOOM_CLUSTER_SECRET, else none.
  std::string cluster_secret_file;
  // --generation-config auto|vllm (vLLM's): auto applies the model's generation_config.json
  // sampling defaults to requests that leave a field unset; vllm ignores them.
  bool model_sampling_defaults = true;
  // The context length served (prompt + generated tokens), at most the model's; 0: the
  // model's own (--max-model-len).
  int64_t max_model_len = 0;
  // --metrics-naming loom|vllm|both: the names /metrics serves (coordinator/metric_naming.h).
  coordinator::MetricNaming metric_naming = coordinator::MetricNaming::kBoth;
  // --leader-lock PATH: high availability: coordinators sharing PATH elect one leader
  // (coordinator/leader_lock.h); the others follow until it goes. Empty: standalone.
  std::string leader_lock;
  // --leader-lease NAME: the same through a Kubernetes Lease in the pod's namespace
  // (coordinator/kubernetes_lease.h). Exclusive with leader_lock.
  std::string leader_lease;
  // --advertise-address HOST:PORT: where workers reach this coordinator's gRPC port when it
  // leads (written into the lock or Lease for followers' redirects). Empty: host:port as
  // bound.
  std::string advertise_address;
  // --endpoint-picker-port: the Gateway API Inference Extension's endpoint picker (Envoy
  // ext_proc, api/endpoint_picker) on this port; -1: off, 0: any free port.
  int endpoint_picker_port = -1;
};

/// The coordinator's command-line flags are declared in cli/serve_flags.h.

/// The coordinator process: the model's tokenizer and configuration, the Cluster, and the
/// gRPC server (Inference for clients, Coordinator for workers, grpc.health.v1 and
/// reflection). Signals: call BlockShutdownSignals() before any thread starts, then
/// WaitForShutdownSignal() in the main thread.
class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const ServeOptions& options);
  ~CoordinatorServer();

  /// The port the gRPC server listens on.
  int port() const { return port_; }
  /// The endpoint picker's port, 0 when it is off.
  int endpoint_picker_port() const { return endpoint_picker_port_; }
  /// The HTTP server's port, 0 when it is off.
  int http_port() const { return http_ != nullptr ? http_->port() : 0; }
  std::string address() const;
  coordinator::Cluster& cluster() { return *cluster_; }
  const ServedModel& model() const { return model_; }
  const ServeOptions& options() const { return options_; }
  coordinator::CoordinatorMetrics& metrics() { return *metrics_; }

  /// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it starts).
  static void BlockShutdownSignals();
  /// Waits for SIGTERM/SIGINT, calling `tick` about every 200 ms (keeps the health
  /// service current). Returns the signal.
  int WaitForShutdownSignal(const std::function<void()>& tick);
  /// Stops admitting (UNAVAILABLE), waits for in-flight requests up to the drain timeout,
  /// aborts the rest, and stops the gRPC server.
  void DrainAndStop();

 private:
  CoordinatorServer() = default;
  void UpdateHealth();

  // The endpoint picker's own gRPC server (options_.endpoint_picker_port).
  absl::Status StartEndpointPicker();

  ServeOptions options_;
  std::unique_ptr<common::GgufFile> gguf_;
  common::ModelConfig config_;
  ServedModel model_;
  std::unique_ptr<common::Tokenizer> tokenizer_;
  std::unique_ptr<coordinator::Cluster> cluster_;
  std::unique_ptr<coordinator::LeaderElection> leader_election_;  // null: standalone
  std::unique_ptr<coordinator::CoordinatorService> coordinator_service_;
  std::unique_ptr<InferenceService> inference_service_;
  std::unique_ptr<common::ChatTemplate> chat_template_;  // null: the model has none
  std::unique_ptr<coordinator::CoordinatorMetrics> metrics_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<EndpointPicker> endpoint_picker_;
  std::unique_ptr<grpc::Server> endpoint_picker_server_;
  int endpoint_picker_port_ = 0;
  int port_ = 0;
  bool serving_ = false;
  bool health_known_ = false;  // the health service was told `serving_`
};

}  // namespace loom::api
