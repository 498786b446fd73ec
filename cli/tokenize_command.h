#pragma once

namespace loom::cli {

/// `loom tokenize --model PATH [--no-special] [--no-parse-special] TEXT`: prints the
/// token ids of TEXT ("-" reads standard input) space-separated on one line.
/// `--no-special`: no BOS/EOS; `--no-parse-special`: "<|im_start|>" stays plain text.
/// argv[0] is "tokenize". Returns 0, 1 on errors, 2 on bad arguments.
int RunTokenizeCommand(int argc, char** argv);

/// `loom detokenize --model PATH [--skip-special] IDS...`: prints the text of the ids
/// (given as separate arguments or comma/space-separated) followed by a newline.
/// argv[0] is "detokenize". Returns 0, 1 on errors, 2 on bad arguments.
int RunDetokenizeCommand(int argc, char** argv);

}  // namespace loom::cli
