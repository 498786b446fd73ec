#!/usr/bin/env bash
# Runs every CPU benchmark (never part of the tests) and writes bench/results/*.json.
# Each prints its figure next to a limit or baseline measured in the same run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/build.sh
export LOOM_SOURCE_DIR="$root"
for bench in build/bench/*_bench; do
  echo "== $bench"
  "$bench"
done
for bench in bench/*_bench.py; do
  echo "== $bench"
  .venv/bin/python "$bench"
done
