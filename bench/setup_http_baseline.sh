#!/usr/bin/env bash
# Builds the coordinator as it was before the event-driven HTTP front end (cpp-httplib's
# thread-per-request server, revision 7cc9b84) for bench/http_frontend_bench.py, which runs it
# beside the current one in the same run. A git worktree of that revision under
# bench/.cache/http-baseline, only the `loom` target (CUDA for sm_90a only: that revision does not build with LOOM_CUDA=OFF), no tests. Bench only; prints
# the binary's path. About 15 minutes on 2 cores the first time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
revision=7cc9b8402369a8abc35e57b0e855ae78adf4b522
dir="$root/bench/.cache/http-baseline"
binary="$dir/build/coordinator/loom"
if [ ! -x "$binary" ]; then
  mkdir -p "$dir"
  if [ ! -d "$dir/src" ]; then
    git -C "$root" worktree add --detach "$dir/src" "$revision" >&2
  fi
  cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCH=OFF >&2
  cmake --build "$dir/build" --target loom -j"$(nproc)" >&2
fi
echo "$binary"
