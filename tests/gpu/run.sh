#!/usr/bin/env bash
# The GPU test suite: the one script to run on a machine with an NVIDIA GPU.
#
#   tests/gpu/run.sh                     # configure build-gpu/ (LOOM_CUDA=ON), build, test
#   tests/gpu/run.sh --prebuilt DIR      # run a bundle made by tests/gpu/bundle.sh instead
#
# It builds the kernel tests (loom_kernels_tests: every CUDA kernel against its CPU
# reference on random inputs, NaN-poisoned outputs, stated tolerances), runs them, runs
# compute-sanitizer memcheck and racecheck on the CUDA tests when the tool is there, and
# writes report.json + report.txt (device, driver, commit, every test's result) into $OUT
# when set, else bench/results/gpu/.
#
# Building needs the project's dependencies (Debian's Abseil, GoogleTest, gRPC, ...: the
# top-level configure asks for all of them). A bare machine with only the CUDA toolkit,
# cmake, ninja and python cannot configure Loom; there, run a bundle built elsewhere:
#   tests/gpu/bundle.sh build-gpu-bundle     # on a machine with the dependencies
#   tests/gpu/run.sh --prebuilt build-gpu-bundle   # on the GPU machine (x86-64, glibc >= the builder's)
# Environment: OUT (report folder), LOOM_SANITIZERS (default "memcheck racecheck"; empty
# skips them), LOOM_SANITIZER_TIMEOUT (seconds per tool, default 900), LOOM_COMMIT (the
# commit id where the tree has no .git), LOOM_GPU_BUILD_DIR (default build-gpu).
# Exit status: 0 when every step that ran passed; CUDA tests skipped on a machine with a
# GPU count as a failure.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PREBUILT=""
BUILD_DIR="${LOOM_GPU_BUILD_DIR:-build-gpu}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prebuilt) PREBUILT="$2"; shift 2 ;;
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
REPORT_DIR="${OUT:-$ROOT/bench/results/gpu}"
mkdir -p "$REPORT_DIR"
LOG="$REPORT_DIR/log.txt"
: > "$LOG"
say() { echo "[gpu] $*" | tee -a "$LOG"; }

RUN_ENV=()
status_build="skipped"
status_tests="skipped"
status_memcheck="skipped"
status_racecheck="skipped"
status_nccl="skipped"
status_cuda_runner="skipped"
overall=0

# --- the test binary
if [[ -n "$PREBUILT" ]]; then
  TEST_BIN="$PREBUILT/loom_kernels_tests"
  # Only the test processes see the bundled libraries (python3 below keeps its own).
  # cuBLAS is not bundled: the GPU machine's CUDA toolkit provides it.
  CUDA_LIB="${CUDA_HOME:-/usr/local/cuda}/lib64"
  RUN_ENV=(env "LD_LIBRARY_PATH=$PREBUILT/lib:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  status_build="prebuilt ($PREBUILT)"
  [[ -x "$TEST_BIN" ]] || { say "no executable $TEST_BIN"; status_build="missing"; overall=1; }
else
  say "configure $BUILD_DIR (LOOM_CUDA=ON)"
  if cmake -S . -B "$BUILD_DIR" -G Ninja -DLOOM_CUDA=ON -DLOOM_WERROR=ON -DLOOM_BUILD_BENCH=OFF \
       >> "$LOG" 2>&1 &&
     cmake --build "$BUILD_DIR" --target loom_kernels_tests loom_worker_tests -j "$(nproc)" \
       >> "$LOG" 2>&1; then
    status_build="ok"
  else
    status_build="failed"
    overall=1
    say "build failed (see log.txt); without Loom's dependencies use --prebuilt (tests/gpu/bundle.sh)"
  fi
  TEST_BIN="$BUILD_DIR/tests/loom_kernels_tests"
fi

# --- the tests (all kernel tests: CPU and CUDA)
if [[ -x "$TEST_BIN" && "$status_build" != "failed" ]]; then
  say "run $TEST_BIN"
  if "${RUN_ENV[@]}" "$TEST_BIN" --gtest_output="json:$REPORT_DIR/gtest.json" >> "$LOG" 2>&1; then
    status_tests="passed"
  else
    status_tests="failed"
    overall=1
  fi
  # compute-sanitizer over the CUDA tests only (the CPU tests are slow under it and have no
  # device code).
  SANITIZER="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  if [[ -x "$SANITIZER" ]] && command -v nvidia-smi > /dev/null; then
    for tool in ${LOOM_SANITIZERS-memcheck racecheck}; do
      say "compute-sanitizer --tool $tool (at most ${LOOM_SANITIZER_TIMEOUT:-900} s)"
      timeout "${LOOM_SANITIZER_TIMEOUT:-900}" "${RUN_ENV[@]}" "$SANITIZER" --tool "$tool" \
        --error-exitcode 99 --print-limit 20 "$TEST_BIN" --gtest_filter='Cuda*:DequantizeCuda*' \
        > "$REPORT_DIR/$tool.txt" 2>&1
      case $? in
        0) result="passed" ;;
        124) result="timed out" ;;
        *) result="failed" ;;
      esac
      printf -v "status_$tool" '%s' "$result"
      [[ "$result" == "passed" ]] || overall=1
    done
  else
    say "compute-sanitizer or nvidia-smi not found: sanitizers skipped"
  fi
