#pragma once

namespace loom::cli {

/// `loom status [--address HOST:PORT ...]`: prints a running cluster's state: the served
/// model, queue depth, and one row per replica (health, backend, KV blocks free of total,
/// running and waiting sequences, steps, preemptions). argv[0] is "status". Returns 0, 1
/// when the call failed, 2 on bad arguments.
int RunStatusCommand(int argc, char** argv);

}  // namespace loom::cli
