#pragma once

namespace loom::cli {

/// The `loom-worker` process: loads the model (or only its config, for the noop
/// backend), allocates the KV pool from a memory budget, serves `loom.v1.Worker`,
/// registers with the coordinator and heartbeats until SIGTERM/SIGINT. Prints
/// "loom-worker: listening on HOST:PORT" on stdout once serving. Returns the exit code:
/// 0 after a signal, 1 on a runtime failure (model, bind, refused by the coordinator),
/// 2 on a bad command line. Flags: `loom-worker --help` (cli/worker_options.cc, AddWorkerFlags).
int RunWorkerCommand(int argc, char** argv);

}  // namespace loom::cli