fi

# --- the NCCL communicator, world size 1 (the same code path as multi-GPU runs)
WORKER_BIN="${PREBUILT:+$PREBUILT/loom_worker_tests}"
WORKER_BIN="${WORKER_BIN:-$BUILD_DIR/tests/loom_worker_tests}"
if [[ -x "$WORKER_BIN" ]]; then
  say "run $WORKER_BIN --gtest_filter=Nccl*"
  if "${RUN_ENV[@]}" "$WORKER_BIN" --gtest_filter='Nccl*' \
       --gtest_output="json:$REPORT_DIR/gtest_nccl.json" >> "$LOG" 2>&1; then
    status_nccl="passed"
    if command -v nvidia-smi > /dev/null && grep -q '"result": "SKIPPED"' "$REPORT_DIR/gtest_nccl.json"; then
      status_nccl="skipped on a machine with a GPU"
      overall=1
    fi
  else
    status_nccl="failed"
    overall=1
  fi
fi

# --- the CUDA model runner end to end against the CPU runner (default model from
# LOOM_MODEL_PATH, else the bundle's models/ or the checkout's; random models built in the
# test). CreateFailsCleanlyWithoutADevice skips by design where a GPU is present.
MODEL_ENV=()
if [[ -z "${LOOM_MODEL_PATH:-}" && -n "$PREBUILT" && -f "$PREBUILT/models/SmolLM2-135M-Instruct.Q4_1.gguf" ]]; then
  MODEL_ENV=(env "LOOM_MODEL_PATH=$PREBUILT/models/SmolLM2-135M-Instruct.Q4_1.gguf")
fi
if [[ -x "$WORKER_BIN" ]]; then
  say "run $WORKER_BIN --gtest_filter=CudaModelRunner*"
  if "${MODEL_ENV[@]}" "${RUN_ENV[@]}" "$WORKER_BIN" \
       --gtest_filter='CudaModelRunner*:-*WithoutADevice' \
       --gtest_output="json:$REPORT_DIR/gtest_cuda_runner.json" >> "$LOG" 2>&1; then
    status_cuda_runner="passed"
    if command -v nvidia-smi > /dev/null && grep -q '"result": "SKIPPED"' "$REPORT_DIR/gtest_cuda_runner.json"; then
      status_cuda_runner="skipped on a machine with a GPU"
      overall=1
    fi
  else
    status_cuda_runner="failed"
    overall=1
  fi
fi

# --- GPU benchmarks (not pass/fail): output and JSON kept in the report folder
BENCH_BIN="${PREBUILT:+$PREBUILT/quantized_gemm_bench}"
if [[ -z "$PREBUILT" && "$status_build" == "ok" ]]; then
  say "build quantized_gemm_bench"
  if cmake -S . -B "$BUILD_DIR" -DLOOM_BUILD_BENCH=ON >> "$LOG" 2>&1 &&
     cmake --build "$BUILD_DIR" --target quantized_gemm_bench -j "$(nproc)" >> "$LOG" 2>&1; then
    BENCH_BIN="$BUILD_DIR/bench/quantized_gemm_bench"
  else
    say "quantized_gemm_bench did not build (see log.txt)"
  fi
fi
if [[ -n "$BENCH_BIN" && -x "$BENCH_BIN" ]]; then
  say "run $BENCH_BIN (quantized_gemm_bench.txt, quantized_gemm.json)"
  OUT="$REPORT_DIR" "${RUN_ENV[@]}" "$BENCH_BIN" > "$REPORT_DIR/quantized_gemm_bench.txt" 2>&1 ||
    say "quantized_gemm_bench failed (see quantized_gemm_bench.txt)"
fi
# Paged attention (decode bytes/s vs copy bandwidth, prefill FLOP/s vs cuBLAS GEMM).
ATTENTION_BENCH="${PREBUILT:+$PREBUILT/cuda_attention_bench}"
if [[ -z "$PREBUILT" && "$status_build" == "ok" ]]; then
  say "build cuda_attention_bench"
  if cmake -S . -B "$BUILD_DIR" -DLOOM_BUILD_BENCH=ON >> "$LOG" 2>&1 &&
     cmake --build "$BUILD_DIR" --target cuda_attention_bench -j "$(nproc)" >> "$LOG" 2>&1; then
    ATTENTION_BENCH="$BUILD_DIR/bench/cuda_attention_bench"
  else
    say "cuda_attention_bench did not build (see log.txt)"
  fi
