#include "api/coordinator_server.h"

#include <pthread.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/cluster_secret.h"
#include "common/formats/hf_model.h"
#include "common/formats/model_fingerprint.h"
#include "common/sampling_params.h"
#include "coordinator/kubernetes_lease.h"
#include "coordinator/leader_lock.h"
#include "engine/block_hash.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace loom::api {

namespace {

// --chat-template's value: a file's contents, or the template written inline.
absl::StatusOr<std::string> ReadChatTemplateOption(const std::string& value) {
  std::ifstream file(value, std::ios::binary);
  if (file) {
    std::ostringstream contents;
    contents << file.rdbuf();
    if (!file.bad()) return contents.str();
  }
  if (value.find("{{") != std::string::npos || value.find("{%") != std::string::npos) {
    return value;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "--chat-template: cannot read '%s' (give a Jinja file, or the template itself)", value));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const ServeOptions& options) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->options_ = options;
  engine::SetBlockHashCollisionsForTesting(options.debug_colliding_block_hashes);
  auto gguf = common::OpenModelFile(options.model_path);
  if (!gguf.ok()) return gguf.status();
  server->gguf_ = *std::move(gguf);
  auto config = common::ModelConfigFromGguf(*server->gguf_);
  if (!config.ok()) return config.status();
  server->config_ = *std::move(config);
  if (!options.model_sampling_defaults) server->config_.sampling_defaults = {};
  if (options.max_model_len > 0) {
    if (options.max_model_len > server->config_.context_length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--max-model-len %d is longer than the model's context length %d",
          options.max_model_len, server->config_.context_length));
    }
    server->config_.context_length = options.max_model_len;
  }
  auto tokenizer = common::Tokenizer::FromGguf(*server->gguf_);
  if (!tokenizer.ok()) return tokenizer.status();
  server->tokenizer_ = *std::move(tokenizer);
  server->model_ = MakeServedModel(options.model_path, *server->gguf_, server->config_,
                                   options.served_model_name);
  server->metrics_ = std::make_unique<coordinator::CoordinatorMetrics>(server->model_.id);
  server->metrics_->set_naming(options.metric_naming);
  coordinator::ClusterOptions cluster_options = options.cluster;
  cluster_options.replica.sliding_window = server->config_.WindowOfEveryLayer();
  server->cluster_ =
      std::make_unique<coordinator::Cluster>(cluster_options, server->model_.info.fingerprint());
  absl::StatusOr<ApiKeys> api_keys =
      ApiKeys::Load(options.api_keys, options.api_key_files, std::getenv("LOOM_API_KEY"));
  if (!api_keys.ok()) return api_keys.status();
  if (api_keys->enabled()) {
    std::fprintf(stderr, "loom: API keys required (%zu configured) on the HTTP API and the gRPC "
                 "Inference service\n", api_keys->size());
  }
  // Workers reach the Coordinator service (registration, heartbeats, rendezvous) on the
  // same port without a client key: they present the cluster secret instead
  // (common/cluster_secret.h; docs/ARCHITECTURE.md, "API keys and TLS").
  if (common::ClusterSecretEnabled()) {
    std::fprintf(stderr,
                 "loom: the cluster secret is required of workers (Coordinator "
                 "service)\n");
  } else if (api_keys->enabled()) {
    std::fprintf(stderr,
                 "loom: warning: API keys guard the client APIs, but the Coordinator service "
                 "on the same port takes registrations from anyone who reaches it: give the "
                 "coordinator and its workers a --cluster-secret-file (or "
                 "LOOM_CLUSTER_SECRET)\n");
  }
  server->coordinator_service_ =
      std::make_unique<coordinator::CoordinatorService>(*server->cluster_);
  if (!options.chat_template.empty()) {
    absl::StatusOr<std::string> source = ReadChatTemplateOption(options.chat_template);
    if (!source.ok()) return source.status();
    auto chat_template = common::ChatTemplate::Parse(*source);
    if (!chat_template.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--chat-template: not a template Loom can render: %s", chat_template.status().message()));
    }
    server->chat_template_ = *std::move(chat_template);
  } else if (auto source = server->gguf_->GetString("tokenizer.chat_template"); source.ok()) {
    auto chat_template = common::ChatTemplate::Parse(*source);
    if (chat_template.ok()) {
      server->chat_template_ = *std::move(chat_template);
    } else {
      std::fprintf(stderr, "loom: the model's chat template is not usable (%s); "
                   "/v1/chat/completions will answer 400 and gRPC chats FAILED_PRECONDITION\n",
                   chat_template.status().ToString().c_str());
    }
  }
  server->inference_service_ = std::make_unique<InferenceService>(
      *server->cluster_, server->model_, server->config_, *server->tokenizer_,
      server->metrics_.get(), options.stream_interval, *api_keys);
  server->inference_service_->set_chat_template(server->chat_template_.get());
  server->inference_service_->set_reasoning_format(options.http.reasoning);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrFormat("%s:%d", options.host, options.grpc_port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->coordinator_service_.get());
  builder.RegisterService(server->inference_service_.get());
  // Long streams through proxies and load balancers: ping idle connections every 30 s
  // (a dead peer is noticed within 30 + 10 s and its requests cancelled), and accept the
  // clients' own keep-alive pings (down to every 10 s, even between calls) instead of
  // answering them with GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // The sync methods hold a thread of the server each while they run (Generate streams use
  // the callback API and hold none).
  grpc::ResourceQuota quota("loom-coordinator");
  quota.SetMaxThreads(4096);
  builder.SetResourceQuota(quota);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrFormat("cannot listen on %s", address));
  }
  if (!options.leader_lock.empty() && !options.leader_lease.empty()) {
    return absl::InvalidArgumentError("--leader-lock and --leader-lease: give one or neither");
  }
  if (!options.leader_lock.empty() || !options.leader_lease.empty()) {
    const std::string advertise = options.advertise_address.empty()
                                      ? absl::StrFormat("%s:%d", options.host, server->port_)
                                      : options.advertise_address;
    if (!options.leader_lock.empty()) {
      auto lock = coordinator::LeaderLock::Open(options.leader_lock, advertise);
      if (!lock.ok()) return lock.status();
      server->leader_election_ = *std::move(lock);
    } else {
      auto lease =
          coordinator::KubernetesLeaseOptions::FromEnvironment(options.leader_lease, advertise);
      if (!lease.ok()) return lease.status();
      server->leader_election_ = std::make_unique<coordinator::KubernetesLease>(*lease);
    }
    server->coordinator_service_->set_leader_election(server->leader_election_.get());
    server->inference_service_->set_leader_election(server->leader_election_.get());
    std::printf("loom: leader election through %s: following until elected\n",
                server->leader_election_->Describe().c_str());
    std::fflush(stdout);
    server->leader_election_->Start([advertise] {
      std::printf("loom: leading (workers register at %s)\n", advertise.c_str());
      std::fflush(stdout);
    });
  }
  if (options.http.port >= 0) {
    HttpOptions http = options.http;
    http.leader_election = server->leader_election_.get();
    http.host = options.host;
    http.stream_interval = options.stream_interval;
    http.api_keys = *api_keys;
    auto started = HttpServer::Start(http, *server->cluster_, server->model_, server->config_,
                                     *server->tokenizer_, server->chat_template_.get(),
                                     *server->metrics_);
    if (!started.ok()) return started.status();
    server->http_ = *std::move(started);
  }
  if (options.endpoint_picker_port >= 0) {
    if (absl::Status started = server->StartEndpointPicker(); !started.ok()) return started;
  }
  server->UpdateHealth();
  return server;
}

