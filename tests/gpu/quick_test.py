"""tests/gpu/quick.sh and its report on this (GPU-less) machine.

* quick_report.py: failures, skips by design and skips for want of a device, the verdict
  and the report rewritten after every step, the KV dtype bench's line per dtype;
* quick.sh --dry-run on the bundle CI builds (tests/gpu/bundle.sh): it unpacks, checks ldd
  and lists every step with its time limit;
* quick.sh for real on a machine without a GPU: it stops at the preflight and still leaves
  a report saying why.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

SOURCE = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
QUICK = SOURCE / "tests" / "gpu" / "quick.sh"
REPORT = SOURCE / "tests" / "gpu" / "quick_report.py"
BUNDLE = pathlib.Path(os.environ.get(
    "LOOM_GPU_BUNDLE", SOURCE / "build-gpu-bundle" / "loom-gpu-bundle.tar.xz"))

XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" failures="1" name="AllTests">
  <testsuite name="CudaX" tests="4">
    <testcase name="Passes" status="run" result="completed" time="0.5" classname="CudaX" />
    <testcase name="Fails" status="run" result="completed" time="0.1" classname="CudaX">
      <failure message="x.cc:10&#x0A;Expected equality" type=""><![CDATA[x.cc:10]]></failure>
    </testcase>
    <testcase name="Blind" status="run" result="skipped" time="0" classname="CudaX">
      <skipped message="x.cc:20&#x0A;no CUDA device: none"><![CDATA[]]></skipped>
    </testcase>
    <testcase name="ByDesign" status="run" result="skipped" time="0" classname="CudaX">
      <skipped message="x.cc:30&#x0A;NCCL not found: libnccl.so.2"><![CDATA[]]></skipped>
    </testcase>
  </testsuite>
</testsuites>
"""


def report(work, out, *args):
    return subprocess.run([sys.executable, str(REPORT), "--work", str(work), "--out", str(out),
                           *args], capture_output=True, text=True)


def write_xml(work, name, text):
    (work / "xml").mkdir(parents=True, exist_ok=True)
    (work / "xml" / f"{name}.xml").write_text(text)


