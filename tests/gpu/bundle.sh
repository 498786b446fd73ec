#!/usr/bin/env bash
# Builds, on a machine with the CUDA toolkit and Loom's Debian dependencies (no GPU needed),
# the archive that tests/gpu/quick.sh runs on a bare GPU machine (docs/gpu_verification.md):
#
#   tests/gpu/bundle.sh [--from BUILD_DIR] [ARCHIVE]   default build-gpu-bundle/loom-gpu-bundle.tar.xz
#
# Inside: the CUDA test binaries (loom_kernels_tests, loom_model_tests, loom_worker_tests), the GPU
# benchmarks (quantized_gemm_bench, cuda_attention_bench, cuda_forward_pass_bench,
# kv_pool_transfer_bench), the server itself
# (loom, loom-worker) and test_model_tool, which makes the test models on the GPU machine
# from models/default-metadata.gguf (the default model's tokenizer, chat template and
# shapes without its 98 MB of tensors, made here from LOOM_MODEL_PATH), built Release
# for sm_90 only (H100/H200; CI's main build still compiles sm_80 and sm_90a), stripped,
# with the shared libraries they load from Debian (Abseil, gRPC, protobuf, gloo, ...) in lib/,
# the builder's libstdc++/libgcc_s in fallback/ (used only where the GPU machine's are too
# old) and a MANIFEST. Not inside: glibc and the CUDA driver (the GPU machine's own),
# cuBLAS and NCCL (its CUDA toolkit or pip wheels: quick.sh finds them at run time; Loom
# dlopens both). Fails when the archive is over LOOM_BUNDLE_MAX_MIB (default 56 MiB): the
# checkout plus the archive must travel in one 64 MiB copy.
#
# --from BUILD_DIR packs an existing CUDA build instead (CI: scripts/test.sh reuses build/,
# RelWithDebInfo at -O2 for sm_80 and sm_90a, which H100/H200 run too; stripped, it differs
# from the dedicated build only by the sm_80 code, so its size check is the stricter one)
# rather than compiling everything a second time.
#
# Environment: LOOM_GPU_BUILD_DIR (default build-gpu), LOOM_BUNDLE_MAX_MIB,
# LOOM_CUDA_ARCHITECTURES (default 90-real).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD_DIR="${LOOM_GPU_BUILD_DIR:-$ROOT/build-gpu}"
REUSE=false
if [[ "${1:-}" == --from ]]; then
  [[ -n "${2:-}" ]] || { echo "bundle.sh: --from needs a build directory" >&2; exit 2; }
  BUILD_DIR="$(cd "$2" && pwd)"
  REUSE=true
  shift 2
fi
ARCHIVE="${1:-$ROOT/build-gpu-bundle/loom-gpu-bundle.tar.xz}"
MAX_MIB="${LOOM_BUNDLE_MAX_MIB:-56}"
ARCHS="${LOOM_CUDA_ARCHITECTURES:-90-real}"
TESTS=(loom_kernels_tests loom_model_tests loom_worker_tests)
BENCHES=(quantized_gemm_bench cuda_attention_bench cuda_forward_pass_bench kv_pool_transfer_bench)
SERVERS=(loom loom-worker)
TOOLS=(test_model_tool)
# Where each binary lands in the build tree.
declare -A BUILT=([loom]=coordinator/loom [loom-worker]=worker/loom-worker
                  [test_model_tool]=tests/tools/test_model_tool)
for bin in "${TESTS[@]}"; do BUILT[$bin]=tests/$bin; done
for bin in "${BENCHES[@]}"; do BUILT[$bin]=bench/$bin; done
MODEL="${LOOM_MODEL_PATH:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ ! -f "$MODEL" ]]; then
  echo "bundle.sh: no default model at $MODEL (scripts/fetch-model.sh): its metadata goes in" >&2
  exit 1
fi

if ! command -v nvcc > /dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "bundle.sh: no CUDA toolkit (nvcc) on this machine: nothing to bundle" >&2
  exit 3
fi

