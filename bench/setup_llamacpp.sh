#!/usr/bin/env bash
# Builds llama.cpp from the PyPI package llama-cpp-python (its source distribution, which
# vendors llama.cpp) for bench/cpu_vs_llamacpp.py only: never part of the serving path,
# the project's dependencies or CI. Only the libraries the Python bindings load are built
# (libllama + ggml; no tools, common or multimodal code: a full `pip install` of the
# package builds ~180 objects, too slow on 2 shared cores), then the package's Python
# module is laid beside them:
#
#   bench/setup_llamacpp.sh avx2     -> build/llamacpp-avx2/python   (AVX2+FMA+F16C, AVX-512 off)
#   bench/setup_llamacpp.sh native   -> build/llamacpp-native/python (-march=native)
#
# Use with PYTHONPATH=build/llamacpp-<isa>/python (numpy from the project's .venv).
set -euo pipefail
isa="${1:?usage: setup_llamacpp.sh avx2|native}"
version="${LLAMACPP_PYTHON_VERSION:-0.3.36}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${root}/build/llamacpp-${isa}"
case "${isa}" in
  avx2)   isa_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                    -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
                    -DGGML_AVX512_VBMI=OFF -DGGML_AVX_VNNI=OFF) ;;
  native) isa_args=(-DGGML_NATIVE=ON) ;;
  *) echo "setup_llamacpp.sh: unknown ISA '${isa}' (avx2|native)" >&2; exit 2 ;;
esac
src="${root}/build/llamacpp-src/llama_cpp_python-${version}"
if [[ ! -d "${src}" ]]; then
  mkdir -p "${root}/build/llamacpp-src"
  python3 -m pip download --no-binary :all: --no-deps -d "${root}/build/llamacpp-src" \
    "llama-cpp-python==${version}"
  tar -xzf "${root}/build/llamacpp-src/llama_cpp_python-${version}.tar.gz" -C "${root}/build/llamacpp-src"
fi
cmake -S "${src}/vendor/llama.cpp" -B "${out}/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
  -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON "${isa_args[@]}"
nice -n 10 cmake --build "${out}/cmake" --target llama -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
# The ctypes bindings only (the package's __init__ also pulls in its high-level API and
# that API's dependencies, which the bench does not use).
rm -rf "${out}/python"
mkdir -p "${out}/python/llama_cpp/lib"
cp "${src}"/llama_cpp/{llama_cpp.py,_ctypes_extensions.py,_ggml.py} "${out}/python/llama_cpp/"
echo '__version__ = "'"${version}"'"' > "${out}/python/llama_cpp/__init__.py"
cp -P "${out}"/cmake/bin/lib*.so* "${out}/python/llama_cpp/lib/"
PYTHONPATH="${out}/python" python3 -c \
  "import llama_cpp.llama_cpp as l; print('llama.cpp from llama-cpp-python ${version}:', l.llama_print_system_info().decode())"
echo "ready: PYTHONPATH=${out}/python"