def test_report_counts_failures_and_tells_skips_apart(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    write_xml(work, "kernels", XML)
    assert report(work, out, "--meta", "device=NVIDIA H100").returncode == 0
    step = report(work, out, "--step", "kernels", "--status", "failed", "--seconds", "3",
                  "--limit", "120")
    assert step.returncode == 0, step.stderr  # only --final answers with the verdict
    data = json.loads((out / "report.json").read_text())
    assert data["verdict"].startswith("running")
    assert data["test_counts"] == {"passed": 1, "failed": 1, "skipped": 2}
    assert data["unexpected_skips"] == ["CudaX.Blind"]
    skips = {t["name"]: t["skip"] for t in data["skipped_tests"]}
    assert skips == {"CudaX.Blind": "unexpected: no device seen", "CudaX.ByDesign": "by design"}
    assert data["failed_tests"][0]["message"] == "Expected equality"  # location dropped
    final = report(work, out, "--final")
    assert final.returncode == 1
    assert json.loads((out / "report.json").read_text())["verdict"] == "failed"
    text = (out / "report.txt").read_text()
    assert "FAILED  [kernels] CudaX.Fails" in text
    assert "skipped (by design) [kernels] CudaX.ByDesign: NCCL not found: libnccl.so.2" in text


def test_skips_by_design_and_passes_are_a_pass(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    passing = XML.replace(
        '<testcase name="Fails" status="run" result="completed" time="0.1" classname="CudaX">\n'
        '      <failure message="x.cc:10&#x0A;Expected equality" type=""><![CDATA[x.cc:10]]>'
        '</failure>\n    </testcase>', "")
    write_xml(work, "kernels", passing)
    report(work, out, "--meta", "device=", "--step", "kernels", "--status", "passed")
    # Without a device the "no CUDA device" skip is expected too.
    assert report(work, out, "--final").returncode == 0
    data = json.loads((out / "report.json").read_text())
    assert data["verdict"] == "passed" and data["unexpected_skips"] == []
    # A step that timed out fails the run even when every finished test passed.
    report(work, out, "--step", "runner", "--status", "timed out", "--limit", "120")
    assert report(work, out, "--final").returncode == 1


CONSOLE = """[==========] Running 4 tests from 1 test suite.
[ RUN      ] CudaX.Passes
[       OK ] CudaX.Passes (12 ms)
[ RUN      ] CudaX.Param/1
x.cc:3: Failure
Expected equality of these values:
[  FAILED  ] CudaX.Param/1, where GetParam() = 1 (3 ms)
[ RUN      ] CudaX.Blind
x.cc:20: Skipped
no CUDA device: none

[  SKIPPED ] CudaX.Blind (0 ms)
[ RUN      ] CudaX.Hangs
"""


def test_a_step_killed_before_its_xml_reports_its_tests_from_the_console(tmp_path):
    # GoogleTest writes its XML at exit: a step killed by its limit leaves only the console
    # output, from which the finished tests and the one that hung are reported.
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "xml").mkdir(parents=True)
    (work / "xml" / "kernels.log").write_text(CONSOLE)
    report(work, out, "--meta", "device=NVIDIA H200", "--step", "kernels", "--status", "timed out")
    assert report(work, out, "--final").returncode == 1
    data = json.loads((out / "report.json").read_text())
    results = {t["name"]: (t["result"], t["message"]) for t in data["tests"]}
    assert results == {
        "CudaX.Passes": ("passed", ""),
        "CudaX.Param/1": ("failed", "Expected equality of these values:"),
        "CudaX.Blind": ("skipped", "no CUDA device: none"),
        "CudaX.Hangs": ("failed", "still running when the step was killed (its time limit)"),
    }
    assert data["unexpected_skips"] == ["CudaX.Blind"]
    # With the XML written, the console output is not read again.
    write_xml(work, "kernels", XML)
    report(work, out, "--final")
    assert json.loads((out / "report.json").read_text())["test_counts"] == {
        "passed": 1, "failed": 1, "skipped": 2}


def test_unreadable_gtest_output_is_a_failure(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    write_xml(work, "runner", "<testsuites><testsuite")  # killed mid-write
    assert report(work, out, "--final").returncode == 1
    assert "unreadable" in (out / "report.txt").read_text()


def kv_dtype_row(dtype, blocks, tokens_per_s, **more):
    return {"kv_dtype": dtype, "pool_dtype": dtype, "pool_blocks": blocks, "block_size": 16,
            "pool_tokens": 16 * blocks, "pool_mib": 96.0, "output_tokens_per_s": tokens_per_s,
            "ttft_ms_p50": 20.0, "ttft_ms_p99": 40.0, "itl_ms_p50": 2.1, "itl_ms_p99": 4.2,
            "worker_mean_batch": 34.0 * blocks / 273, "preemptions": 7, **more}


def test_report_has_a_line_per_kv_dtype_with_its_ratio_to_f16(tmp_path):
    # serve_bench.py --kv-dtypes: each dtype's pool and tokens/s, the 8-bit ones over F16's
    # beside the target.
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "bench").mkdir(parents=True)
    (work / "bench" / "serve_kv_dtype.json").write_text(json.dumps({
        "target": 1.3, "passed": True, "kv_dtypes": [
            kv_dtype_row("f16", 273, 15000.0),
            kv_dtype_row("int8", 529, 24000.0, ratio_to_f16=1.6, pool_tokens_ratio_to_f16=1.938),
            kv_dtype_row("fp8_e4m3", 529, 18000.0, ratio_to_f16=1.2,
                         pool_tokens_ratio_to_f16=1.938)]}))
    report(work, out, "--final")
    lines = (out / "report.txt").read_text().splitlines()
    rows = [line for line in lines if " KV, " in line]
    assert len(rows) == 3
    assert rows[0].startswith("  f16 KV, 273 blocks = 4368 tokens (96.0 MiB): 15000.0 output "
                              "tokens/s; TTFT p50 20.0 ms p99 40.0 ms, ITL p50 2.10 ms p99 4.20 ms")
    assert "x F16" not in rows[0] and rows[0].endswith("34.0 sequences a step, 7 preemptions")
    assert rows[1].startswith("  int8 KV, 529 blocks = 8464 tokens (96.0 MiB): 24000.0 output "
                              "tokens/s, 1.60x F16 (target 1.3); ")
    assert "fp8_e4m3 KV, 529 blocks = 8464 tokens (96.0 MiB): 18000.0 output tokens/s, 1.20x F16 " \
           "(target 1.3)" in rows[2]


def test_report_has_the_fp8_perplexity_line_and_the_error_of_a_failed_run(tmp_path):
    # fp8_perplexity.py: every perplexity of the trained model and FP8 over BF16 beside the
    # target; a run that failed says why.
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "bench").mkdir(parents=True)
    (work / "bench" / "fp8_perplexity.json").write_text(json.dumps({
        "target": 1.01, "passed": True, "fp8_over_bf16": 1.0042,
        "perplexity": {"torch_f32": 41.25, "cuda_bf16": 41.26, "cuda_fp8": 41.433, "cpu_bf16": 41.259},
        "training": {"steps": 900, "seconds": 30.0, "last_loss": 2.41}}))
    (work / "bench" / "other.json").write_text(json.dumps({
        "passed": False, "error": "Failed: loom perplexity exited 1: no CUDA device"}))
    report(work, out, "--final")
    text = (out / "report.txt").read_text()
    assert ("  perplexity torch_f32 41.250, cuda_bf16 41.260, cuda_fp8 41.433, cpu_bf16 41.259; "
            "FP8 / BF16 1.0042 (target 1.01); trained 900 steps, 30.0 s, last loss 2.41") in text
    assert "  error: Failed: loom perplexity exited 1: no CUDA device" in text


