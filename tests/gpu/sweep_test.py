"""tests/gpu/sweep.sh (the kernels' tuning sweeps for a lent GPU) on this GPU-less machine: the
dry run lists its steps from the bundle CI builds, a real run says that nothing was measured
and still leaves its files, and bad arguments or a missing bundle exit 2."""
import os
import pathlib
import subprocess

import pytest

SOURCE = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
SWEEP = SOURCE / "tests" / "gpu" / "sweep.sh"
BUNDLE = pathlib.Path(os.environ.get(
    "LOOM_GPU_BUNDLE", SOURCE / "build-gpu-bundle" / "loom-gpu-bundle.tar.xz"))


def bundle_or_skip():
    if not BUNDLE.is_file():
        pytest.skip(f"no GPU bundle at {BUNDLE} (tests/gpu/bundle.sh makes it; CI does)")


def test_dry_run_lists_the_steps_and_their_limits():
    bundle_or_skip()
    run = subprocess.run(["bash", str(SWEEP), "--dry-run", "--bundle", str(BUNDLE)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    steps = [line.split() for line in run.stdout.splitlines()[1:]]
    assert [s[0] for s in steps] == ["tests", "racecheck", "gemm", "attention", "profile"], run.stdout
    # The documented call's timeout_s is 300: the limits leave room to unpack the bundle.
    assert sum(int(s[1]) for s in steps) <= 270, run.stdout


def test_without_a_gpu_nothing_is_measured_and_the_files_are_left(tmp_path):
    bundle_or_skip()
    run = subprocess.run(["bash", str(SWEEP), "--bundle", str(BUNDLE)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OUT": str(tmp_path)})
    assert run.returncode == 0, run.stdout + run.stderr
    sweep = (tmp_path / "sweep.txt").read_text()
    assert "quantized_gemm_bench: no CUDA device" in sweep
    assert "cuda_attention_bench: no CUDA device" in sweep
    tests = (tmp_path / "candidate_tests.txt").read_text()
    # The three spaces' tests, skipped here.
    for space in ("CudaQuantGemmTest", "CudaPagedDecodeTest", "CudaPagedPrefillTest"):
        assert f"{space}.EveryCandidateMatchesReference" in tests, tests
    profile = (tmp_path / "profile.txt").read_text()
    assert profile.startswith("ncu: unavailable") or "0 kernels profiled" in profile, profile


def test_bad_arguments_and_a_missing_bundle_exit_2(tmp_path):
    bad = subprocess.run(["bash", str(SWEEP), "--now"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
    missing = subprocess.run(["bash", str(SWEEP), "--bundle", str(tmp_path / "none.tar.xz")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no bundle" in missing.stderr


def test_the_documented_call_is_executable():
    mode = subprocess.run(["git", "-C", str(SOURCE), "ls-files", "-s", "tests/gpu/sweep.sh"],
                          check=True, capture_output=True, text=True).stdout.split()[0]
    assert mode == "100755", f"tests/gpu/sweep.sh is committed as {mode}"
