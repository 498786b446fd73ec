#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace loom::api {

/// One HTTP request as the handlers see it: read whole (the body within the server's
/// limit) before a handler runs.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query: "/v1/completions"
  std::vector<std::pair<std::string, std::string>> headers;  // as received, in order
  std::string body;

  /// The first header named `name` (case-insensitive); empty when absent.
  std::string Header(absl::string_view name) const;
};

/// A whole HTTP response, or the head of a streamed one (its body unused then).
struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // besides the framing ones
  std::string content_type = "text/plain";
  std::string body;

  void set_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
};

}  // namespace loom::api