absl::Status CoordinatorServer::StartEndpointPicker() {
  if (http_ == nullptr) {
    return absl::InvalidArgumentError(
        "--endpoint-picker-port needs the HTTP API (the endpoint it picks); --http-port is off");
  }
  // The pool's endpoints name this coordinator by the address it advertises.
  std::string self_host = options_.host;
  if (!options_.advertise_address.empty()) {
    self_host = options_.advertise_address.substr(0, options_.advertise_address.rfind(':'));
  }
  if (self_host == "0.0.0.0" || self_host == "::" || self_host.empty()) {
    return absl::InvalidArgumentError(
        "--endpoint-picker-port: give --advertise-address HOST:PORT (the address the "
        "InferencePool's endpoints have); --host binds every address");
  }
  endpoint_picker_ = std::make_unique<EndpointPicker>(*cluster_, model_, config_, *tokenizer_,
                                                      chat_template_.get(), leader_election_.get(),
                                                      self_host, http_->port(), metrics_.get());
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options_.http.ssl_certfile.empty()) {
    // The gateway reaches the picker over TLS with the HTTP API's certificate.
    auto read = [](const std::string& path) -> absl::StatusOr<std::string> {
      std::ifstream file(path, std::ios::binary);
      if (!file) return absl::NotFoundError(absl::StrFormat("cannot read '%s'", path));
      return std::string(std::istreambuf_iterator<char>(file), {});
    };
    absl::StatusOr<std::string> cert = read(options_.http.ssl_certfile);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = read(options_.http.ssl_keyfile);
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    credentials = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  const std::string address =
      absl::StrFormat("%s:%d", options_.host, options_.endpoint_picker_port);
  builder.AddListeningPort(address, credentials, &endpoint_picker_port_);
  builder.RegisterService(endpoint_picker_.get());
  endpoint_picker_server_ = builder.BuildAndStart();
  if (endpoint_picker_server_ == nullptr || endpoint_picker_port_ == 0) {
    return absl::UnavailableError(absl::StrFormat("cannot listen on %s", address));
  }
  std::printf("loom: endpoint picker (Envoy ext_proc) on %s:%d, picking %s:%d\n",
              options_.host.c_str(), endpoint_picker_port_, self_host.c_str(), http_->port());
  std::fflush(stdout);
  return absl::OkStatus();
}

