#pragma once

namespace loom::cli {

/// `loom complete [flags] PROMPT`: generates a completion of PROMPT ("-" reads standard
/// input) on a running cluster and prints it; `--stream` prints it as it arrives. The
/// finish reason and token counts go to stderr. argv[0] is "complete". Returns 0, 1 when
/// the call failed, 2 on bad arguments.
int RunCompleteCommand(int argc, char** argv);

}  // namespace loom::cli
