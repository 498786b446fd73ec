#include "cli/models_command.h"

#include <cstdio>
#include <string>

#include "absl/time/time.h"
#include "client/client.h"
#include "cli/client_flags.h"

namespace loom::cli {

int RunModelsCommand(int argc, char** argv) {
  client::ClientOptions options;
  if (std::optional<int> exit_code =
          ParseClientFlagsOnly(argc, argv, "models", "loom models: list the models a running cluster serves", options)) {
    return *exit_code;
  }
  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Create(options);
  absl::StatusOr<std::vector<client::ModelDescription>> models =
      client.ok() ? (*client)->ListModels() : client.status();
  if (!models.ok()) {
    std::fprintf(stderr, "loom models: %s\n", models.status().ToString().c_str());
    return 1;
  }
  std::printf("%-32s %-10s %8s %8s %-16s %s\n", "ID", "ARCH", "VOCAB", "CONTEXT", "FINGERPRINT",
              "SERVING SINCE");
  for (const client::ModelDescription& model : *models) {
    std::printf("%-32s %-10s %8lld %8lld %-16s %s\n", model.id.c_str(), model.architecture.c_str(),
                static_cast<long long>(model.vocab_size),
                static_cast<long long>(model.context_length),
                model.fingerprint.substr(0, 16).c_str(),
                absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(model.created),
                                 absl::UTCTimeZone())
                    .c_str());
  }
  return 0;
}

}  // namespace loom::cli