CoordinatorServer::~CoordinatorServer() { DrainAndStop(); }

std::string CoordinatorServer::address() const {
  return absl::StrFormat("%s:%d", options_.host, port_);
}

void CoordinatorServer::BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int CoordinatorServer::WaitForShutdownSignal(const std::function<void()>& tick) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  const timespec period{0, 200 * 1000 * 1000};
  while (true) {
    const int signal = sigtimedwait(&set, nullptr, &period);
    if (signal == SIGTERM || signal == SIGINT) return signal;
    UpdateHealth();
    if (tick) tick();
  }
}

void CoordinatorServer::UpdateHealth() {
  const bool serving = cluster_->num_healthy() > 0 && !cluster_->draining();
  if (health_known_ && serving == serving_) return;
  health_known_ = server_ != nullptr;
  serving_ = serving;
  if (grpc::HealthCheckServiceInterface* health = server_ ? server_->GetHealthCheckService()
                                                          : nullptr) {
    health->SetServingStatus(serving);
    health->SetServingStatus("loom.v1.Inference", serving);
  }
}

void CoordinatorServer::DrainAndStop() {
  if (server_ == nullptr) return;
  if (leader_election_ != nullptr && leader_election_->leading()) {
    // Standby coordinators: hand over first, so that the cluster serves on while this one
    // stops (draining while still leading would refuse every new request until it exits).
    // The workers follow the new leader; what runs here then ends with a retryable error.
    std::fprintf(stderr, "loom: handing leadership over (%s) before stopping\n",
                 leader_election_->Describe().c_str());
    leader_election_->Resign();
  }
  cluster_->StartDrain();
  UpdateHealth();
  if (!cluster_->WaitIdle(options_.drain_timeout)) {
    std::fprintf(stderr, "loom: drain timeout: aborting the requests still running\n");
  }
  cluster_->Stop();
  if (endpoint_picker_server_ != nullptr) {
    endpoint_picker_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    endpoint_picker_server_->Wait();
  }
  if (http_ != nullptr) http_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

}  // namespace loom::api
