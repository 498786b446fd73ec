#!/usr/bin/env bash
# The whole test suite from a fresh machine: dependencies, the default model, the build,
# the GPU verification bundle (where the CUDA toolkit is), then every test (GoogleTest, the
# Python reference tests, the bounded fuzz run, the bundle's dry run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
bash scripts/fetch-model.sh
bash scripts/build.sh
# The archive a lent GPU machine runs (docs/gpu_verification.md): built and size-checked on
# every run, so it can never silently outgrow the GPU window; tests/gpu/quick_test.py
# dry-runs it. Packed from build/ (--from) rather than compiled a second time: a lent
# window's session runs bundle.sh alone for the sm_90-only Release build.
if command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  PATH="$PATH:/usr/local/cuda/bin" bash tests/gpu/bundle.sh --from build
  export LOOM_REQUIRE_GPU_BUNDLE=1
fi
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
