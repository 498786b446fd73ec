#pragma once

namespace loom::cli {

/// `loom inspect --model PATH [--prompt TEXT]`: prints the model's hyper-parameters,
/// tensor formats and tokenizer, then renders the model's chat template for one user
/// message and tokenizes the result. argv[0] is "inspect". Returns the exit code.
int RunInspectCommand(int argc, char** argv);

}  // namespace loom::cli
