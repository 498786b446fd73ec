// `loom-worker`: one worker process (see cli/worker_command.h).
#include "absl/synchronization/mutex.h"
#include "cli/worker_command.h"

int main(int argc, char** argv) {
  // The system Abseil checks every lock for deadlock cycles; the step loop locks per step.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return loom::cli::RunWorkerCommand(argc, argv);
}