def bundle_or_skip():
    if BUNDLE.is_file():
        return
    if os.environ.get("LOOM_REQUIRE_GPU_BUNDLE") == "1":
        pytest.fail(f"{BUNDLE} missing although scripts/test.sh built it")
    pytest.skip(f"no GPU bundle at {BUNDLE} (tests/gpu/bundle.sh makes it; CI does)")


def test_dry_run_unpacks_checks_libraries_and_lists_the_steps():
    bundle_or_skip()
    run = subprocess.run(["bash", str(QUICK), "--dry-run", "--bundle", str(BUNDLE)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    for binary in ("loom_kernels_tests", "loom_worker_tests", "cuda_attention_bench",
                   "quantized_gemm_bench", "cuda_forward_pass_bench", "kv_pool_transfer_bench",
                   "loom", "loom-worker", "test_model_tool"):
        assert binary in run.stdout
    assert "models from default-metadata.gguf" in run.stdout
    limits = {}
    for line in run.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "s":
            limits[parts[0]] = int(parts[1])
    # Serving on the GPU right after the models: a rerun with little time left reaches it.
    assert list(limits) == ["preflight", "models", "serve", "kernels", "model", "runner", "nccl",
                            "memcheck", "racecheck", "bench"]
    assert limits["preflight"] == 10
    # The test steps' own limits add up to 405 s, so none is starved by an earlier one; bench,
    # the last and the only one that tests nothing, gets at most 200 s of what the 420 s leave.
    assert list(limits)[-1] == "bench"
    assert sum(limits.values()) - limits["bench"] == 405
    assert limits["bench"] <= 200
    # Only the driver, cuBLAS and NCCL may be missing: anything else failed the run above.
    for line in run.stdout.splitlines():
        if "not found" in line and line.startswith("  "):
            assert "allowed" in line, line
    assert "global deadline 420 s" in run.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_without_a_gpu_the_run_stops_at_preflight_and_reports_why(tmp_path):
    bundle_or_skip()
    run = subprocess.run(["bash", str(QUICK), "--bundle", str(BUNDLE), "--deadline", "60"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OUT": str(tmp_path)})
    assert run.returncode == 1, run.stdout + run.stderr
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["verdict"] == "failed"
    assert [s["name"] for s in data["steps"]] == ["preflight"]
    assert data["steps"][0]["detail"] == "nvidia-smi sees no GPU"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt", "report.json", "report.txt"]


def test_a_rerun_lists_only_the_steps_it_names():
    bundle_or_skip()
    run = subprocess.run(["bash", str(QUICK), "--dry-run", "--bundle", str(BUNDLE), "--steps", "serve,runner"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    steps = [line.split()[0] for line in run.stdout.splitlines() if line.endswith(" s") and line.startswith("  ")]
    assert steps == ["preflight", "models", "serve", "runner"]


def test_bad_arguments_and_a_missing_bundle_exit_2(tmp_path):
    bad = subprocess.run(["bash", str(QUICK), "--deadline", "soon"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "whole seconds" in bad.stderr
    unknown = subprocess.run(["bash", str(QUICK), "--steps", "serve,warp"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown step warp" in unknown.stderr
    missing = subprocess.run(["bash", str(QUICK), "--bundle", str(tmp_path / "none.tar.xz")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no bundle" in missing.stderr


def test_the_documented_call_is_executable():
    # docs/gpu_verification.md runs `OUT=$OUT tests/gpu/quick.sh` directly: without its run
    # bit in git (mode 100755) the call answers "Permission denied" on a fresh checkout, as
    # it once did on a lent GPU machine.
    mode = subprocess.run(["git", "-C", str(SOURCE), "ls-files", "-s", "tests/gpu/quick.sh"],
                          check=True, capture_output=True, text=True).stdout.split()[0]
    assert mode == "100755", f"tests/gpu/quick.sh is committed as {mode}: git update-index --chmod=+x"
    assert os.access(QUICK, os.X_OK)
