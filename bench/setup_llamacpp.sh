#!/usr/bin/env bash
# Builds llama.cpp from the PyPI package llama-cpp-python (a source build) into a
# bench-local virtual environment, for bench/cpu_vs_llamacpp.py only: never part of
# the serving path, the project's dependencies or CI.
#
#   bench/setup_llamacpp.sh avx2     -> build/llamacpp-avx2   (AVX2+FMA, AVX-512 off)
#   bench/setup_llamacpp.sh native   -> build/llamacpp-native (-march=native: AVX-512 where present)
#
# A build takes 10-30 minutes on 2 cores; it runs under nice.
set -euo pipefail
isa="${1:?usage: setup_llamacpp.sh avx2|native}"
version="${LLAMACPP_PYTHON_VERSION:-0.3.36}"
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${root}/build/llamacpp-${isa}"
case "${isa}" in
  avx2)   isa_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF" ;;
  native) isa_args="-DGGML_NATIVE=ON" ;;
  *) echo "setup_llamacpp.sh: unknown ISA '${isa}' (avx2|native)" >&2; exit 2 ;;
esac
python3 -m venv "${venv}"
export CMAKE_ARGS="${isa_args} -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
nice -n 10 "${venv}/bin/pip" install --no-cache-dir --no-binary llama-cpp-python \
  "llama-cpp-python==${version}"
"${venv}/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, 'in ${venv}')"
