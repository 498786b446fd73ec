#include "cli/serve_command.h"

#include <cstdio>
#include <optional>
#include <string>

#include "api/coordinator_server.h"
#include "cli/command_line.h"
#include "cli/serve_flags.h"
#include "common/cluster_secret.h"

namespace loom::cli {

void PrintServingAddresses(const api::CoordinatorServer& server) {
  std::printf("loom: coordinator listening on %s\n", server.address().c_str());
  if (server.http_port() > 0) {
    std::printf("loom: OpenAI-compatible HTTP API on %s://%s:%d\n",
                server.options().http.ssl_certfile.empty() ? "http" : "https",
                server.options().host.c_str(), server.http_port());
  }
  std::fflush(stdout);
}

int RunServeCommand(int argc, char** argv) {
  api::ServeOptions options;
  cli::CommandLine command_line("loom serve",
                                "loom serve MODEL: run the coordinator alone (workers register "
                                "with it: loom-worker --coordinator HOST:GRPC_PORT)");
  cli::AddServeFlags(command_line.app(), options);
  if (std::optional<int> exit_code = command_line.Parse(argc, argv)) return *exit_code;
  if (options.model_path.empty()) return command_line.Fail("the model is required (MODEL or --model)");
  if (absl::Status secret = common::LoadClusterSecret(
          options.cluster_secret_file, std::getenv(common::kClusterSecretEnvironment));
      !secret.ok()) {
    return command_line.Fail(std::string(secret.message()));
  }
  api::CoordinatorServer::BlockShutdownSignals();
  auto server = api::CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "loom serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  PrintServingAddresses(**server);
  const int signal = (*server)->WaitForShutdownSignal(nullptr);
  std::fprintf(stderr, "loom: %s: draining\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->DrainAndStop();
  return 0;
}

}  // namespace loom::cli
