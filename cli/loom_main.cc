// `loom`: the command line. Each subcommand lives in coordinator/<name>_command.cc.
#include <cstdio>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "cli/bench_command.h"
#include "cli/chat_command.h"
#include "cli/complete_command.h"
#include "cli/generate_command.h"
#include "cli/hf_hub.h"
#include "cli/inspect_command.h"
#include "cli/models_command.h"
#include "cli/perplexity_command.h"
#include "cli/quantize_command.h"
#include "cli/serve_command.h"
#include "cli/status_command.h"
#include "cli/tokenize_command.h"
#include "cli/up_command.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

constexpr Command kCommands[] = {
    {"up", loom::cli::RunUpCommand,
     "start a coordinator and its workers on this machine and serve"},
    {"serve", loom::cli::RunServeCommand,
     "run the coordinator alone (workers register with it)"},
    {"inspect", loom::cli::RunInspectCommand,
     "show a model's configuration, tokenizer and chat template"},
    {"generate", loom::cli::RunGenerateCommand,
     "generate a continuation of a prompt in this process (CPU engine)"},
    {"quantize", loom::cli::RunQuantizeCommand,
     "write a model with INT8/INT4 (RTN or AWQ), F16 or F32 linear layers"},
    {"perplexity", loom::cli::RunPerplexityCommand,
     "perplexity of a text under a model, sliding window (CPU engine)"},
    {"bench", loom::cli::RunBenchCommand,
     "load-test a running cluster (throughput, TTFT/TPOT/ITL/e2e, goodput)"},
    {"tokenize", loom::cli::RunTokenizeCommand, "print the token ids of a text"},
    {"detokenize", loom::cli::RunDetokenizeCommand, "print the text of token ids"},
    {"chat", loom::cli::RunChatCommand,
     "chat with a running cluster (interactive, streaming)"},
    {"complete", loom::cli::RunCompleteCommand,
     "generate a completion of a prompt on a running cluster"},
    {"models", loom::cli::RunModelsCommand, "list the models a running cluster serves"},
    {"status", loom::cli::RunStatusCommand,
     "show a running cluster's replicas, KV blocks and queues"},
};

void PrintUsage() {
  std::fprintf(stderr, "usage: loom <command> [args]\n\ncommands:\n");
  for (const Command& command : kCommands) {
    std::fprintf(stderr, "  %-12s %s\n", command.name, command.help);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The system's Abseil is built without NDEBUG, which leaves Mutex deadlock detection on:
  // every lock then updates a process-wide lock graph under one global spin lock, a
  // measurable share of the coordinator's step loop. The unit tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // --model org/name: a Hugging Face Hub id, fetched into the local cache.
  loom::cli::InstallHubModelLocator();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  for (const Command& command : kCommands) {
    if (std::strcmp(argv[1], command.name) == 0) return command.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "loom: unknown command '%s'\n\n", argv[1]);
  PrintUsage();
  return 2;
}
