#pragma once

namespace loom::coordinator {

/// `loom serve --model PATH [flags]`: the coordinator alone; workers register with it.
int RunServeCommand(int argc, char** argv);

}  // namespace loom::coordinator
