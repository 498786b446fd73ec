#pragma once

namespace loom::cli {

/// `loom models [--address HOST:PORT ...]`: prints the models a running cluster serves,
/// one row each (id, architecture, vocabulary, context length, fingerprint). argv[0] is
/// "models". Returns 0, 1 when the call failed, 2 on bad arguments.
int RunModelsCommand(int argc, char** argv);

}  // namespace loom::cli
