#include "api/http_message.h"

#include "absl/strings/match.h"

namespace loom::api {
namespace {

std::string Find(const std::vector<std::pair<std::string, std::string>>& headers,
                 absl::string_view name) {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return "";
}

}  // namespace

std::string HttpRequest::Header(absl::string_view name) const { return Find(headers, name); }

std::string HttpResponse::Header(absl::string_view name) const { return Find(headers, name); }

}  // namespace loom::api
