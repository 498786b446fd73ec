#pragma once

namespace loom::cli {

/// `loom generate --model PATH --prompt TEXT [--max-tokens N] [--temperature T]
/// [--top-p P] [--top-k K] [--min-p P] [--seed S] [--chat] [--threads N]
/// [--kv-dtype f16|f32|int8|fp8_e4m3] [--device cuda|cpu|auto] [--cuda-graphs on|off]`: prints the
/// continuation as it is produced, then prefill and decode tokens/s on stderr. argv[0] is
/// "generate". Returns the exit code.
int RunGenerateCommand(int argc, char** argv);

}  // namespace loom::cli
