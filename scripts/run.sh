#!/usr/bin/env bash
# The main job on a fresh machine: dependencies, the bundled default model, the build,
# then Loom on the default model. (Serving arrives with the cluster core; until then this
# shows what the engine reads from the model: configuration, tokenizer, chat prompt.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/build.sh
exec build/coordinator/loom inspect --model models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
