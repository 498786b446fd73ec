#include "api/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <functional>
#include <system_error>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace loom::api {
namespace {

// cpp-httplib (Debian's build, 0.11) listens with a backlog of 5. Under a burst of new
// connections, more than that waiting for its accept loop are dropped by the kernel and the
// clients retry their SYN after 1 s, 3 s, ...: a request that would be answered (or
// rejected with 429) in milliseconds waits seconds. listen() again on a listening socket
// only changes its backlog, so the socket httplib bound to `port` gets the system's maximum.
// The library keeps the socket private: it is found among the process's descriptors.
void WidenListenBacklog(int port) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &fd)) continue;
    int listening = 0;
    socklen_t length = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || !listening) {
      continue;
    }
    sockaddr_storage address{};
    socklen_t address_length = sizeof(address);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &address_length) != 0) continue;
    int bound_port = -1;
    if (address.ss_family == AF_INET) {
      bound_port = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
    } else if (address.ss_family == AF_INET6) {
      bound_port = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
    }
    if (bound_port == port) ::listen(fd, SOMAXCONN);
  }
}

// The server: HTTPS with both PEM files, plain HTTP with neither.
absl::StatusOr<std::unique_ptr<httplib::Server>> MakeServer(const HttpOptions& options) {
  if (options.ssl_certfile.empty() != options.ssl_keyfile.empty()) {
    return absl::InvalidArgumentError(
        "--ssl-certfile and --ssl-keyfile go together: give both or neither");
  }
  if (options.ssl_certfile.empty()) return std::make_unique<httplib::Server>();
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  auto tls = std::make_unique<httplib::SSLServer>(options.ssl_certfile.c_str(),
                                                  options.ssl_keyfile.c_str());
  if (!tls->is_valid()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot load the TLS certificate '%s' with the key '%s' (PEM files of a certificate "
        "and its matching private key)",
        options.ssl_certfile, options.ssl_keyfile));
  }
  return tls;
#else
  return absl::FailedPreconditionError(
      "this build's cpp-httplib has no OpenSSL support (CPPHTTPLIB_OPENSSL_SUPPORT): no TLS");
#endif
}

void ConfigureConnections(httplib::Server& http, const HttpOptions& options) {
  const int threads = options.threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(options.max_body_bytes);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  // An idle keep-alive connection holds one of the pool's threads until it times out, and
  // stopping waits for it: with 30 s, one idle `openai` client delayed every SIGTERM drain
  // by 30 s (tests/gpu/serve_smoke.py measured it). 5 s, as uvicorn's default and vLLM's.
  http.set_keep_alive_timeout(5);
}

using Guard = std::function<httplib::Server::Handler(httplib::Server::Handler)>;

// API keys: every route but the probes and the metrics (open, as in vLLM: load balancers
// and Prometheus scrape them without credentials) needs a key. Checked in the route, after
// cpp-httplib has read the body: a refusal before it (a pre-routing handler) would leave
// the body on a kept-alive connection, to be parsed as the next request. The Authorization
// header is never logged or echoed.
Guard KeyGuard(const ApiKeys& api_keys) {
  return [keys = std::make_shared<const ApiKeys>(api_keys)](
             httplib::Server::Handler handler) -> httplib::Server::Handler {
    if (!keys->enabled()) return handler;
    return [keys, handler = std::move(handler)](const httplib::Request& request,
                                               httplib::Response& response) {
      if (!keys->Authorizes(request.get_header_value("Authorization"))) {
        response.set_header("WWW-Authenticate", "Bearer");
        OpenAiService::WriteError(ApiKeys::Refusal(), response);
        return;
      }
      handler(request, response);
    };
  };
}

// The OpenAI-compatible routes and vLLM's tokenizer routes, all behind the key guard.
void AddApiRoutes(httplib::Server& http, OpenAiService* openai, ResponsesApi* responses,
                  PoolingService* pooling, const Guard& guard, const std::string& model_id) {
  http.Post("/v1/responses", guard([responses](const httplib::Request& request,
                                               httplib::Response& response) {
    responses->Create(request, response);
  }));
  http.Post("/v1/completions", guard([openai](const httplib::Request& request,
                                              httplib::Response& response) {
    openai->Completions(request, response);
  }));
  http.Post("/v1/chat/completions", guard([openai](const httplib::Request& request,
                                                   httplib::Response& response) {
    openai->ChatCompletions(request, response);
  }));
  http.Get("/v1/models", guard([openai](const httplib::Request& request,
                                        httplib::Response& response) {
    openai->Models(request, response);
  }));
  http.Post("/v1/embeddings",
            guard([pooling](const httplib::Request& request, httplib::Response& response) {
              pooling->Embeddings(request, response);
            }));
  for (const char* path : {"/v1/score", "/score"}) {
    http.Post(path, guard([pooling](const httplib::Request& request, httplib::Response& response) {
                pooling->Score(request, response);
              }));
  }
  for (const char* path : {"/v1/rerank", "/rerank", "/v2/rerank"}) {
    http.Post(path, guard([pooling](const httplib::Request& request, httplib::Response& response) {
                pooling->Rerank(request, response);
              }));
  }
  http.Post("/tokenize", guard([openai](const httplib::Request& request,
                                        httplib::Response& response) {
    openai->Tokenize(request, response);
  }));
  http.Post("/detokenize", guard([openai](const httplib::Request& request,
                                          httplib::Response& response) {
    openai->Detokenize(request, response);
  }));
  http.Get("/version", guard([model_id](const httplib::Request&, httplib::Response& response) {
    nlohmann::json body = {{"version", LOOM_VERSION}, {"model", model_id}};
    response.set_content(body.dump(), "application/json");
  }));
}