fi
if [[ -n "$ATTENTION_BENCH" && -x "$ATTENTION_BENCH" ]]; then
  say "run $ATTENTION_BENCH (cuda_attention_bench.txt, cuda_attention.json)"
  OUT="$REPORT_DIR" "${RUN_ENV[@]}" "$ATTENTION_BENCH" > "$REPORT_DIR/cuda_attention_bench.txt" 2>&1 ||
    say "cuda_attention_bench failed (see cuda_attention_bench.txt)"
fi
# The CUDA runner end to end (Llama-3-8B shape, random F16 weights made on the device):
# batch-1 decode weight bytes/s vs copy bandwidth, tokens/s at batch 1-256 vs their bound.
RUNNER_BENCH="${PREBUILT:+$PREBUILT/cuda_runner_bench}"
if [[ -z "$PREBUILT" && "$status_build" == "ok" ]]; then
  say "build cuda_runner_bench"
  if cmake -S . -B "$BUILD_DIR" -DLOOM_BUILD_BENCH=ON >> "$LOG" 2>&1 &&
     cmake --build "$BUILD_DIR" --target cuda_runner_bench -j "$(nproc)" >> "$LOG" 2>&1; then
    RUNNER_BENCH="$BUILD_DIR/bench/cuda_runner_bench"
  else
    say "cuda_runner_bench did not build (see log.txt)"
  fi
fi
if [[ -n "$RUNNER_BENCH" && -x "$RUNNER_BENCH" ]]; then
  say "run $RUNNER_BENCH (cuda_runner_bench.txt, cuda_runner.json)"
  OUT="$REPORT_DIR" "${RUN_ENV[@]}" "$RUNNER_BENCH" > "$REPORT_DIR/cuda_runner_bench.txt" 2>&1 ||
    say "cuda_runner_bench failed (see cuda_runner_bench.txt)"
fi

# --- the report
device="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
commit="${LOOM_COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}"
dirty="$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo true || echo false)"
nvcc_version="$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1)"
export device driver commit dirty nvcc_version status_build status_tests status_memcheck status_racecheck status_nccl status_cuda_runner REPORT_DIR
python3 - <<'PY'
import json, os, datetime
d = os.environ["REPORT_DIR"]
tests = []
gtest_path = os.path.join(d, "gtest.json")
if os.path.exists(gtest_path):
    with open(gtest_path) as f:
        data = json.load(f)
    for suite in data.get("testsuites", []):
        for t in suite.get("testsuite", []):
            result = "skipped" if t.get("result") == "SKIPPED" else ("failed" if t.get("failures") else "passed")
            tests.append({"name": f"{suite['name']}.{t['name']}", "result": result, "time": t.get("time")})
counts = {k: sum(1 for t in tests if t["result"] == k) for k in ("passed", "failed", "skipped")}
report = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "device": os.environ.get("device") or None,
    "driver": os.environ.get("driver") or None,
    "nvcc": os.environ.get("nvcc_version") or None,
    "commit": os.environ.get("commit"),
    "worktree_dirty": os.environ.get("dirty") == "true",
    "steps": {k: os.environ.get("status_" + k) for k in ("build", "tests", "memcheck", "racecheck", "nccl", "cuda_runner")},
    "test_counts": counts,
    "tests": tests,
}
# On a machine with a GPU, a skipped CUDA test means the suite verified nothing: fail.
gpu_skipped = [t["name"] for t in tests if t["result"] == "skipped" and t["name"].startswith(("Cuda", "DequantizeCuda"))]
report["cuda_tests_skipped"] = len(gpu_skipped)
with open(os.path.join(d, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
lines = [f"Loom GPU suite  {report['date']}",
         f"device {report['device']}  driver {report['driver']}  nvcc {report['nvcc']}",
         f"commit {report['commit']}{' (dirty)' if report['worktree_dirty'] else ''}", ""]
lines += [f"{k:<10} {v}" for k, v in report["steps"].items()]
lines += ["", f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped", ""]
lines += [f"{t['result']:<8} {t['time'] or '':>8}  {t['name']}" for t in tests if t["name"].startswith(("Cuda", "DequantizeCuda")) or t["result"] == "failed"]
if report["device"] and gpu_skipped:
    lines += ["", f"FAILED: {len(gpu_skipped)} CUDA tests skipped on a machine with a GPU"]
with open(os.path.join(d, "report.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
raise SystemExit(3 if report["device"] and gpu_skipped else 0)
PY
[[ $? -eq 0 ]] || overall=1
say "report in $REPORT_DIR (exit $overall)"
exit "$overall"
