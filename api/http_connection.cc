#include "api/http_connection.h"

#include <poll.h>

#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "api/http_router.h"
#include "boost/asio/bind_executor.hpp"
#include "boost/asio/dispatch.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/ssl/stream.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/tcp_stream.hpp"
#include "boost/beast/http/read.hpp"
#include "boost/beast/http/string_body.hpp"
#include "boost/beast/ssl/ssl_stream.hpp"

namespace loom::api {
namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

// How often a connection whose socket holds unread bytes (a pipelined request, a TLS
// record) is checked for the client's FIN while an answer is pending.
constexpr std::chrono::milliseconds kRecheck{250};

// What a responder tells its connection (any thread): something to send.
class ConnectionBase {
 public:
  virtual ~ConnectionBase() = default;
  virtual void Kick() = 0;
};

std::string Head(const HttpResponse& response, bool keep_alive, bool http10, bool chunked,
                 size_t length) {
  const auto status = static_cast<http::status>(response.status);
  std::string head =
      absl::StrFormat("HTTP/1.1 %d %s\r\nContent-Type: %s\r\n", response.status,
                      std::string(http::obsolete_reason(status)), response.content_type);
  for (const auto& [name, value] : response.headers) {
    absl::StrAppend(&head, name, ": ", value, "\r\n");
  }
  if (chunked) {
    head += "Transfer-Encoding: chunked\r\n";
  } else {
    absl::StrAppend(&head, "Content-Length: ", length, "\r\n");
  }
  if (!keep_alive) {
    head += "Connection: close\r\n";
  } else if (http10) {
    head += "Connection: keep-alive\r\n";
  }
  head += "\r\n";
  return head;
}

// One request's answer: bytes queued by the handler (any thread), taken and written by
// the connection (its strand).
class ConnectionResponder final : public HttpResponder {
 public:
  // `head_only`: a HEAD request, answered as its GET without the body (RFC 9110 9.3.2).
  ConnectionResponder(std::shared_ptr<ConnectionBase> connection, bool keep_alive, bool http10,
                      bool head_only)
      : connection_(std::move(connection)),
        keep_alive_(keep_alive),
        http10_(http10),
        head_only_(head_only) {}

  void Respond(HttpResponse response) override {
    {
      absl::MutexLock lock(&mu_);
      if (state_ != State::kWaiting || closed_) return;
      state_ = State::kComplete;
      queued_ = Head(response, keep_alive_, http10_, /*chunked=*/false, response.body.size());
      if (!head_only_) queued_ += response.body;
      if (!KickNeededLocked()) return;
    }
    connection_->Kick();
  }

  void StartStream(HttpResponse head) override {
    {
      absl::MutexLock lock(&mu_);
      if (state_ != State::kWaiting || closed_) return;
      // A HEAD's stream is its head alone: what the handler writes next is dropped.
      state_ = head_only_ ? State::kComplete : State::kStreaming;
      queued_ = Head(head, keep_alive_, http10_, /*chunked=*/true, 0);
      if (!KickNeededLocked()) return;
    }
    connection_->Kick();
  }

  bool Write(std::string data) override {
    {
      absl::MutexLock lock(&mu_);
      // A HEAD's stream ends with its head: the producer may stop.
      if (closed_ || head_only_) return false;
      if (state_ != State::kStreaming || data.empty()) return true;
      absl::StrAppend(&queued_, absl::Hex(data.size()), "\r\n", data, "\r\n");
      if (!KickNeededLocked()) return true;
    }
    connection_->Kick();
    return true;
  }

  void End() override {
    {
      absl::MutexLock lock(&mu_);
      if (state_ != State::kStreaming || closed_) return;
      state_ = State::kComplete;
      queued_ += "0\r\n\r\n";
      if (!KickNeededLocked()) return;
    }
    connection_->Kick();
  }

  bool Busy() const override {
    absl::MutexLock lock(&mu_);
    return in_flight_ || !queued_.empty();
  }
  bool Closed() const override {
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  void SetWakeup(std::function<void()> wakeup) override {
    absl::MutexLock lock(&mu_);
    wakeup_ = std::move(wakeup);
  }

  // The connection's side (its strand). The queued bytes, now in flight; `complete` when
  // they end the answer.
  std::string Take(bool& complete) {
    absl::MutexLock lock(&mu_);
    kick_pending_ = false;
    complete = state_ == State::kComplete;
    if (!queued_.empty()) in_flight_ = true;
    return std::exchange(queued_, std::string());
  }
  // A write finished: when nothing more is queued, the producer may go on.
  void WriteDone() {
    std::function<void()> wakeup;
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = false;
      if (queued_.empty()) wakeup = wakeup_;
    }
    if (wakeup) wakeup();
  }
  // The client went away (or the connection failed): nothing more will be sent.
  void MarkClosed() {
    std::function<void()> wakeup;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
      in_flight_ = false;
      queued_.clear();
      wakeup = std::move(wakeup_);
    }
    if (wakeup) wakeup();
  }
  // The answer went out whole: the connection lets go of this responder (and it of the
  // connection, which may be read again or closed).
  void Release() {
    absl::MutexLock lock(&mu_);
    wakeup_ = nullptr;
  }

