#!/usr/bin/env bash
# Nsight Compute profiles of the kernels behind the GPU benchmarks' figures (issue 34: a miss
# explained by a profile), the profile step of tests/gpu/sweep.sh. Runs the --profile form of
# cuda_attention_bench, quantized_gemm_bench and cuda_forward_pass_bench (their --quick shapes,
# each launched once more inside a profiler range: bench/profile_range.h) under
#   ncu --profile-from-start off --clock-control none --cache-control all
#       --section SpeedOfLight,MemoryWorkloadAnalysis,Occupancy,LaunchStats,WarpStateStats,
#                 ComputeWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum
# (the clocks as the machine has them; caches flushed before every replay, as the benchmarks
# rotate operands past L2), imports each report as CSV (raw page, base units), and leaves in
# $OUT: profile.txt (one line per kernel of each range, named by its shape:
# tests/gpu/profile_report.py), profile.json (the same figures) and profile_csv.tar.gz (the
# raw pages and the benchmarks' output, for what the summary leaves out).
#
#   tests/gpu/profile.sh --bin DIR [--limit SECONDS]
#
# --bin: the unpacked bundle's bin/ (the caller sets LD_LIBRARY_PATH); --limit: each
# benchmark's time under ncu (default 20 s attention, 24 s GEMM, 30 s the forward pass, which
# builds a model first: 74 s with the imports inside sweep.sh's 80). Exit status: 0 when every
# benchmark ran under ncu,
# or when ncu is not on this machine (profile.txt says so); 1 when a benchmark failed or ran
# out of time; 2 for bad arguments.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN=""
LIMIT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) BIN="${2:-}"; shift 2 || shift ;;
    --limit) LIMIT="${2:-}"; shift 2 || shift ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "profile.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$BIN" && -d "$BIN" ]] || { echo "profile.sh: --bin DIR (the bundle's bin/) is required" >&2; exit 2; }
[[ -z "$LIMIT" || "$LIMIT" =~ ^[0-9]+$ ]] || { echo "profile.sh: --limit takes whole seconds" >&2; exit 2; }
BENCHES=(cuda_attention_bench quantized_gemm_bench cuda_forward_pass_bench)
declare -A BENCH_LIMIT=([cuda_attention_bench]=20 [quantized_gemm_bench]=24 [cuda_forward_pass_bench]=30)
for bench in "${BENCHES[@]}"; do
  [[ -x "$BIN/$bench" ]] || { echo "profile.sh: $BIN lacks $bench" >&2; exit 2; }
done
OUT="${OUT:-$ROOT/bench/results/gpu/latest-profile}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# ncu: on the PATH, in the CUDA toolkit, or Nsight Compute's own folder (newest first).
NCU="$(command -v ncu || true)"
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/ncu" $(ls -d /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | sort -rV); do
  [[ -z "$NCU" && -x "$candidate" ]] && NCU="$candidate"
done
if [[ -z "$NCU" ]]; then
  echo "ncu: unavailable (not on the PATH, in \$CUDA_HOME/bin or /opt/nvidia/nsight-compute): nothing profiled" |
    tee "$OUT/profile.txt"
  exit 0
fi
echo "ncu: $NCU ($("$NCU" --version 2>&1 | tail -1))" > "$WORK/header.txt"

status=0
for bench in "${BENCHES[@]}"; do
  t0=$SECONDS
  OUT="$WORK/results" timeout -k 5 "${LIMIT:-${BENCH_LIMIT[$bench]}}" "$NCU" --profile-from-start off \
    --clock-control none --cache-control all --replay-mode kernel --launch-count 200 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum \
    --export "$WORK/$bench" --force-overwrite "$BIN/$bench" --profile > "$WORK/$bench.log" 2>&1
  code=$?
  echo "$code $((SECONDS - t0))" > "$WORK/$bench.status"
  ((code == 0)) || status=1
  if [[ -f "$WORK/$bench.ncu-rep" ]]; then
    "$NCU" --import "$WORK/$bench.ncu-rep" --csv --page raw --print-units base \
      > "$WORK/$bench.csv" 2>> "$WORK/$bench.log" ||
      "$NCU" --import "$WORK/$bench.ncu-rep" --csv --page raw > "$WORK/$bench.csv" 2>> "$WORK/$bench.log"
  fi
  echo "[profile $((SECONDS - t0))s] $bench: exit $code"
done
{
  cat "$WORK/header.txt"
  python3 "$ROOT/tests/gpu/profile_report.py" "$WORK" --json "$OUT/profile.json"
} > "$OUT/profile.txt" 2>&1 || status=1
(cd "$WORK" && tar -czf "$OUT/profile_csv.tar.gz" $(ls *.csv *.log 2> /dev/null))
cat "$OUT/profile.txt"
exit "$status"
