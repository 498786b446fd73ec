#!/usr/bin/env bash
# The kernels' tuning sweeps and profiles on a lent GPU (docs/gpu_verification.md, "Tuning
# and profiling the kernels"), a second call after quick.sh passed: unpacks the bundle that
# tests/gpu/bundle.sh made, then runs, each under its own limit,
#   1. tests     every tuning-space member against its CPU reference
#                (loom_kernels_tests --gtest_filter='*.EveryCandidate*')
#   1b. racecheck the tensor-core decode candidate on a small batch under compute-sanitizer
#   2. gemm      quantized_gemm_bench --sweep: the quantized GEMM's table against its
#                candidates at m = 1-256 on Llama-3-8B's shapes, W4A16 and W8A16
#   3. attention cuda_attention_bench --sweep: decode attention's tilings at batch 1-128 x
#                context 1k-16k, F16 and INT8 K/V
#   4. profile   tests/gpu/profile.sh: Nsight Compute on the dispatched kernels at the GPU
#                benchmarks' --quick shapes (decode and prefill attention, the W4A16/W8A16
#                GEMM beside cuBLAS at m = 1/16/64, one batch-1 decode step of the forward
#                pass): one line per kernel (DRAM and SM throughput against peak, occupancy,
#                the top warp stalls)
# and leaves in $OUT: candidate_tests.txt, sweep.txt (both sweeps' tables, then each member
# ranked against what is dispatched by tests/gpu/sweep_report.py), quantized_gemm_sweep.json,
# cuda_attention_sweep.json, profile.txt, profile.json and profile_csv.tar.gz.
#
#   tests/gpu/sweep.sh [--bundle ARCHIVE] [--dry-run]
#
# --dry-run (any machine, CI): unpacks the bundle, checks it holds the four binaries, lists
# the steps and their limits, runs nothing. Environment: OUT (default
# bench/results/gpu/latest-sweep), LOOM_GPU_BUNDLE, CUDA_HOME. Exit status: 1 when a step
# failed or timed out, 2 for bad arguments or an unusable bundle, else 0.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUNDLE="${LOOM_GPU_BUNDLE:-$ROOT/build-gpu-bundle/loom-gpu-bundle.tar.xz}"
DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bundle) BUNDLE="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n 2,25p "$0"; exit 0 ;;
    *) echo "sweep.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -f "$BUNDLE" ]] || { echo "sweep.sh: no bundle at $BUNDLE (tests/gpu/bundle.sh)" >&2; exit 2; }
OUT="${OUT:-$ROOT/bench/results/gpu/latest-sweep}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
tar -C "$WORK" -xJf "$BUNDLE" || { echo "sweep.sh: cannot unpack $BUNDLE" >&2; exit 2; }
for bin in loom_kernels_tests quantized_gemm_bench cuda_attention_bench cuda_forward_pass_bench; do
  [[ -x "$WORK/bin/$bin" ]] || { echo "sweep.sh: the bundle lacks bin/$bin" >&2; exit 2; }
done
# The limits add up to 265 s (the call's timeout_s is 300): the GEMM's sweep took 25 s on the
# H200; the profile step gives its three benchmarks 20, 24 and 30 s under ncu.
STEPS=(tests racecheck gemm attention profile)
declare -A LIMIT=([tests]=50 [racecheck]=15 [gemm]=50 [attention]=75 [profile]=80)
if ((DRY_RUN)); then
  echo "steps:"
  for step in "${STEPS[@]}"; do printf '  %-10s %3d s\n' "$step" "${LIMIT[$step]}"; done
  exit 0
fi
mkdir -p "$OUT"
CUDA_ROOT="${CUDA_HOME:-/usr/local/cuda}"
export LD_LIBRARY_PATH="$WORK/lib:$CUDA_ROOT/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
run_step() {  # run_step NAME OUTPUT-FILE COMMAND...
  local name="$1" file="$2"
  shift 2
  local t0=$SECONDS
  timeout -k 5 "${LIMIT[$name]}" "$@" >> "$file" 2>&1
  local code=$?
  echo "[sweep $((SECONDS - t0))s] $name: exit $code"
  ((code == 0)) || status=1
}
run_step tests "$OUT/candidate_tests.txt" "$WORK/bin/loom_kernels_tests" \
  --gtest_filter='*.EveryCandidate*'
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/candidate_tests.txt"
# The tensor-core decode kernel's rings under racecheck (quick.sh's sanitizer subset runs the
# dispatched kernels only).
SANITIZER="$(command -v compute-sanitizer || echo "$CUDA_ROOT/bin/compute-sanitizer")"
if [[ -x "$SANITIZER" ]]; then
  run_step racecheck "$OUT/candidate_tests.txt" "$SANITIZER" --tool racecheck --error-exitcode 99 \
    --print-limit 20 "$WORK/bin/loom_kernels_tests" \
    --gtest_filter='CudaPagedDecodeTest.TensorCoreCandidateOnASmallBatch'
  tail -n 5 "$OUT/candidate_tests.txt"
else
  echo "[sweep] racecheck: compute-sanitizer not found"
fi
run_step gemm "$OUT/sweep.txt" env OUT="$OUT" "$WORK/bin/quantized_gemm_bench" --sweep
run_step attention "$OUT/sweep.txt" env OUT="$OUT" "$WORK/bin/cuda_attention_bench" --sweep
cat "$OUT/sweep.txt"
# The members ranked against what is dispatched (tests/gpu/sweep_report.py).
if command -v python3 > /dev/null && compgen -G "$OUT/*_sweep.json" > /dev/null; then
  python3 "$ROOT/tests/gpu/sweep_report.py" "$OUT" | tee -a "$OUT/sweep.txt"
fi
# The profiles (profile.sh writes profile.txt; its progress lines join sweep.txt).
run_step profile "$OUT/sweep.txt" bash "$ROOT/tests/gpu/profile.sh" --bin "$WORK/bin"
[[ -f "$OUT/profile.txt" ]] && cat "$OUT/profile.txt"
exit "$status"
