#!/usr/bin/env bash
# Packs loom_kernels_tests and the shared libraries it needs beyond glibc into DIR, so that
# tests/gpu/run.sh --prebuilt DIR runs on a GPU machine that has only the CUDA driver
# (no Abseil or GoogleTest there). Builds build-gpu/ (LOOM_CUDA=ON) first.
#   tests/gpu/bundle.sh DIR        (DIR under an ignored path, e.g. build-gpu-bundle)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:?usage: bundle.sh DIR}"
BUILD_DIR="${LOOM_GPU_BUILD_DIR:-$ROOT/build-gpu}"
cd "$ROOT"
cmake -S . -B "$BUILD_DIR" -G Ninja -DLOOM_CUDA=ON -DLOOM_WERROR=ON -DLOOM_BUILD_BENCH=OFF > /dev/null
# The kernel tests, and the worker tests for the NCCL communicator (world size 1).
cmake --build "$BUILD_DIR" --target loom_kernels_tests loom_worker_tests -j "$(nproc)"
mkdir -p "$DIR/lib"
for test_bin in loom_kernels_tests loom_worker_tests; do
  cp "$BUILD_DIR/tests/$test_bin" "$DIR/"
  strip --strip-debug "$DIR/$test_bin"
  # Everything ldd resolves except the C/C++ runtime, the driver and cuBLAS: the GPU
  # machine's own (glibc, libstdc++ at least as new as the builder's; cuBLAS from its CUDA
  # toolkit, too big to carry) serve.
  ldd "$BUILD_DIR/tests/$test_bin" | awk '/=> \// {print $3}' |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libstdc\+\+|libgcc_s)\.so' |
    while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
done
# The GPU benchmarks (tests/gpu/run.sh runs them when present); their libraries are the
# test binaries' (Abseil, already bundled) plus cuBLAS from the device's toolkit.
cmake -S . -B "$BUILD_DIR" -DLOOM_BUILD_BENCH=ON > /dev/null
cmake --build "$BUILD_DIR" --target quantized_gemm_bench -j "$(nproc)"
cp "$BUILD_DIR/bench/quantized_gemm_bench" "$DIR/"
strip --strip-debug "$DIR/quantized_gemm_bench"
ldd "$BUILD_DIR/bench/quantized_gemm_bench" | awk '/=> \// {print $3}' |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
cmake --build "$BUILD_DIR" --target cuda_attention_bench -j "$(nproc)"
cp "$BUILD_DIR/bench/cuda_attention_bench" "$DIR/"
strip --strip-debug "$DIR/cuda_attention_bench"
ldd "$BUILD_DIR/bench/cuda_attention_bench" | awk '/=> \// {print $3}' |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
cmake --build "$BUILD_DIR" --target cuda_runner_bench -j "$(nproc)"
cp "$BUILD_DIR/bench/cuda_runner_bench" "$DIR/"
strip --strip-debug "$DIR/cuda_runner_bench"
ldd "$BUILD_DIR/bench/cuda_runner_bench" | awk '/=> \// {print $3}' |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
# The default model for the CUDA runner's end-to-end test (run.sh --prebuilt points
# LOOM_MODEL_PATH at it). 98 MB: LOOM_BUNDLE_MODEL=0 leaves it out where the bundle must
# stay small (then set LOOM_MODEL_PATH on the GPU machine).
MODEL="${LOOM_MODEL_PATH:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ "${LOOM_BUNDLE_MODEL:-1}" != "0" && -f "$MODEL" ]]; then
  mkdir -p "$DIR/models"
  cp "$MODEL" "$DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
du -sh "$DIR"
