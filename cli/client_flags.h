#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/client_options.h"
#include "client/generate_request.h"

namespace loom::coordinator {

/// The flags every command that talks to a running cluster takes (`loom chat`, `complete`,
/// `models`, `status`), as lines of a usage text.
extern const char kClientFlagsHelp[];

/// Consumes argv[i] (and its value) when it is a client flag: `--address HOST:PORT`
/// (default 127.0.0.1:50051), `--timeout SECONDS` (per call), `--tls`,
/// `--tls-root-certs PATH` (implies --tls). Returns how many arguments it consumed, 0 for a
/// flag that is not one of these; InvalidArgument for a missing or bad value.
absl::StatusOr<int> ParseClientFlag(int argc, char** argv, int i, client::ClientOptions& options);

/// Parses a command line made only of client flags (`loom models`, `loom status`). Returns
/// nullopt to go on, or the exit code after printing the usage (0 for --help, 2 for a bad
/// or unknown argument): `loom <command>: <problem>` then `usage` and the client flags.
std::optional<int> ParseClientFlagsOnly(int argc, char** argv, const char* command,
                                        const char* usage, client::ClientOptions& options);

/// The generation flags of `loom complete` and `loom chat`, as lines of a usage text.
extern const char kGenerationFlagsHelp[];

/// Consumes argv[i] and its value when it is a generation flag: `--max-tokens N`,
/// `--temperature T`, `--top-p P`, `--top-k K`, `--seed S`, `--stop TEXT` (repeatable).
/// Returns as ParseClientFlag.
absl::StatusOr<int> ParseGenerationFlag(int argc, char** argv, int i,
                                        client::GenerateRequest& request);

/// Parses `value` of `flag` as a number; InvalidArgument naming both otherwise.
absl::StatusOr<double> ParseNumberFlag(const std::string& flag, const char* value);
absl::StatusOr<int> ParseIntFlag(const std::string& flag, const char* value);

}  // namespace loom::coordinator
