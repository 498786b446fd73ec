#pragma once

namespace loom::api {
class CoordinatorServer;
}  // namespace loom::api

namespace loom::cli {

/// Prints the lines that say where `server` listens (gRPC, and HTTP(S) when on), which
/// scripts and tests wait for; `loom serve` and `loom up` alike.
void PrintServingAddresses(const api::CoordinatorServer& server);

/// `loom serve --model PATH [flags]`: the coordinator alone; workers register with it.
int RunServeCommand(int argc, char** argv);

}  // namespace loom::cli
