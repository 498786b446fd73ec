#pragma once

namespace loom::cli {

/// `loom chat [flags]`: an interactive conversation with a running cluster. Reads one user
/// message per line of standard input, streams the reply to standard output and keeps the
/// conversation for the next turn; `/exit` or end of input quits. The prompt is rendered
/// with the model's chat template, read from `--model PATH` or, when the coordinator runs
/// on this machine, from the file ListModels names. argv[0] is "chat". Returns 0, 1 when
/// the cluster cannot be reached, 2 on bad arguments.
int RunChatCommand(int argc, char** argv);

}  // namespace loom::cli
