#!/usr/bin/env bash
# The tests whose outcome rests on time again, as on a slower machine than this one: the CPU
# kernels capped at AVX2 (LOOM_CPU_ISA=avx2, what an AVX2-only CPU runs) and every process on
# one core (taskset -c 0) while ctest runs two tests at once, so each sees about half a core.
# Those tests carry the pytest marker slow_machine (a whole file through `pytestmark`, or one
# test): they wait on a heartbeat, a deadline, admission, a delay or a measured cost, and none
# may depend on this machine's speed. The rest (what a reply contains, whatever the time it
# took) runs once, in scripts/test.sh. The kernel tests under each ISA are ctest's kernels/isa_*
# entries; the unit tests run on the no-op backend or without timing. Run after
# scripts/test.sh (it needs build/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[[ -d build ]] || { echo "test-slow-machine.sh: run scripts/test.sh first (no build/)" >&2; exit 2; }
isa=avx2
grep -qw avx2 /proc/cpuinfo || isa=scalar
echo "test-slow-machine: LOOM_CPU_ISA=$isa, one core (taskset -c 0), ctest -j2"
# The ctest entries (one per pytest file) that hold a marked test; pytest runs only those tests.
files=$(cd tests && grep -rl --include='*_test.py' -E '^ *(pytestmark = pytest\.mark\.slow_machine|@pytest\.mark\.slow_machine)' . |
  sed -e 's|^\./||' -e 's|\.py$||' | LC_ALL=C sort | paste -sd'|' -)
[[ -n "$files" ]] || { echo "test-slow-machine.sh: no test is marked slow_machine" >&2; exit 2; }
status=0
LOOM_CPU_ISA="$isa" PYTEST_ADDOPTS="-m slow_machine" taskset -c 0 ctest --test-dir build --output-on-failure -j2 \
  -R "^py/($files)\$" "$@" || status=$?
if ((status != 0)); then python3 scripts/test-failure-digest.py; fi
exit "$status"
