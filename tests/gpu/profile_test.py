"""tests/gpu/profile.sh (the sweep's Nsight Compute step) on this GPU-less machine: the real GPU
benchmarks take --profile; without ncu the step says so and passes; with a stand-in for ncu
(this machine cannot run the real one: no GPU, no Nsight Compute), the script's own plumbing
(each benchmark run under it with --profile, the reports imported, the summary, the archive
and the exit status) is exercised; bad arguments exit 2."""
import json
import os
import pathlib
import subprocess
import tarfile

import pytest
from conftest import BUILD_DIR, SOURCE_DIR

PROFILE = SOURCE_DIR / "tests" / "gpu" / "profile.sh"
BENCHES = ["cuda_attention_bench", "quantized_gemm_bench", "cuda_forward_pass_bench"]
BIN = BUILD_DIR / "bench"

# What the stand-in prints for --import: one decode kernel and the marker of range 1.
STAND_IN = r"""#!/usr/bin/env bash
[[ "$1" == --version ]] && { echo "NVIDIA (R) Nsight Compute"; echo "Version 2099.1.0"; exit 0; }
if [[ "$1" == --import ]]; then
  echo '"ID","Kernel Name","gpu__time_duration.sum","launch__grid_size","launch__block_size"'
  echo '"","","nsecond","",""'
  echo '"0","void PagedDecodeKernel<128>(Params)","2,000","64","256"'
  echo '"1","loom_profile_marker()","1,000","1","1"'
  exit 0
fi
export_to=""
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --export) export_to="$2"; shift 2 ;;
    --force-overwrite) shift ;;
    *) shift 2 ;;
  esac
done
echo "$*" >> "$(dirname "$0")/commands.txt"
"$@"
code=$?
echo "loom-profile-range 1 decode bf16 batch 32 context 4096"
[[ -n "$export_to" ]] && : > "$export_to.ncu-rep"
exit "${STAND_IN_EXIT:-$code}"
"""


def benches_or_skip():
    if not all((BIN / b).is_file() for b in BENCHES):
        pytest.skip(f"the GPU benchmarks are not built in {BIN} (a build without CUDA)")


def stand_in(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    ncu = tools / "ncu"
    ncu.write_text(STAND_IN)
    ncu.chmod(0o755)
    return tools


def run_profile(tmp_path, path, **env):
    out = tmp_path / "out"
    return out, subprocess.run(
        ["bash", PROFILE, "--bin", BIN, "--limit", "60"], capture_output=True, text=True,
        timeout=300, env={**os.environ, "PATH": path, "OUT": str(out),
                          "CUDA_HOME": str(tmp_path / "no-cuda"), **env})


def test_the_benchmarks_take_profile_and_refuse_other_arguments():
    benches_or_skip()
    for bench in BENCHES:
        ok = subprocess.run([BIN / bench, "--profile"], capture_output=True, text=True,
                            timeout=120)
        assert ok.returncode == 0 and "no CUDA device" in ok.stdout, ok.stdout + ok.stderr
        bad = subprocess.run([BIN / bench, "--profiles"], capture_output=True, text=True)
        assert bad.returncode == 2 and "--quick or --profile" in bad.stderr, bad.stderr


def test_without_ncu_nothing_is_profiled_and_the_step_passes(tmp_path):
    benches_or_skip()
    out, run = run_profile(tmp_path, "/usr/bin:/bin")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "profile.txt").read_text().startswith("ncu: unavailable")


def test_each_benchmark_runs_under_ncu_and_is_summarized(tmp_path):
    benches_or_skip()
    tools = stand_in(tmp_path)
    out, run = run_profile(tmp_path, f"{tools}:/usr/bin:/bin")
    assert run.returncode == 0, run.stdout + run.stderr
    commands = (tools / "commands.txt").read_text().splitlines()
    assert commands == [f"{BIN / b} --profile" for b in BENCHES]
    text = (out / "profile.txt").read_text()
    assert text.startswith(f"ncu: {tools / 'ncu'} (Version 2099.1.0)")
    for bench in BENCHES:
        assert f"{bench}: exit 0, " in text
    assert text.count("[1] decode bf16 batch 32 context 4096: 1 kernels, 2.0 us") == 3
    assert "PagedDecodeKernel<128>: grid 64 x 256; 2.0 us" in text
    report = json.loads((out / "profile.json").read_text())
    assert sorted(report) == sorted(BENCHES)
    with tarfile.open(out / "profile_csv.tar.gz") as archive:
        names = sorted(archive.getnames())
    assert names == sorted([f"{b}.csv" for b in BENCHES] + [f"{b}.log" for b in BENCHES])


def test_a_failed_profile_fails_the_step_and_bad_arguments_exit_2(tmp_path):
    benches_or_skip()
    tools = stand_in(tmp_path)
    out, run = run_profile(tmp_path, f"{tools}:/usr/bin:/bin", STAND_IN_EXIT="1")
    assert run.returncode == 1
    assert "cuda_attention_bench: exit 1" in (out / "profile.txt").read_text()
    for args in (["--bin"], ["--bin", tmp_path], ["--bin", BIN, "--limit", "soon"], ["--now"]):
        bad = subprocess.run(["bash", PROFILE, *map(str, args)], capture_output=True, text=True)
        assert bad.returncode == 2, (args, bad.stderr)