 private:
  enum class State { kWaiting, kStreaming, kComplete };

  // Whether the connection must be told that bytes wait: not while a write is in flight
  // (its completion takes them) or a flush is already on its way.
  bool KickNeededLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (in_flight_ || kick_pending_) return false;
    kick_pending_ = true;
    return true;
  }

  const std::shared_ptr<ConnectionBase> connection_;
  const bool keep_alive_;
  const bool http10_;
  const bool head_only_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kWaiting;
  std::string queued_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool kick_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> wakeup_ ABSL_GUARDED_BY(mu_);
};

// Plain TCP or TLS over TCP; every handler runs on the socket's strand.
template <class Stream>
class Connection final : public ConnectionBase,
                         public std::enable_shared_from_this<Connection<Stream>> {
 public:
  Connection(Stream stream, const HttpConnectionOptions& options, const HttpDispatch& dispatch)
      : stream_(std::move(stream)),
        options_(options),
        dispatch_(dispatch),
        watch_timer_(stream_.get_executor()) {}

  void Start() {
    if constexpr (kTls) {
      tcp_layer().expires_after(options_.first_request_timeout);
      stream_.async_handshake(net::ssl::stream_base::server,
                              [self = this->shared_from_this()](const ErrorCode& error) {
                                if (error) return self->Close(/*graceful=*/false);
                                self->ReadRequest();
                              });
    } else {
      ReadRequest();
    }
  }

  void Kick() override {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] { self->Flush(); });
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  beast::tcp_stream& tcp_layer() { return beast::get_lowest_layer(stream_); }
  tcp::socket& socket() { return tcp_layer().socket(); }

  void ReadRequest() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(64 * 1024);
    tcp_layer().expires_after(served_ == 0 ? options_.first_request_timeout
                                           : options_.keep_alive_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](const ErrorCode& error, size_t) {
                              self->OnHeader(error);
                            });
  }

  // A clean end of the connection between requests, or a request that did not come in
  // time: closed quietly. A malformed one: 400.
  static bool Quiet(const ErrorCode& error) {
    return error == http::error::end_of_stream || error == beast::error::timeout ||
           error == net::error::eof || error == net::error::connection_reset ||
           error == net::error::operation_aborted || error == net::ssl::error::stream_truncated;
  }

  void OnHeader(const ErrorCode& error) {
    if (error) {
      if (Quiet(error)) return Close(/*graceful=*/false);
      if (error == http::error::body_limit) return Refuse(413, "the request body is too large");
      return Refuse(error == http::error::header_limit ? 431 : 400, error.message());
    }
    tcp_layer().expires_after(options_.io_timeout);
    if (parser_->get()[http::field::expect] == "100-continue") {
      continue_ = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(continue_),
                       [self = this->shared_from_this()](const ErrorCode& error, size_t) {
                         if (error) return self->Close(/*graceful=*/false);
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](const ErrorCode& error, size_t) {
                       self->OnRequest(error);
                     });
  }

  void OnRequest(const ErrorCode& error) {
    if (error == http::error::body_limit) return Refuse(413, "the request body is too large");
    if (error) {
      if (Quiet(error)) return Close(/*graceful=*/false);
      return Refuse(400, error.message());
    }
    tcp_layer().expires_never();
    http::request<http::string_body> message = parser_->release();
    parser_.reset();
    HttpRequest request;
    request.method = std::string(message.method_string());
    const std::string target(message.target());
    request.path = target.substr(0, target.find('?'));
    for (const auto& field : message) {
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    request.body = std::move(message.body());
    // HEAD runs the GET route and sends its head only (curl -I, load balancers' probes).
    const bool head_only = request.method == "HEAD";
    if (head_only) request.method = "GET";
    auto responder = Begin(message.keep_alive(), message.version() == 10, head_only);
    dispatch_(std::move(request), std::move(responder));
  }

  // A request refused before any handler: the error, then the connection closes.
  void Refuse(int status, const std::string& message) {
    Begin(/*keep_alive=*/false, /*http10=*/false, /*head_only=*/false)
        ->Respond(HttpRouter::Error(status, message));
  }

  std::shared_ptr<ConnectionResponder> Begin(bool keep_alive, bool http10, bool head_only) {
    ++served_;
    if (options_.pending_answers != nullptr) options_.pending_answers->fetch_add(1);
    keep_alive_ = keep_alive;
    responder_ = std::make_shared<ConnectionResponder>(this->shared_from_this(), keep_alive, http10,
                                                       head_only);
    Watch();
    return responder_;
  }

  // Sends what the responder queued, one write at a time.
  void Flush() {
    if (writing_ || responder_ == nullptr) return;
    bool complete = false;
    write_buffer_ = responder_->Take(complete);
    if (write_buffer_.empty()) {
      if (complete) Complete();
      return;
    }
    writing_ = true;
    tcp_layer().expires_after(options_.io_timeout);
    net::async_write(stream_, net::buffer(write_buffer_),
                     [self = this->shared_from_this(), complete](const ErrorCode& error, size_t) {
                       self->OnWrite(error, complete);
                     });
  }

  void OnWrite(const ErrorCode& error, bool complete) {
    writing_ = false;
    tcp_layer().expires_never();
    if (error) return Close(/*graceful=*/false);
    if (responder_ == nullptr) return;
    responder_->WriteDone();
    if (complete) return Complete();
    Flush();
  }

  // The answer went out whole: the next request, or the end.
  void Complete() {
    StopWatching();
    responder_->Release();
    EndAnswer();
    if (keep_alive_) return ReadRequest();
    Close(/*graceful=*/true);
  }

  // Watches the idle socket while an answer is pending: readable with the peer's FIN (or
  // an error) means the client left. Unread bytes (pipelining, TLS records) keep the socket
  // readable, so then it is rechecked on a timer instead.
  void Watch() {
    const uint64_t generation = ++watch_generation_;
    socket().async_wait(tcp::socket::wait_read,
                        [self = this->shared_from_this(), generation](const ErrorCode& error) {
                          if (!error) self->Check(generation);
                        });
  }

  void Check(uint64_t generation) {
    if (generation != watch_generation_ || responder_ == nullptr) return;
    pollfd descriptor{socket().native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&descriptor, 1, 0) < 0 ||
        (descriptor.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
      return Close(/*graceful=*/false);
    }
    watch_timer_.expires_after(kRecheck);
    watch_timer_.async_wait([self = this->shared_from_this(), generation](const ErrorCode& error) {
      if (!error) self->Check(generation);
    });
  }

  void StopWatching() {
    ++watch_generation_;
    watch_timer_.cancel();
    ErrorCode ignored;
    socket().cancel(ignored);
  }

  void EndAnswer() {
    responder_.reset();
    if (options_.pending_answers != nullptr) options_.pending_answers->fetch_sub(1);
  }

  void Close(bool graceful) {
    if (closed_) return;
    closed_ = true;
    if (responder_ != nullptr) {
      responder_->MarkClosed();
      EndAnswer();
    }
    ++watch_generation_;
    watch_timer_.cancel();
    ErrorCode ignored;
    if (graceful) {
      if constexpr (kTls) {
        tcp_layer().expires_after(std::chrono::seconds(2));
        stream_.async_shutdown([self = this->shared_from_this()](const ErrorCode&) {
          ErrorCode ignored;
          self->socket().close(ignored);
        });
        return;
      } else {
        // Half-close, then read and drop what the client still sends (a refused body)
        // for a moment: closing with unread bytes would reset the connection, and the
        // client could lose the answer before reading it.
        socket().shutdown(tcp::socket::shutdown_send, ignored);
        tcp_layer().expires_after(std::chrono::seconds(2));
        return Linger();
      }
    }
    socket().close(ignored);
  }

  void Linger() {
    linger_.resize(64 * 1024);
    tcp_layer().async_read_some(net::buffer(linger_),
                                [self = this->shared_from_this()](const ErrorCode& error, size_t) {
                                  if (!error) return self->Linger();
                                  ErrorCode ignored;
                                  self->socket().close(ignored);
                                });
  }

  Stream stream_;
  const HttpConnectionOptions& options_;
  const HttpDispatch& dispatch_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<ConnectionResponder> responder_;  // the pending answer's
  std::string write_buffer_;
  std::string continue_;
  std::string linger_;
  net::steady_timer watch_timer_;
  uint64_t watch_generation_ = 0;
  uint64_t served_ = 0;
  bool keep_alive_ = false;
  bool writing_ = false;
  bool closed_ = false;
};

}  // namespace

void ServeHttpConnection(tcp::socket socket, net::ssl::context* tls,
                         const HttpConnectionOptions& options, const HttpDispatch& dispatch) {
  if (tls == nullptr) {
    std::make_shared<Connection<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), options,
                                                    dispatch)
        ->Start();
    return;
  }
  using TlsStream = beast::ssl_stream<beast::tcp_stream>;
  std::make_shared<Connection<TlsStream>>(TlsStream(std::move(socket), *tls), options, dispatch)
      ->Start();
}

}  // namespace loom::api
