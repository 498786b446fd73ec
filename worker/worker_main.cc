// `loom-worker`: one worker process (see worker/worker_command.h).
#include "worker/worker_command.h"

int main(int argc, char** argv) { return loom::worker::RunWorkerCommand(argc, argv); }
