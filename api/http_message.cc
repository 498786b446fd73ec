#include "api/http_message.h"

#include "absl/strings/match.h"

namespace loom::api {

std::string HttpRequest::Header(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return "";
}

}  // namespace loom::api
