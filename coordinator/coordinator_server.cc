#include "coordinator/coordinator_server.h"

#include <pthread.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/hf_model.h"
#include "common/model_fingerprint.h"
#include "coordinator/block_hash.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "worker/step_executor.h"

namespace loom::coordinator {

const char kServeFlagsHelp[] =
    "  --served-model-name NAME     the model id clients use (default: the file's stem)\n"
    "  --host ADDR                  listen address (default 127.0.0.1)\n"
    "  --grpc-port N                gRPC port (default 50051; 0: any free port)\n"
    "  --http-port N                OpenAI-compatible HTTP port (default 8000; 0: any free "
    "port; -1: off)\n"
    "  --http-threads N             HTTP handler threads: open requests served at once "
    "(default 512)\n"
    "  --max-num-seqs N             running sequences per replica (default 256)\n"
    "  --max-num-batched-tokens N   tokens per step (default 512)\n"
    "  --max-waiting N              waiting requests per replica before RESOURCE_EXHAUSTED "
    "(default 1024)\n"
    "  --max-plans-in-flight 1|2    step plans sent ahead of results (default 2)\n"
    "  --stream-interval-ms MS      a stream's messages go out at most once per MS (the "
    "first\n"
    "                               and the last at once); tokens that come sooner share "
    "the\n"
    "                               next message. 0: one per step (default 10)\n"
    "  --step-timeout-ms MS         no-progress timeout: a worker whose running step reports\n"
    "                               no progress for this long is stuck (default 30000; the\n"
    "                               limit grows with the step's expected time per unit of\n"
    "                               progress; a step that progresses is never cut off)\n"
    "  --heartbeat-timeout-ms MS    a worker silent this long is dead (default 5000)\n"
    "  --drain-timeout-s S          on SIGTERM, wait this long for requests (default 30)\n"
    "  --prefix-caching on|off      reuse cached KV blocks of shared prefixes (default on)\n"
    "  --speculative-tokens K       speculative decoding (n-gram lookup, or the worker's draft\n"
    "                               model): drafts per step at most, 0 = off (default 0);\n"
    "                               requests override with num_speculative_tokens\n"
    "  --speculative-adaptive on|off  pick each step's drafts from the measured acceptance\n"
    "                               and step cost, off when it does not pay (default on)\n"
    "  --routing POLICY             prefix (default), round-robin or least-loaded\n"
    "  --router-load-weight W       prefix routing: score weight per token of load (default "
    "0.5)\n"
    "  --router-balance-threshold N prefix routing: load (tokens) above the least-loaded "
    "replica\n"
    "                               past which load wins (default 4096)\n"
    "  --debug-colliding-block-hashes on|off  tests only: all prefix-cache block hashes\n"
    "                               collide; hits are still verified (default off)\n";

bool ParseServeFlag(const std::string& flag, const std::string& value, ServeOptions& options,
                    std::string& error) {
  int64_t number = 0;
  auto need_number = [&](int64_t min, int64_t max) {
    if (!absl::SimpleAtoi(value, &number) || number < min || number > max) {
      error = absl::StrFormat("%s needs an integer in [%d, %d], got '%s'", flag, min, max, value);
      return false;
    }
    return true;
  };
  ReplicaOptions& replica = options.cluster.replica;
  if (flag == "--model") {
    options.model_path = value;
  } else if (flag == "--served-model-name") {
    if (value.empty()) {
      error = "--served-model-name needs a non-empty name";
      return true;
    }
    options.served_model_name = value;
  } else if (flag == "--host") {
    options.host = value;
  } else if (flag == "--grpc-port") {
    if (need_number(0, 65535)) options.grpc_port = static_cast<int>(number);
  } else if (flag == "--http-port") {
    if (need_number(-1, 65535)) options.http.port = static_cast<int>(number);
  } else if (flag == "--http-threads") {
    if (need_number(1, 1 << 16)) options.http.threads = static_cast<int>(number);
  } else if (flag == "--max-num-seqs") {
    if (need_number(1, 1 << 16)) replica.max_num_seqs = static_cast<int32_t>(number);
  } else if (flag == "--max-num-batched-tokens") {
    if (need_number(1, 1 << 20)) replica.max_num_batched_tokens = number;
  } else if (flag == "--max-waiting") {
    if (need_number(0, 1 << 24)) replica.max_waiting = number;
  } else if (flag == "--max-plans-in-flight") {
    if (need_number(1, 2)) replica.max_plans_in_flight = static_cast<int>(number);
  } else if (flag == "--stream-interval-ms") {
    if (need_number(0, 10000)) options.stream_interval = absl::Milliseconds(number);
  } else if (flag == "--step-timeout-ms") {
    if (need_number(1, 3600000)) replica.liveness.no_progress_timeout = absl::Milliseconds(number);
  } else if (flag == "--heartbeat-timeout-ms") {
    if (need_number(1, 3600000)) options.cluster.heartbeat_timeout = absl::Milliseconds(number);
  } else if (flag == "--drain-timeout-s") {
    if (need_number(0, 86400)) options.drain_timeout = absl::Seconds(number);
  } else if (flag == "--prefix-caching") {
    // A value (not a bare --no-prefix-caching) because the CLIs take every flag as a pair.
    if (value == "on" || value == "off") {
      replica.enable_prefix_caching = value == "on";
    } else {
      error = absl::StrFormat("--prefix-caching needs on or off, got '%s'", value);
    }
  } else if (flag == "--speculative-tokens") {
    if (need_number(0, worker::kMaxSpeculativeTokens)) {
      replica.speculation.num_speculative_tokens = static_cast<int32_t>(number);
    }
  } else if (flag == "--speculative-adaptive") {
    if (value == "on" || value == "off") {
      replica.speculation.adaptive = value == "on";
    } else {
      error = absl::StrFormat("--speculative-adaptive needs on or off, got '%s'", value);
    }
  } else if (flag == "--routing") {
    absl::StatusOr<RoutingPolicy> policy = ParseRoutingPolicy(value);
    if (policy.ok()) {
      options.cluster.router.policy = *policy;
    } else {
      error = std::string(policy.status().message());
    }
  } else if (flag == "--router-load-weight") {
    double weight = 0;
    if (absl::SimpleAtod(value, &weight) && weight >= 0 && weight <= 1000) {
      options.cluster.router.load_weight = weight;
    } else {
      error = absl::StrFormat("--router-load-weight needs a number in [0, 1000], got '%s'", value);
    }
  } else if (flag == "--debug-colliding-block-hashes") {
    if (value == "on" || value == "off") {
      options.debug_colliding_block_hashes = value == "on";
    } else {
      error = absl::StrFormat("--debug-colliding-block-hashes needs on or off, got '%s'", value);
    }
  } else if (flag == "--router-balance-threshold") {
    if (need_number(0, int64_t{1} << 40)) options.cluster.router.balance_threshold_tokens = number;
  } else {
    return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const ServeOptions& options) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->options_ = options;
  SetBlockHashCollisionsForTesting(options.debug_colliding_block_hashes);
  auto gguf = common::OpenModelFile(options.model_path);
  if (!gguf.ok()) return gguf.status();
  server->gguf_ = *std::move(gguf);
  auto config = common::ModelConfigFromGguf(*server->gguf_);
  if (!config.ok()) return config.status();
  server->config_ = *std::move(config);
  auto tokenizer = common::Tokenizer::FromGguf(*server->gguf_);
  if (!tokenizer.ok()) return tokenizer.status();
  server->tokenizer_ = *std::move(tokenizer);
  server->model_ = MakeServedModel(options.model_path, *server->gguf_, server->config_,
                                   options.served_model_name);
  server->metrics_ = std::make_unique<CoordinatorMetrics>(server->model_.id);
  server->cluster_ = std::make_unique<Cluster>(options.cluster, server->model_.info.fingerprint());
  server->coordinator_service_ = std::make_unique<CoordinatorService>(*server->cluster_);
  if (auto source = server->gguf_->GetString("tokenizer.chat_template"); source.ok()) {
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
      server->metrics_.get(), options.stream_interval);
  server->inference_service_->set_chat_template(server->chat_template_.get());

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
  if (options.http.port >= 0) {
    HttpOptions http = options.http;
    http.host = options.host;
    http.stream_interval = options.stream_interval;
    auto started = HttpServer::Start(http, *server->cluster_, server->model_, server->config_,
                                     *server->tokenizer_, server->chat_template_.get(),
                                     *server->metrics_);
    if (!started.ok()) return started.status();
    server->http_ = *std::move(started);
  }
  server->UpdateHealth();
  return server;
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
  cluster_->StartDrain();
  UpdateHealth();
  if (!cluster_->WaitIdle(options_.drain_timeout)) {
    std::fprintf(stderr, "loom: drain timeout: aborting the requests still running\n");
  }
  cluster_->Stop();
  if (http_ != nullptr) http_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

}  // namespace loom::coordinator
