#include "cli/client_flags.h"

#include <optional>
#include <string>

#include "cli/command_line.h"

namespace loom::cli {

void AddClientFlags(CLI::App& app, client::ClientOptions& options) {
  cli::AddString(app, "--address", options.address, "the coordinator's gRPC endpoint")
      ->check(cli::HostPort());
  app.add_option_function<double>(
         "--timeout",
         [&options](const double& seconds) { options.default_timeout = absl::Seconds(seconds); },
         "deadline of each call in seconds")
      ->check(cli::NumberIn(1e-3, 1e9))
      ->default_str("none");
  cli::AddBool(app, "--tls", options.tls.enabled,
               "connect with TLS (gRPC's default root certificates)");
  app.add_option_function<std::string>(
         "--tls-root-certs",
         [&options](const std::string& path) {
           options.tls.enabled = true;
           options.tls.root_certs_path = path;
         },
         "connect with TLS, trusting the CA certificates in PATH (PEM)")
      ->default_str("\"\"");
  cli::AddString(app, "--api-key", options.api_key,
                 "the server's API key (sent as 'authorization: Bearer KEY')");
}

void AddGenerationFlags(CLI::App& app, client::GenerateRequest& request) {
  cli::AddInt(app, "--max-tokens", request.max_tokens, 0, int64_t{1} << 30,
              "most tokens to generate (0: up to the context length)");
  cli::AddNumber(app, "--temperature", request.sampling.temperature, 0, 100,
                 "0 is greedy (default: the server's)");
  cli::AddNumber(app, "--top-p", request.sampling.top_p, 1e-9, 1, "nucleus sampling");
  cli::AddInt(app, "--top-k", request.sampling.top_k, 0, 1 << 30, "top-k sampling (0: off)");
  cli::AddUint64(app, "--seed", request.sampling.seed, "sampling seed (same seed, same text)");
  app.add_option("--stop", request.stop, "a stop string (repeatable)")->default_str("none");
}

std::optional<int> ParseClientFlagsOnly(int argc, char** argv, const char* command,
                                        const char* description, client::ClientOptions& options) {
  cli::CommandLine command_line(std::string("loom ") + command, description);
  AddClientFlags(command_line.app(), options);
  return command_line.Parse(argc, argv);
}

}  // namespace loom::cli
