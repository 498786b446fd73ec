#!/usr/bin/env bash
# Builds llama.cpp from the PyPI package llama-cpp-python (its source distribution, which
# vendors llama.cpp) for bench/cpu_vs_llamacpp.py and bench/serving_vs_llamacpp.py only:
# never part of the serving path, the project's dependencies or CI. By default only the
# libraries the Python bindings load are built (libllama + ggml: a full `pip install` of the
# package builds ~180 objects, too slow on 2 shared cores), then the package's ctypes module
# is laid beside them. `server` also builds llama.cpp's own HTTP server (tools/server, with
# the `common` library it needs; no curl) for the serving comparison.
#
#   bench/setup_llamacpp.sh avx2           -> $ROOT/llamacpp-avx2/python   (AVX2+FMA+F16C, AVX-512 off)
#   bench/setup_llamacpp.sh native         -> $ROOT/llamacpp-native/python (-march=native)
#   bench/setup_llamacpp.sh avx512         -> $ROOT/llamacpp-avx512/python (AVX-512 with VNNI, VBMI
#                                             and BF16, AVX-VNNI; AMX off: on a 2026-12-05 Xeon
#                                             with AMX, -march=native's AMX matmul segfaulted in
#                                             llama_decode on the default Q4_1 model)
#   bench/setup_llamacpp.sh avx2 server    -> also $ROOT/llamacpp-avx2/bin/llama-server
#
# ROOT is $LLAMACPP_BUILD_ROOT (default: <repo>/build); the benches take the same variable,
# so builds kept outside the checkout (e.g. LLAMACPP_BUILD_ROOT=/work/llamacpp) are reused
# by every checkout. The sdist is fetched once with pip (PyPI) into $ROOT/llamacpp-src.
# Use with PYTHONPATH=$ROOT/llamacpp-<isa>/python (numpy-free: ctypes only).
# The build runs under `nice -n 10` with $CMAKE_BUILD_PARALLEL_LEVEL jobs (default 2).
set -euo pipefail
usage="usage: setup_llamacpp.sh avx2|avx512|native [server]"
isa="${1:?${usage}}"
want_server=0
case "${2:-}" in
  "") ;;
  server) want_server=1 ;;
  *) echo "setup_llamacpp.sh: unknown target '${2}' (${usage})" >&2; exit 2 ;;
esac
version="${LLAMACPP_PYTHON_VERSION:-0.3.36}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="${LLAMACPP_BUILD_ROOT:-${repo}/build}"
mkdir -p "${root}"
root="$(cd "${root}" && pwd)"
out="${root}/llamacpp-${isa}"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
python="${repo}/.venv/bin/python"
[[ -x "${python}" ]] || python="$(command -v python3)"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
case "${isa}" in
  avx2)   isa_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                    -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
                    -DGGML_AVX512_VBMI=OFF -DGGML_AVX_VNNI=OFF) ;;
  avx512) isa_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                    -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
                    -DGGML_AVX512_VBMI=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF
                    -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
  native) isa_args=(-DGGML_NATIVE=ON) ;;
  *) echo "setup_llamacpp.sh: unknown ISA '${isa}' (${usage})" >&2; exit 2 ;;
esac

src_root="${root}/llamacpp-src"
src="${src_root}/llama_cpp_python-${version}"
if [[ ! -f "${src}/vendor/llama.cpp/CMakeLists.txt" ]]; then
  mkdir -p "${src_root}"
  sdist="${src_root}/llama_cpp_python-${version}.tar.gz"
  if [[ ! -f "${sdist}" ]]; then
    # Source only for this package: its build backend (scikit-build-core, needed to read the
    # sdist's metadata) may come as a wheel.
    "${python}" -m pip download --no-binary llama-cpp-python --no-deps -d "${src_root}" \
      "llama-cpp-python==${version}"
  fi
  rm -rf "${src}"
  tar -xzf "${sdist}" -C "${src_root}"
fi

# One build tree per ISA: configured with the server's options (they only add targets), so
# `server` later reuses the libraries already built. The server's web UI is left out (it
# would be fetched from Hugging Face or built with npm): its HTTP API is all the bench uses.
cmake -S "${src}/vendor/llama.cpp" -B "${out}/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON "${launcher[@]}" "${isa_args[@]}" >/dev/null
targets=(llama)
[[ "${want_server}" == 1 ]] && targets+=(llama-server)
nice -n 10 cmake --build "${out}/cmake" --target "${targets[@]}" -j "${jobs}"

# The ctypes bindings only (the package's __init__ also pulls in its high-level API and
# that API's dependencies, which the benches do not use).
rm -rf "${out}/python"
mkdir -p "${out}/python/llama_cpp/lib"
cp "${src}"/llama_cpp/{llama_cpp.py,_ctypes_extensions.py,_ggml.py} "${out}/python/llama_cpp/"
echo '__version__ = "'"${version}"'"' > "${out}/python/llama_cpp/__init__.py"
cp -P "${out}"/cmake/bin/lib*.so* "${out}/python/llama_cpp/lib/"
PYTHONPATH="${out}/python" "${python}" -c \
  "import llama_cpp.llama_cpp as l; print('llama.cpp from llama-cpp-python ${version}:', l.llama_print_system_info().decode())"
echo "ready: PYTHONPATH=${out}/python"
if [[ "${want_server}" == 1 ]]; then
  mkdir -p "${out}/bin"
  ln -sf "${out}/cmake/bin/llama-server" "${out}/bin/llama-server"
  "${out}/bin/llama-server" --version 2>&1 | tail -n 2
  echo "ready: ${out}/bin/llama-server"
fi
