#include "worker/gloo_status.h"

#include <string>

#include "absl/strings/str_format.h"

namespace loom::worker {

absl::Status GlooStatus(const char* scope, const char* what, const std::exception& error) {
  const std::string message = error.what();
  if (message.find("Timed out") != std::string::npos ||
      message.find("timed out") != std::string::npos) {
    return absl::DeadlineExceededError(absl::StrFormat("%s %s: %s", scope, what, message));
  }
  return absl::UnavailableError(absl::StrFormat("%s %s: %s", scope, what, message));
}

}  // namespace loom::worker
