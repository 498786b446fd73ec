#!/usr/bin/env bash
# The real-process tests again as on a slower machine than this one: the CPU kernels capped
# at AVX2 (LOOM_CPU_ISA=avx2, what an AVX2-only CPU runs) and every process on one core
# (taskset -c 0) while ctest runs two tests at once, so each sees about half a core. These
# are the tests whose processes wait on model work (clusters, HTTP, clients, metrics,
# liveness, overload, drain, the chart's processes): none may depend on this machine's
# speed. The kernel tests under each ISA are ctest's kernels/isa_* entries; the unit tests
# run on the no-op backend or without timing. Left out: the tests that check what a reply
# contains and wait only for the reply (speculative decoding's agreement, structured output,
# tool formats, sampling parameters, embeddings, the HTTP fuzz, the SDK's pip install):
# they have no deadline, heartbeat, admission or measured-cost decision to get wrong on a
# slow machine, and the plain run covers them. Run after scripts/test.sh (it needs build/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[[ -d build ]] || { echo "test-slow-machine.sh: run scripts/test.sh first (no build/)" >&2; exit 2; }
isa=avx2
grep -qw avx2 /proc/cpuinfo || isa=scalar
echo "test-slow-machine: LOOM_CPU_ISA=$isa, one core (taskset -c 0), ctest -j2"
LOOM_CPU_ISA="$isa" taskset -c 0 ctest --test-dir build --output-on-failure -j2 \
  -R '^py/(cluster|http|client|observability)/|^py/worker/worker_process_test$|^py/deploy/chart_processes_test$' \
  -E '^py/(cluster/speculative_decoding|http/(structured_output|tool_formats|tool_calls|sampling_params|embeddings|http_fuzz)|client/install)_test$' \
  "$@"
