#include "api/http_server.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "api/http_connection.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl/context.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "nlohmann/json.hpp"

namespace loom::api {

namespace net = boost::asio;
using tcp = net::ip::tcp;

struct HttpServer::Io {
  // What connections use, declared first: the context's destructor destroys the handlers
  // still queued, and with them the last connections.
  std::optional<net::ssl::context> tls;
  HttpConnectionOptions connection;
  HttpDispatch dispatch;
  std::atomic<int> pending_answers{0};

  net::io_context context;
  net::executor_work_guard<net::io_context::executor_type> work{context.get_executor()};
  tcp::acceptor acceptor{context};
  net::steady_timer retry{context};  // accepting again after running out of descriptors
  std::vector<std::thread> threads;
};

namespace {

// Every open connection is a descriptor: thousands of streams need more than the usual
// soft limit of 1,024, so the soft limit is raised to the hard one (as vLLM does).
void RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

// The TLS context: both PEM files, or none (plain HTTP).
absl::Status LoadTls(const HttpOptions& options, std::optional<net::ssl::context>& tls) {
  if (options.ssl_certfile.empty() != options.ssl_keyfile.empty()) {
    return absl::InvalidArgumentError(
        "--ssl-certfile and --ssl-keyfile go together: give both or neither");
  }
  if (options.ssl_certfile.empty()) return absl::OkStatus();
  tls.emplace(net::ssl::context::tls_server);
  tls->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                   net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                   net::ssl::context::no_tlsv1_1);
  boost::system::error_code chain, key, check;
  tls->use_certificate_chain_file(options.ssl_certfile, chain);
  tls->use_private_key_file(options.ssl_keyfile, net::ssl::context::pem, key);
  if (!chain && !key && SSL_CTX_check_private_key(tls->native_handle()) != 1) {
    check = net::error::invalid_argument;
  }
  if (chain || key || check) {
    tls.reset();
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot load the TLS certificate '%s' with the key '%s' (PEM files of a certificate "
        "and its matching private key)",
        options.ssl_certfile, options.ssl_keyfile));
  }
  return absl::OkStatus();
}

// A handler that answers at once, without waiting for anything.
HttpHandler Sync(std::function<void(const HttpRequest&, HttpResponse&)> handler) {
  return [handler = std::move(handler)](const HttpRequest& request,
                                        std::shared_ptr<HttpResponder> responder) {
    HttpResponse response;
    handler(request, response);
    responder->Respond(std::move(response));
  };
}

// API keys: every route but the probes and the metrics (open, as in vLLM: load balancers
// and Prometheus scrape them without credentials) needs a key. The Authorization header
// is never logged or echoed.
HttpHandler Guarded(const std::shared_ptr<const ApiKeys>& keys, HttpHandler handler) {
  if (!keys->enabled()) return handler;
  return [keys, handler = std::move(handler)](const HttpRequest& request,
                                              std::shared_ptr<HttpResponder> responder) {
    if (!keys->Authorizes(request.Header("Authorization"))) {
      HttpResponse refusal;
      OpenAiService::WriteError(ApiKeys::Refusal(), refusal);
      refusal.set_header("WWW-Authenticate", "Bearer");
      return responder->Respond(std::move(refusal));
    }
    handler(request, std::move(responder));
  };
}

