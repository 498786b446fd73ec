#include "api/http_router.h"

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json_depth.h"
#include "nlohmann/json.hpp"

namespace loom::api {

void HttpRouter::Add(std::string method, std::string path, HttpHandler handler) {
  routes_[{std::move(path), std::move(method)}] = std::move(handler);
}

void HttpRouter::AddPrefix(std::string method, std::string prefix, HttpHandler handler) {
  prefixes_[{std::move(prefix), std::move(method)}] = std::move(handler);
}

void HttpRouter::Dispatch(const HttpRequest& request,
                          std::shared_ptr<HttpResponder> responder) const {
  auto route = routes_.find({request.path, request.method});
  if (route == routes_.end()) {
    // The longest prefix of the path with this method (map order: a longer prefix of the
    // same path sorts after a shorter one).
    const HttpHandler* longest = nullptr;
    for (const auto& [key, handler] : prefixes_) {
      const auto& [prefix, method] = key;
      if (method == request.method && request.path.size() > prefix.size() &&
          request.path.compare(0, prefix.size(), prefix) == 0) {
        longest = &handler;
      }
    }
    if (longest != nullptr) return Run(*longest, request, std::move(responder));
    // The path's methods (RFC 9110 15.5.6: a 405 names them in Allow; GET brings HEAD).
    std::vector<std::string> allowed;
    for (auto it = routes_.lower_bound({request.path, ""});
         it != routes_.end() && it->first.first == request.path; ++it) {
      allowed.push_back(it->first.second);
      if (it->first.second == "GET") allowed.push_back("HEAD");
    }
    if (allowed.empty()) {
      responder->Respond(
          Error(404, absl::StrFormat("no route for %s %s", request.method, request.path)));
      return;
    }
    HttpResponse refusal =
        Error(405, absl::StrFormat("%s is not allowed on %s", request.method, request.path));
    refusal.set_header("Allow", absl::StrJoin(allowed, ", "));
    responder->Respond(std::move(refusal));
    return;
  }
  Run(route->second, request, std::move(responder));
}

void HttpRouter::Run(const HttpHandler& handler, const HttpRequest& request,
                     std::shared_ptr<HttpResponder> responder) {
  // Every POST body here is JSON: one too deep for the code behind the handlers (nlohmann's
  // copy and dump, the schema compiler) is refused before any of it runs.
  if (request.method == "POST") {
    if (absl::Status depth = common::CheckJsonNestingDepth(request.body, "the request body");
        !depth.ok()) {
      responder->Respond(Error(400, std::string(depth.message())));
      return;
    }
  }
  try {
    handler(request, responder);
  } catch (const nlohmann::json::type_error& error) {
    // A field of the client's JSON read as another type than it has, by a handler that did
    // not check it first: the client's error, not the server's. Logged, in case it was the
    // server's own JSON after all.
    std::fprintf(stderr, "loom: %s %s: %s (answered 400)\n", request.method.c_str(),
                 request.path.c_str(), error.what());
    responder->Respond(Error(
        400, absl::StrFormat("a field of the request has the wrong JSON type (%s)", error.what())));
  } catch (const std::exception& error) {
    // Ignored by the responder when the handler answered before throwing.
    responder->Respond(Error(500, error.what()));
  }
}

HttpResponse HttpRouter::Error(int status, const std::string& message) {
  const char* type = status == 404   ? "not_found_error"
                     : status < 500  ? "invalid_request_error"
                     : status == 503 ? "service_unavailable_error"
                                     : "internal_server_error";
  nlohmann::json body = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
  HttpResponse response;
  response.status = status;
  response.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                       "application/json");
  return response;
}

}  // namespace loom::api
