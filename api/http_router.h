#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "api/http_message.h"
#include "api/http_responder.h"

namespace loom::api {

/// A handler answers through its responder, at once or later (from any thread).
using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;

/// The HTTP routes: a handler per method and exact path, or per method and path prefix
/// (where no exact path matches; the longest prefix first). Immutable once serving starts.
class HttpRouter {
 public:
  void Add(std::string method, std::string path, HttpHandler handler);
  /// Every path that starts with `prefix` (and is longer), e.g. "/v1/models/" for
  /// GET /v1/models/{id}.
  void AddPrefix(std::string method, std::string prefix, HttpHandler handler);

  /// Runs the route of `request`'s method and path. What no route answers gets an
  /// OpenAI-style JSON error: 404 for an unknown path, 405 for a known path with another
  /// method; a handler that throws (a bug) answers 500 unless it answered already.
  void Dispatch(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) const;

  /// An OpenAI-style JSON error response with `status` and `message`.
  static HttpResponse Error(int status, const std::string& message);

 private:
  // The handler, after the checks every route shares (the body's nesting), and a thrown
  // exception turned into a 500.
  static void Run(const HttpHandler& handler, const HttpRequest& request,
                  std::shared_ptr<HttpResponder> responder);

  std::map<std::pair<std::string, std::string>, HttpHandler> routes_;  // (path, method)
  std::map<std::pair<std::string, std::string>, HttpHandler> prefixes_;  // (prefix, method)
};

}  // namespace loom::api