// The OpenAI-compatible routes and vLLM's tokenizer routes, all behind the key guard.
// The embedding routes wait for their results, on the `blocking` threads.
void AddApiRoutes(HttpRouter& router, OpenAiService* openai, ResponsesApi* responses,
                  PoolingService* pooling, StreamPump* blocking, const ApiKeys& api_keys,
                  const std::string& model_id) {
  auto keys = std::make_shared<const ApiKeys>(api_keys);
  auto add = [&](const char* method, const char* path, HttpHandler handler) {
    router.Add(method, path, Guarded(keys, std::move(handler)));
  };
  using Route =
      void (PoolingService::*)(const HttpRequest&, HttpResponse&, const std::function<bool()>&);
  auto waiting = [blocking, pooling](Route route) -> HttpHandler {
    return [=](const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
      blocking->Post([=] {
        HttpResponse response;
        (pooling->*route)(request, response, [&responder] { return responder->Closed(); });
        responder->Respond(std::move(response));
      });
    };
  };
  add("POST", "/v1/responses", [responses](const HttpRequest& request, auto responder) {
    responses->Create(request, std::move(responder));
  });
  add("POST", "/v1/completions", [openai](const HttpRequest& request, auto responder) {
    openai->Completions(request, std::move(responder));
  });
  add("POST", "/v1/chat/completions", [openai](const HttpRequest& request, auto responder) {
    openai->ChatCompletions(request, std::move(responder));
  });
  add("GET", "/v1/models", Sync([openai](const HttpRequest& request, HttpResponse& response) {
        openai->Models(request, response);
      }));
  router.AddPrefix("GET", OpenAiService::kModelsPrefix,
                   Guarded(keys, Sync([openai](const HttpRequest& request, HttpResponse& response) {
                             openai->Model(request, response);
                           })));
  add("POST", "/v1/embeddings", waiting(&PoolingService::Embeddings));
  for (const char* path : {"/v1/score", "/score"}) {
    add("POST", path, waiting(&PoolingService::Score));
  }
  for (const char* path : {"/v1/rerank", "/rerank", "/v2/rerank"}) {
    add("POST", path, waiting(&PoolingService::Rerank));
  }
  add("POST", "/tokenize", Sync([openai](const HttpRequest& request, HttpResponse& response) {
        openai->Tokenize(request, response);
      }));
  add("POST", "/detokenize", Sync([openai](const HttpRequest& request, HttpResponse& response) {
        openai->Detokenize(request, response);
      }));
  add("GET", "/version", Sync([model_id](const HttpRequest&, HttpResponse& response) {
        nlohmann::json body = {{"version", LOOM_VERSION}, {"model", model_id}};
        response.set_content(body.dump(), "application/json");
      }));
}

