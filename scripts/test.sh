#!/usr/bin/env bash
# The whole test suite from a fresh machine: dependencies, the default model, the build,
# then every test (GoogleTest, the Python reference tests, the bounded fuzz run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
