#!/usr/bin/env bash
# The main job on a fresh machine: dependencies, the bundled default model, the build,
# then Loom's CPU engine answering a chat message with the default model. Arguments
# replace the default generation flags, e.g.
#   scripts/run.sh --prompt "Write a haiku about caches" --temperature 0.7 --seed 1
# (Serving over gRPC/HTTP arrives with the cluster core; this runs the engine in-process.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/build.sh
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "$#" -eq 0 ]; then
  set -- --prompt "What is the capital of France?" --max-tokens 64
fi
exec build/coordinator/loom generate --model "$model" --chat "$@"