// The open routes: health, readiness and liveness probes, and the metrics.
void AddProbeRoutes(HttpRouter& router, coordinator::Cluster& cluster,
                    coordinator::CoordinatorMetrics& metrics,
                    const coordinator::LeaderElection* election) {
  auto serving_state = [&cluster, election](const HttpRequest&, HttpResponse& response) {
    if (election != nullptr && !election->leading()) {
      response.status = 503;
      nlohmann::json body = {{"status", "follower"}, {"leader", election->LeaderAddress()}};
      response.set_content(body.dump(), "application/json");
      return;
    }
    const int healthy = cluster.num_healthy();
    const bool draining = cluster.draining();
    const bool serving = healthy > 0 && !draining;
    response.status = serving ? 200 : 503;
    nlohmann::json body = {{"status", serving ? "ok" : draining ? "draining" : "no_replica"},
                           {"healthy_replicas", healthy},
                           {"draining", draining}};
    response.set_content(body.dump(), "application/json");
  };
  router.Add("GET", "/health", Sync(serving_state));
  router.Add("GET", "/ready", Sync(serving_state));
  // Liveness: 200 while the process serves HTTP, whether a replica is connected or not and
  // with API keys on (the kubelet sends none), so start-up and liveness probes never
  // restart a coordinator that is only waiting for its workers.
  router.Add("GET", "/live", Sync([](const HttpRequest&, HttpResponse& response) {
               response.set_content(R"({"status":"ok"})", "application/json");
             }));
  router.Add(
      "GET", "/metrics", Sync([&cluster, &metrics](const HttpRequest&, HttpResponse& response) {
        metrics.UpdateFromClusterState(cluster.Status());
        response.set_content(metrics.Serialize(), "text/plain; version=0.0.4; charset=utf-8");
      }));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpOptions& options, coordinator::Cluster& cluster, const ServedModel& model,
    const common::ModelConfig& config, const common::Tokenizer& tokenizer,
    const common::ChatTemplate* chat_template, coordinator::CoordinatorMetrics& metrics) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->options_ = options;
  server->cluster_ = &cluster;
  server->io_ = std::make_unique<Io>();
  Io& io = *server->io_;
  if (absl::Status tls = LoadTls(options, io.tls); !tls.ok()) return tls;
  RaiseDescriptorLimit();

  server->pump_ = std::make_unique<StreamPump>(absl::Milliseconds(1), options.threads);
  server->blocking_ = std::make_unique<StreamPump>(absl::Milliseconds(1), options.threads);
  server->openai_ =
      std::make_unique<OpenAiService>(cluster, model, config, tokenizer, chat_template, &metrics,
                                      options.stream_interval, options.seed);
  server->openai_->set_reasoning_format(options.reasoning);
  server->openai_->set_pump(server->pump_.get());
  server->responses_ = std::make_unique<ResponsesApi>(*server->openai_);
  server->pooling_ = std::make_unique<PoolingService>(cluster, model, config, tokenizer, &metrics);
  AddApiRoutes(server->router_, server->openai_.get(), server->responses_.get(),
               server->pooling_.get(), server->blocking_.get(), options.api_keys, model.id);
  AddProbeRoutes(server->router_, cluster, metrics, options.leader_election);

  io.connection.max_body_bytes = options.max_body_bytes;
  io.connection.pending_answers = &io.pending_answers;
  // Handlers run on the pump's threads, never on the sockets'.
  io.dispatch = [router = &server->router_, pump = server->pump_.get()](
                    HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    pump->Post([router, request = std::move(request), responder = std::move(responder)] {
      router->Dispatch(request, responder);
    });
  };

  boost::system::error_code error;
  const tcp::endpoint endpoint(net::ip::make_address(options.host, error),
                               static_cast<uint16_t>(std::max(0, options.port)));
  if (!error) io.acceptor.open(endpoint.protocol(), error);
  if (!error) io.acceptor.set_option(net::socket_base::reuse_address(true), error);
  if (!error) io.acceptor.bind(endpoint, error);
  if (!error) io.acceptor.listen(net::socket_base::max_listen_connections, error);
  if (error) {
    return absl::UnavailableError(absl::StrFormat("cannot listen for HTTP on %s:%d: %s",
                                                  options.host, options.port, error.message()));
  }
  server->port_ = io.acceptor.local_endpoint().port();
  server->Accept();
  for (int i = 0; i < std::max(1, options.io_threads); ++i) {
    io.threads.emplace_back([&io] { io.context.run(); });
  }
  return server;
}

void HttpServer::Accept() {
  Io& io = *io_;
  io.acceptor.async_accept(
      net::make_strand(io.context), [this](boost::system::error_code error, tcp::socket socket) {
        if (error == net::error::operation_aborted || !io_->acceptor.is_open()) return;
        if (error) {
          // Out of descriptors (or another transient failure): the connections waiting in
          // the backlog are accepted once some close.
          std::fprintf(stderr, "loom: HTTP accept failed: %s; retrying\n", error.message().c_str());
          io_->retry.expires_after(std::chrono::milliseconds(50));
          io_->retry.async_wait([this](boost::system::error_code wait) {
            if (!wait) Accept();
          });
          return;
        }
        socket.set_option(tcp::no_delay(true), error);
        ServeHttpConnection(std::move(socket), io_->tls ? &*io_->tls : nullptr, io_->connection,
                            io_->dispatch);
        Accept();
      });
}

HttpServer::~HttpServer() { Stop(); }

std::string HttpServer::address() const { return absl::StrFormat("%s:%d", options_.host, port_); }

void HttpServer::Stop() {
  if (io_ == nullptr) return;
  net::post(io_->context, [io = io_.get()] {
    boost::system::error_code ignored;
    io->acceptor.close(ignored);
    io->retry.cancel();
  });
  // Answers still being written (a drain's last chunks) get a moment to go out.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (io_->pending_answers.load() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  // The answers still open end here: nothing they hold wakes them again.
  if (openai_ != nullptr) openai_->Shutdown();
  io_->work.reset();
  io_->context.stop();
  for (std::thread& thread : io_->threads) thread.join();
  pump_.reset();
  blocking_.reset();
  io_.reset();  // the connections' last references are gone with the queued handlers
}

}  // namespace loom::api
