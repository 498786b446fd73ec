// `loom-worker`: one worker process (see cli/worker_command.h).
#include "absl/synchronization/mutex.h"
#include "cli/hf_hub.h"
#include "cli/worker_command.h"

int main(int argc, char** argv) {
  // The system Abseil checks every lock for deadlock cycles; the step loop locks per step.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // --model org/name: a Hugging Face Hub id, fetched into the local cache.
  loom::cli::InstallHubModelLocator();
  return loom::cli::RunWorkerCommand(argc, argv);
}