// The open routes: health, readiness and liveness probes, and the metrics.
void AddProbeRoutes(httplib::Server& http, coordinator::Cluster& cluster,
                    coordinator::CoordinatorMetrics& metrics) {
  auto serving_state = [&cluster](httplib::Response& response) {
    const int healthy = cluster.num_healthy();
    const bool draining = cluster.draining();
    const bool serving = healthy > 0 && !draining;
    response.status = serving ? 200 : 503;
    nlohmann::json body = {{"status", serving ? "ok" : draining ? "draining" : "no_replica"},
                           {"healthy_replicas", healthy},
                           {"draining", draining}};
    response.set_content(body.dump(), "application/json");
  };
  http.Get("/health", [serving_state](const httplib::Request&, httplib::Response& response) {
    serving_state(response);
  });
  http.Get("/ready", [serving_state](const httplib::Request&, httplib::Response& response) {
    serving_state(response);
  });
  // Liveness: 200 while the process serves HTTP, whether a replica is connected or not and
  // with API keys on (the kubelet sends none), so start-up and liveness probes never
  // restart a coordinator that is only waiting for its workers.
  http.Get("/live", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/metrics", [&cluster, &metrics](const httplib::Request&, httplib::Response& response) {
    metrics.UpdateFromClusterState(cluster.Status());
    response.set_content(metrics.Serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

void AddErrorHandlers(httplib::Server& http) {
  // Whatever the routes did not answer (unknown paths 404, wrong methods 405, bodies
  // over the limit 413, unparsable requests 400) still gets a JSON error body.
  http.set_error_handler([](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    const int status = response.status;
    const std::string message =
        status == 404   ? absl::StrFormat("no route for %s %s", request.method, request.path)
        : status == 413 ? "the request body is too large"
        : status == 405 ? absl::StrFormat("%s is not allowed on %s", request.method, request.path)
                        : absl::StrFormat("HTTP %d", status);
    nlohmann::json body = {{"error",
                            {{"message", message},
                             {"type", status == 404 ? "not_found_error" : "invalid_request_error"},
                             {"param", nullptr},
                             {"code", nullptr}}}};
    response.set_content(body.dump(), "application/json");
  });
  // A handler that throws (a bug) answers 500 with a JSON body instead of ending the
  // connection.
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr error) {
        std::string what = "internal error";
        try {
          if (error) std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        OpenAiService::WriteError(absl::InternalError(what), response);
      });
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpOptions& options, coordinator::Cluster& cluster, const ServedModel& model,
    const common::ModelConfig& config, const common::Tokenizer& tokenizer,
    const common::ChatTemplate* chat_template, coordinator::CoordinatorMetrics& metrics) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->options_ = options;
  server->cluster_ = &cluster;
  absl::StatusOr<std::unique_ptr<httplib::Server>> http_server = MakeServer(options);
  if (!http_server.ok()) return http_server.status();
  server->server_ = *std::move(http_server);
  server->openai_ =
      std::make_unique<OpenAiService>(cluster, model, config, tokenizer, chat_template, &metrics,
                                      options.stream_interval, options.seed);
  server->openai_->set_reasoning_format(options.reasoning);
  server->responses_ = std::make_unique<ResponsesApi>(*server->openai_);
  server->pooling_ = std::make_unique<PoolingService>(cluster, model, config, tokenizer, &metrics);
  httplib::Server& http = *server->server_;
  ConfigureConnections(http, options);
  AddApiRoutes(http, server->openai_.get(), server->responses_.get(), server->pooling_.get(),
               KeyGuard(options.api_keys), model.id);
  AddProbeRoutes(http, cluster, metrics);
  AddErrorHandlers(http);

  if (options.port == 0) {
    server->port_ = http.bind_to_any_port(options.host);
  } else if (http.bind_to_port(options.host, options.port)) {
    server->port_ = options.port;
  }
  if (server->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrFormat("cannot listen for HTTP on %s:%d", options.host, options.port));
  }
  WidenListenBacklog(server->port_);
  server->listener_ = std::thread([raw = server.get()] { raw->server_->listen_after_bind(); });
  return server;
}

HttpServer::~HttpServer() { Stop(); }

std::string HttpServer::address() const { return absl::StrFormat("%s:%d", options_.host, port_); }

void HttpServer::Stop() {
  if (!listener_.joinable()) return;
  server_->stop();
  listener_.join();
}

}  // namespace loom::api
