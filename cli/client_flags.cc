#include "cli/client_flags.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace loom::coordinator {

const char kClientFlagsHelp[] =
    "  --address HOST:PORT    the coordinator's gRPC endpoint (default 127.0.0.1:50051)\n"
    "  --timeout SECONDS      deadline of each call (default: none)\n"
    "  --tls                  connect with TLS (gRPC's default root certificates)\n"
    "  --tls-root-certs PATH  connect with TLS, trusting the CA certificates in PATH (PEM)\n";

absl::StatusOr<double> ParseNumberFlag(const std::string& flag, const char* value) {
  double number = 0;
  if (!absl::SimpleAtod(value, &number) || !std::isfinite(number)) {
    return absl::InvalidArgumentError(absl::StrFormat("bad value '%s' for %s", value, flag));
  }
  return number;
}

absl::StatusOr<int> ParseIntFlag(const std::string& flag, const char* value) {
  int number = 0;
  if (!absl::SimpleAtoi(value, &number)) {
    return absl::InvalidArgumentError(absl::StrFormat("bad value '%s' for %s", value, flag));
  }
  return number;
}

absl::StatusOr<int> ParseClientFlag(int argc, char** argv, int i, client::ClientOptions& options) {
  const std::string flag = argv[i];
  if (flag == "--tls") {
    options.tls.enabled = true;
    return 1;
  }
  if (flag != "--address" && flag != "--timeout" && flag != "--tls-root-certs") return 0;
  if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrFormat("%s needs a value", flag));
  const char* value = argv[i + 1];
  if (flag == "--address") {
    options.address = value;
  } else if (flag == "--tls-root-certs") {
    options.tls.enabled = true;
    options.tls.root_certs_path = value;
  } else {
    absl::StatusOr<double> seconds = ParseNumberFlag(flag, value);
    if (!seconds.ok()) return seconds.status();
    if (*seconds <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat("--timeout must be > 0, not %s", value));
    }
    options.default_timeout = absl::Seconds(*seconds);
  }
  return 2;
}

}  // namespace loom::coordinator

namespace loom::coordinator {

const char kGenerationFlagsHelp[] =
    "  --max-tokens N         most tokens to generate\n"
    "  --temperature T        0 is greedy (the server's default)\n"
    "  --top-p P, --top-k K   nucleus and top-k sampling\n"
    "  --seed S               sampling seed (same seed, same text)\n"
    "  --stop TEXT            a stop string (repeatable)\n";

absl::StatusOr<int> ParseGenerationFlag(int argc, char** argv, int i,
                                        client::GenerateRequest& request) {
  const std::string flag = argv[i];
  if (flag != "--max-tokens" && flag != "--temperature" && flag != "--top-p" && flag != "--top-k" &&
      flag != "--seed" && flag != "--stop") {
    return 0;
  }
  if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrFormat("%s needs a value", flag));
  const char* value = argv[i + 1];
  if (flag == "--stop") {
    request.stop.emplace_back(value);
    return 2;
  }
  if (flag == "--max-tokens" || flag == "--top-k") {
    absl::StatusOr<int> number = ParseIntFlag(flag, value);
    if (!number.ok()) return number.status();
    (flag == "--max-tokens" ? request.max_tokens : request.sampling.top_k.emplace()) = *number;
    return 2;
  }
  if (flag == "--seed") {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(value, &seed)) {
      return absl::InvalidArgumentError(absl::StrFormat("bad value '%s' for --seed", value));
    }
    request.sampling.seed = seed;
    return 2;
  }
  absl::StatusOr<double> number = ParseNumberFlag(flag, value);
  if (!number.ok()) return number.status();
  (flag == "--temperature" ? request.sampling.temperature : request.sampling.top_p) =
      static_cast<float>(*number);
  return 2;
}

std::optional<int> ParseClientFlagsOnly(int argc, char** argv, const char* command,
                                        const char* usage, client::ClientOptions& options) {
  for (int i = 1; i < argc;) {
    absl::StatusOr<int> used = ParseClientFlag(argc, argv, i, options);
    if (used.ok() && *used > 0) {
      i += *used;
      continue;
    }
    const std::string arg = argv[i];
    const bool help = arg == "--help" || arg == "-h";
    if (!help) {
      std::fprintf(stderr, "loom %s: %s\n", command,
                   used.ok() ? ("unknown argument: " + arg).c_str()
                             : std::string(used.status().message()).c_str());
    }
    std::fprintf(stderr, "%s%s", usage, kClientFlagsHelp);
    return help ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace loom::coordinator
