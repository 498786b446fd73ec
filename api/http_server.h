#pragma once

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/api_keys.h"
#include "api/openai_service.h"
#include "api/pooling_service.h"
#include "api/responses_api.h"
#include "api/served_model.h"
#include "common/jinja/chat_template.h"
#include "coordinator/cluster.h"
#include "coordinator/metrics.h"
#include "httplib.h"

namespace loom::api {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port; -1: no HTTP server
  // Each open request (a stream holds one for its whole life) takes a thread.
  int threads = 512;
  size_t max_body_bytes = size_t{32} << 20;  // 413 beyond
  // A choice's output goes out at most once per interval (the first and the final
  // pieces at once); tokens that come sooner share the next chunk. 0: every batch.
  absl::Duration stream_interval = absl::ZeroDuration();
  // Requests other than GET /health, /ready and /metrics must carry one of these keys.
  ApiKeys api_keys;
  // PEM files: both set, the port serves HTTPS (TLS) only; neither: plain HTTP.
  std::string ssl_certfile;
  std::string ssl_keyfile;
  // vLLM's --seed: the seeds of requests that set none come from this seed (a
  // reproducible run); unset: from the operating system's entropy.
  std::optional<uint64_t> seed;
  // --reasoning-parser: chat replies' <think> part as `reasoning_content`.
  ReasoningFormat reasoning = ReasoningFormat::kNone;
};

/// The coordinator's HTTP server (cpp-httplib, a thread pool of blocking handlers: SSE
/// streams are long blocking writes, which its thread-per-request model serves simply):
/// the OpenAI-compatible API plus GET /health (200 only while a replica can serve),
/// GET /ready, GET /version and GET /metrics (Prometheus). Every error is an
/// OpenAI-style JSON body. With API keys, every other route answers 401 (OpenAI's
/// authentication_error body) unless the request carries `Authorization: Bearer KEY`;
/// with a certificate and key, the port speaks HTTPS only.
class HttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpOptions& options, coordinator::Cluster& cluster, const ServedModel& model,
      const common::ModelConfig& config, const common::Tokenizer& tokenizer,
      const common::ChatTemplate* chat_template, coordinator::CoordinatorMetrics& metrics);
  ~HttpServer();  // Stop()s

  int port() const { return port_; }
  /// "https" with TLS, else "http".
  const char* scheme() const { return options_.ssl_certfile.empty() ? "http" : "https"; }
  std::string address() const;
  /// Stops accepting and waits for the listener thread. Idempotent.
  void Stop();

 private:
  HttpServer() = default;

  HttpOptions options_;
  coordinator::Cluster* cluster_ = nullptr;
  std::unique_ptr<OpenAiService> openai_;
  std::unique_ptr<ResponsesApi> responses_;
  std::unique_ptr<PoolingService> pooling_;
  std::unique_ptr<httplib::Server> server_;  // an httplib::SSLServer with TLS
  std::thread listener_;
  int port_ = 0;
};

}  // namespace loom::api
