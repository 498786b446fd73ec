#pragma once

#include "CLI/CLI.hpp"
#include "client/client_options.h"
#include "client/generate_request.h"

namespace loom::cli {

/// Declares the flags of every command that talks to a running cluster (`loom chat`,
/// `complete`, `models`, `status`): `--address HOST:PORT`, `--timeout SECONDS` (per call),
/// `--tls`, `--tls-root-certs PATH` (implies --tls).
void AddClientFlags(CLI::App& app, client::ClientOptions& options);

/// Declares the generation flags of `loom complete` and `loom chat`: `--max-tokens N`,
/// `--temperature T`, `--top-p P`, `--top-k K`, `--seed S`, `--stop TEXT` (repeatable).
void AddGenerationFlags(CLI::App& app, client::GenerateRequest& request);

/// A command made only of client flags (`loom models`, `loom status`): parses argv.
/// Returns nullopt to go on, or the exit code (0 after --help, 2 after one error line).
std::optional<int> ParseClientFlagsOnly(int argc, char** argv, const char* command,
                                        const char* description, client::ClientOptions& options);

}  // namespace loom::cli
