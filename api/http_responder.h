#pragma once

#include <functional>
#include <string>

#include "api/http_message.h"

namespace loom::api {

/// How a handler answers one HTTP request, at once or later, from any thread: a whole
/// response (Respond), or a stream (StartStream, Write..., End) sent as the chunks come.
/// Nothing blocks: writes are queued and sent by the server's I/O threads, so an open
/// stream holds no thread. A producer keeps its own output back while Busy() (at most
/// one piece in flight; what comes meanwhile joins the next piece) and is woken when the
/// write completes or the client goes away. Exactly one of Respond or StartStream is
/// called per request; a stream ends with End. Thread-safe.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;

  /// Answers with a whole response.
  virtual void Respond(HttpResponse response) = 0;
  /// Starts a streamed answer with `head`'s status and headers (chunked on the wire).
  virtual void StartStream(HttpResponse head) = 0;
  /// Queues `data` after what was written; false once the client is gone.
  virtual bool Write(std::string data) = 0;
  /// Ends the stream (after what was queued).
  virtual void End() = 0;

  /// True while queued output is not yet written.
  virtual bool Busy() const = 0;
  /// True once the client went away (its connection closed or failed): nobody reads
  /// what follows, and the work for it may stop.
  virtual bool Closed() const = 0;
  /// Called when Busy() becomes false or Closed() true: on an I/O thread, quickly (it
  /// should only schedule work). Set before the first write.
  virtual void SetWakeup(std::function<void()> wakeup) = 0;
};

}  // namespace loom::api
