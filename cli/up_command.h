#pragma once

namespace loom::coordinator {

/// `loom up --model PATH [--replicas R] [--workers N] [worker and serve flags]`: a
/// coordinator and its workers on this machine (one `loom-worker` process per replica
/// today). Ctrl-C / SIGTERM drains, then stops the workers.
int RunUpCommand(int argc, char** argv);

}  // namespace loom::coordinator
