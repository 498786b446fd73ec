#!/usr/bin/env bash
# The main job on a fresh machine: dependencies, the bundled default model, the build,
# then Loom serving the default model: a coordinator (gRPC on 127.0.0.1:50051) and one CPU
# worker, via `loom up`. Arguments go to `loom up`, e.g.
#   scripts/run.sh --replicas 2 --grpc-port 50052
# Ctrl-C drains in-flight requests and stops the workers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/build.sh
exec build/coordinator/loom up --model models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
