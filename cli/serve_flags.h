#pragma once

#include "CLI/CLI.hpp"
#include "api/coordinator_server.h"

namespace loom::cli {

/// Declares the coordinator's flags (`loom serve`, also `loom up`) on `app`, bound to
/// `options`: the model (positional MODEL or --model), vLLM's names where the meaning is
/// the same (--port, --max-num-seqs, --max-num-batched-tokens, --max-model-len,
/// --served-model-name, --enable-prefix-caching, --disable-log-requests...) with Loom's
/// older names as aliases (--http-port, --prefix-caching).
void AddServeFlags(CLI::App& app, api::ServeOptions& options);

}  // namespace loom::cli
