#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/api_keys.h"
#include "api/http_router.h"
#include "api/openai_service.h"
#include "api/pooling_service.h"
#include "api/responses_api.h"
#include "api/served_model.h"
#include "api/stream_pump.h"
#include "common/jinja/chat_template.h"
#include "coordinator/cluster.h"
#include "coordinator/leader_election.h"
#include "coordinator/metrics.h"

namespace loom::api {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port; -1: no HTTP server
  // Threads that run handlers (parse, tokenize, place) and render streamed output; open
  // streams and idle connections take none. Plus `io_threads` for the sockets, and as many
  // again for the embedding routes, which wait for their results.
  int threads = 4;
  int io_threads = 2;
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
  // High availability: while this coordinator follows, /health and /ready answer 503
  // with status "follower" and the leader's address. Null: standalone.
  const coordinator::LeaderElection* leader_election = nullptr;
};

/// The coordinator's HTTP server, event-driven (Boost.Beast over Boost.Asio, api/
/// http_connection): a fixed set of threads serves every connection, and an open stream
/// holds a connection and its request's state, never a thread, so thousands of streams
/// and a burst of new requests cost no threads and admission answers 429 at once. Serves
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
  /// Stops accepting, closes every connection and joins the threads. Idempotent.
  void Stop();

 private:
  struct Io;  // the sockets' event loop (Boost.Asio), kept out of this header

  HttpServer() = default;
  void Accept();

  HttpOptions options_;
  coordinator::Cluster* cluster_ = nullptr;
  std::unique_ptr<StreamPump> pump_;      // handlers and streamed output (`threads`)
  std::unique_ptr<StreamPump> blocking_;  // the embedding routes, which wait
  std::unique_ptr<OpenAiService> openai_;
  std::unique_ptr<ResponsesApi> responses_;
  std::unique_ptr<PoolingService> pooling_;
  HttpRouter router_;
  std::unique_ptr<Io> io_;
  int port_ = 0;
};

}  // namespace loom::api
