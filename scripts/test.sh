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
# A clean clone has no test timings, so ctest would start tests in the order they are
# declared and could leave a long one to run alone at the end. It starts the costliest first
# when it knows their cost: seed its cost file with the long tests' seconds (>= 8 s,
# measured on a 2-core AVX2 CI machine; tests/ctest_cost_seed.txt), which ctest replaces
# with this machine's own times after the run.
costs=build/Testing/Temporary/CTestCostData.txt
if [[ ! -f "$costs" ]]; then
  mkdir -p "$(dirname "$costs")"
  cp tests/ctest_cost_seed.txt "$costs"
fi
status=0
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@" || status=$?
# A failure's own lines, last: the tail of a CI log then names what failed and why.
if ((status != 0)); then python3 scripts/test-failure-digest.py; fi
exit "$status"
