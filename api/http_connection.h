#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

#include "api/http_message.h"
#include "api/http_responder.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl/context.hpp"

namespace loom::api {

struct HttpConnectionOptions {
  size_t max_body_bytes = size_t{32} << 20;  // 413 beyond
  // A new connection's first request, and an idle kept-alive connection's next one, must
  // begin within these; once begun, a request is read whole within `io_timeout`, and
  // every write completes within it (a client that stops reading is cut off).
  std::chrono::milliseconds first_request_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds keep_alive_timeout{std::chrono::seconds(5)};
  std::chrono::milliseconds io_timeout{std::chrono::seconds(30)};
  // Counts the answers begun and not yet sent whole (or abandoned); may be null.
  std::atomic<int>* pending_answers = nullptr;
};

/// Hands a request that was read whole to whatever runs the handlers (it must not block:
/// it is called on an I/O thread).
using HttpDispatch = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;

/// Serves HTTP/1.1 on one accepted connection (Boost.Beast's parser; asynchronous reads
/// and writes on the socket's strand) until it closes: requests in turn (keep-alive; a
/// request's answer completes before the next is read), `Expect: 100-continue`, bodies
/// over the limit answered 413 and malformed requests 400 (OpenAI-style JSON), streamed
/// answers sent chunked. While an answer is pending the connection watches for the client
/// leaving (its FIN or RST), so the work for a request nobody waits for stops at once.
/// With `tls`, the connection is HTTPS (handshake first). `options`, `dispatch` and `tls`
/// outlive the connection.
void ServeHttpConnection(boost::asio::ip::tcp::socket socket, boost::asio::ssl::context* tls,
                         const HttpConnectionOptions& options, const HttpDispatch& dispatch);

}  // namespace loom::api
