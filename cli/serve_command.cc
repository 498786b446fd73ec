#include "cli/serve_command.h"

#include <cstdio>
#include <string>

#include "coordinator/coordinator_server.h"

namespace loom::coordinator {

int RunServeCommand(int argc, char** argv) {
  ServeOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    std::string error;
    if (flag == "--help" || i + 1 >= argc || !ParseServeFlag(flag, argv[i + 1], options, error)) {
      if (flag != "--help") {
        std::fprintf(stderr, "loom serve: %s\n",
                     error.empty() ? ("unknown flag or missing value: " + flag).c_str()
                                   : error.c_str());
      }
      std::fprintf(stderr, "usage: loom serve --model PATH [flags]\n%s", kServeFlagsHelp);
      return flag == "--help" ? 0 : 2;
    }
    if (!error.empty()) {
      std::fprintf(stderr, "loom serve: %s\n", error.c_str());
      return 2;
    }
    ++i;
  }
  if (options.model_path.empty()) {
    std::fprintf(stderr, "loom serve: --model is required\n");
    return 2;
  }
  CoordinatorServer::BlockShutdownSignals();
  auto server = CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "loom serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("loom: coordinator listening on %s\n", (*server)->address().c_str());
  if ((*server)->http_port() > 0) {
    std::printf("loom: OpenAI-compatible HTTP API on http://%s:%d\n",
                (*server)->options().host.c_str(), (*server)->http_port());
  }
  std::fflush(stdout);
  const int signal = (*server)->WaitForShutdownSignal(nullptr);
  std::fprintf(stderr, "loom: %s: draining\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->DrainAndStop();
  return 0;
}

}  // namespace loom::coordinator
