#!/usr/bin/env bash
# Configures and builds Loom into build/ (Release with debug info, warnings as errors).
# Extra arguments go to CMake's configure step, e.g. -DLOOM_CUDA=OFF.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake -S . -B build -G Ninja -DLOOM_WERROR=ON "$@" >/dev/null
cmake --build build -j"$(nproc)"