if $REUSE; then
  ARCHS="$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")"
  if [[ -z "$ARCHS" ]]; then
    echo "bundle.sh: $BUILD_DIR is not a CUDA build (no CMAKE_CUDA_ARCHITECTURES)" >&2
    exit 1
  fi
fi
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# Release at -O2, as the main build compiles (GCC 12 warns falsely at -O3, e.g. -Wrestrict
# on std::string concatenation, and warnings are errors).
$REUSE || cmake -S . -B "$BUILD_DIR" -G Ninja -DLOOM_CUDA=ON -DLOOM_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" -DLOOM_BUILD_BENCH=ON -DLOOM_BUILD_TESTS=ON \
  "${launcher[@]}" > /dev/null
cmake --build "$BUILD_DIR" --target "${TESTS[@]}" "${BENCHES[@]}" "${SERVERS[@]}" "${TOOLS[@]}" \
  -j "$(nproc)"

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/models"
# The runtime of the machine that runs the bundle serves: glibc, libstdc++, libgcc_s; the
# driver (libcuda); cuBLAS and NCCL (loaded with dlopen, listed here for the benchmarks,
# which link cuBLAS).
system_libs='/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libnccl|libstdc\+\+|libgcc_s)\.so'
for bin in "${TESTS[@]}" "${BENCHES[@]}" "${SERVERS[@]}" "${TOOLS[@]}"; do
  cp "$BUILD_DIR/${BUILT[$bin]}" "$STAGE/bin/"
  strip --strip-unneeded "$STAGE/bin/$bin"
  ldd "$BUILD_DIR/${BUILT[$bin]}" | awk '/=> \// {print $3}' | grep -Ev "$system_libs" |
    while read -r lib; do cp -Ln "$lib" "$STAGE/lib/"; done
done
"$BUILD_DIR/tests/tools/test_model_tool" metadata "$MODEL" "$STAGE/models/default-metadata.gguf"
strip --strip-unneeded "$STAGE"/lib/*.so* 2> /dev/null || true
# The builder's libstdc++ and libgcc_s, used by quick.sh only when the GPU machine's own
# are older than the binaries need (ldd: "version `GLIBCXX_...' not found").
mkdir -p "$STAGE/fallback"
ldd "$BUILD_DIR/tests/loom_worker_tests" | awk '/=> \// {print $3}' |
  grep -E '/(libstdc\+\+|libgcc_s)\.so' | while read -r lib; do cp -L "$lib" "$STAGE/fallback/"; done
commit="$(git rev-parse HEAD 2> /dev/null || echo unknown)"
dirty="$(git status --porcelain 2> /dev/null | grep -q . && echo true || echo false)"
cublas_major="$(grep -m1 -o 'CUBLAS_VER_MAJOR [0-9]*' "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/../include/cublas_api.h" | awk '{print $2}')"
{
  echo "commit=$commit"
  echo "dirty=$dirty"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cuda_architectures=$ARCHS"
  echo "nvcc=$(nvcc --version 2> /dev/null | grep -o 'release [0-9.]*' | head -1)"
  echo "glibc=$(ldd --version | head -1 | grep -o '[0-9.]*$')"
  echo "cublas_soname=libcublas.so.${cublas_major:-13}"
  echo "tests=${TESTS[*]}"
  echo "benches=${BENCHES[*]}"
  echo "servers=${SERVERS[*]}"
  echo "tools=${TOOLS[*]}"
  echo "models=default-metadata.gguf"
} > "$STAGE/MANIFEST"

mkdir -p "$(dirname "$ARCHIVE")"
tar -C "$STAGE" -cf - MANIFEST bin lib fallback models | xz -T0 -6 > "$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"
bytes="$(stat -c %s "$ARCHIVE")"
mib="$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')"
echo "bundle.sh: $ARCHIVE: $mib MiB (limit $MAX_MIB MiB; unpacked $(du -sh "$STAGE" | cut -f1))"
if ((bytes > MAX_MIB * 1048576)); then
  echo "bundle.sh: the archive is over $MAX_MIB MiB: it would not fit the GPU machine's 64 MiB" \
    "copy with the checkout; leave something out or shrink it" >&2
  exit 1
fi
