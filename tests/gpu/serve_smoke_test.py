"""The GPU window's serving smoke test (tests/gpu/serve_smoke.py) and its models
(tests/tools/test_model_tool) on this machine's CPU, so that both are tested on every CI
run and the window never runs them for the first time:

* the metadata file bundle.sh packs holds the default model's tokenizer, chat template and
  shapes and no tensor, and is small enough to travel;
* the tiny random model made from it serves: serve_smoke.py passes every step against
  `loom up --device cpu`;
* the random default-shape model has the default model's tensors (names, shapes, storage
  types) and runs; the Llama-3-8B shapes of the serving benchmark have its layers, print
  the bytes a decode step reads, and run;
* serve_bench.py's KV dtype mode runs a server per KV dtype at one KV byte budget, and the
  8-bit pools hold ~1.94x F16's tokens;
* serve_smoke.py fails, naming the step, when the server cannot do what it checks: here a
  40-token context refuses the drain step's long stream;
* killed by its step's limit (SIGTERM), it stops the server and keeps what it found.
"""
import json
import os
import signal
import subprocess
import sys
import time

import gguf
import pytest

from conftest import BUILD_DIR, SOURCE_DIR, tool_path

SMOKE = SOURCE_DIR / "tests" / "gpu" / "serve_smoke.py"
LOOM = BUILD_DIR / "coordinator" / "loom"


@pytest.fixture(scope="module")
def models(tmp_path_factory, model_path):
    tool = tool_path("test_model_tool")
    out = tmp_path_factory.mktemp("models")
    subprocess.run([tool, "metadata", model_path, out / "meta.gguf"], check=True)
    subprocess.run([tool, "random", "--shape", "tiny", "--metadata", out / "meta.gguf",
                    out / "tiny.gguf"], check=True)
    subprocess.run([tool, "random", "--shape", "default", "--metadata", out / "meta.gguf",
                    "--seed", "7", out / "default.gguf"], check=True)
    return out


def test_metadata_file_has_the_tokenizer_and_no_tensor(models, model_path):
    meta = gguf.GGUFReader(models / "meta.gguf")
    original = gguf.GGUFReader(model_path)
    assert len(meta.tensors) == 0
    assert set(meta.fields) - {"GGUF.tensor_count", "GGUF.kv_count"} == \
        set(original.fields) - {"GGUF.tensor_count", "GGUF.kv_count"}
    assert len(meta.fields["tokenizer.ggml.tokens"].data) == 49152
    assert (models / "meta.gguf").stat().st_size < 4 << 20  # ~0.4 MB once xz-compressed


def test_default_shape_model_has_the_default_models_tensors(models, model_path):
    made = {t.name: (tuple(t.shape), t.tensor_type.name) for t in gguf.GGUFReader(models / "default.gguf").tensors}
    real = {t.name: (tuple(t.shape), t.tensor_type.name) for t in gguf.GGUFReader(model_path).tensors}
    assert made == real


def test_default_shape_model_generates(models):
    result = subprocess.run([LOOM, "generate", models / "default.gguf", "--prompt", "Hello",
                             "--max-tokens", "4", "--ignore-eos"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "decode: 3 tokens" in result.stderr


@pytest.mark.parametrize("kind", ["int4", "bf16"])
def test_llama3_8b_shapes_have_its_layers_and_print_the_bytes_a_step_reads(models, tmp_path, kind):
    out = tmp_path / f"8b-{kind}.gguf"
    made = subprocess.run([tool_path("test_model_tool"), "random", "--shape", f"llama3-8b-{kind}",
                           "--layers", "1", "--metadata", models / "meta.gguf", out],
                          capture_output=True, text=True, check=True)
    reader = gguf.GGUFReader(out)
    tensors = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name) for t in reader.tensors}
    layer, wide = ("Q4_1", "Q8_0") if kind == "int4" else ("BF16", "BF16")
    assert tensors == {
        "token_embd.weight": ((4096, 49152), wide), "output.weight": ((4096, 49152), wide),
        "output_norm.weight": ((4096,), "F32"), "blk.0.attn_norm.weight": ((4096,), "F32"),
        "blk.0.ffn_norm.weight": ((4096,), "F32"),
        "blk.0.attn_q.weight": ((4096, 4096), layer), "blk.0.attn_k.weight": ((4096, 1024), layer),
        "blk.0.attn_v.weight": ((4096, 1024), layer),
        "blk.0.attn_output.weight": ((4096, 4096), layer),
        "blk.0.ffn_gate.weight": ((4096, 14336), layer), "blk.0.ffn_up.weight": ((4096, 14336), layer),
        "blk.0.ffn_down.weight": ((14336, 4096), layer)}
    # The bound's bytes: every tensor but the embedding table.
    read = sum(int(t.n_bytes) for t in reader.tensors if t.name != "token_embd.weight")
    assert made.stdout.strip() == f"bytes_per_token={read}"
    if kind == "int4":  # it runs (the BF16 one is the same graph over another storage type)
        result = subprocess.run([LOOM, "generate", out, "--prompt", "Hello", "--max-tokens", "3",
                                 "--ignore-eos"], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "decode: 2 tokens" in result.stderr


def test_serve_bench_measures_levels_beside_the_bandwidth_bound(models, tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, SOURCE_DIR / "tests" / "gpu" / "serve_bench.py", "--loom", LOOM,
         "--model", models / "tiny.gguf", "--device", "cpu", "--concurrency", "1,4",
         "--num-requests", "8", "--input-len", "16", "--output-len", "8", "--speculative-tokens",
         "3", "--out", out,
         "--log", tmp_path / "bench.log", "--", "--threads", "1"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(out.read_text())
    assert [run["concurrency"] for run in summary["levels"]["runs"]] == [1, 4]
    assert all(run["completed"] == 8 and run["failed"] == 0 for run in summary["levels"]["runs"])
    assert summary["copy_bandwidth_gbs"] > 0
    assert summary["bytes_per_token"] == (models / "tiny.gguf").stat().st_size
    assert [row["concurrency"] for row in summary["levels_brief"]] == [1, 4]
    # ITL p50 may be 0 on a loaded machine (tokens that arrive together); p99 never is.
    assert all(row["output_tokens_per_s"] > 0 and row["itl_ms_p99"] > 0
               and row["itl_ms_p99"] >= row["itl_ms_p50"] >= 0
               for row in summary["levels_brief"])
    # The worker's share of each level: a step is at least its forward pass and sampling.
    for row in summary["levels_brief"]:
        assert row["worker_step_ms"] >= row["worker_execute_ms"] + row["worker_sample_ms"] - 0.01
        assert row["worker_execute_ms"] > 0 and row["worker_sample_ms"] > 0
    assert summary["batch1_decode_tokens_per_s"] > 0
    assert summary["batch1_fraction_of_limit"] == pytest.approx(
        summary["batch1_decode_tokens_per_s"] / summary["batch1_tokens_per_s_limit"])
    # Batch 1 with n-gram drafts against none, on the same server.
    speculative = summary["speculative_batch1"]
    assert speculative["without_tokens_per_s"] > 0 and speculative["with_tokens_per_s"] > 0
    assert speculative["speedup"] == pytest.approx(
        speculative["with_tokens_per_s"] / speculative["without_tokens_per_s"])
    assert 0 <= speculative["acceptance_rate"] <= 1


def test_serve_bench_compares_8bit_kv_with_f16_at_one_kv_budget(models, tmp_path):
    # The GPU window's KV dtype bench on the tiny model (2 layers, 2 KV heads of 64: F16 KV
    # 1,024 B a token, 8-bit 528): a 256 KiB pool each, 8 streams of 32 + 16 tokens, 1.5x what
    # F16's pool holds. Tokens/s are recorded, not compared: this machine's speed varies.
    out, log = tmp_path / "kv.json", tmp_path / "kv.log"
    result = subprocess.run(
        [sys.executable, SOURCE_DIR / "tests" / "gpu" / "serve_bench.py", "--loom", LOOM,
         "--model", models / "tiny.gguf", "--device", "cpu", "--kv-dtypes", "f16,int8,fp8_e4m3",
         "--kv-cache-memory", "256KiB", "--concurrency", "8", "--num-requests", "16",
         "--input-len", "32", "--output-len", "16", "--out", out, "--log", log, "--",
         "--threads", "1"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(out.read_text())
    assert summary["passed"] is True and summary["target"] == 1.3
    assert summary["workload"]["working_set_tokens"] == 8 * (32 + 16)
    rows = {row["kv_dtype"]: row for row in summary["kv_dtypes"]}
    assert list(rows) == ["f16", "int8", "fp8_e4m3"]
    for dtype, row in rows.items():
        assert row["pool_dtype"] == dtype and row["block_size"] == 16
        assert row["pool_tokens"] == 16 * row["pool_blocks"] > 0
        # (Tokens that reach a stream together with its first have an ITL of 0.)
        assert row["output_tokens_per_s"] > 0 and row["itl_ms_p99"] >= row["itl_ms_p50"] >= 0
        assert row["worker_mean_batch"] >= 1 and row["preemptions"] >= 0
        run = summary["runs"][dtype]
        assert run["completed"] == 16 and run["failed"] == 0
        assert "KV pool" in (tmp_path / f"kv_{dtype}.log").read_text()  # a log per server
    f16 = rows["f16"]
    assert f16["pool_blocks"] == 256 * 1024 // (16 * 1024)  # 16 blocks of 16 KiB
    assert f16["working_set_over_pool"] == 1.5
    assert "ratio_to_f16" not in f16
    for dtype in ("int8", "fp8_e4m3"):
        row = rows[dtype]
        # The same bytes hold ~1.94x the tokens: 1-byte codes and a BF16 scale per token and head.
        assert row["pool_tokens"] >= 1.8 * f16["pool_tokens"]
        assert row["pool_tokens_ratio_to_f16"] == pytest.approx(
            row["pool_tokens"] / f16["pool_tokens"], abs=1e-3)
        assert row["ratio_to_f16"] == pytest.approx(
            row["output_tokens_per_s"] / f16["output_tokens_per_s"], rel=1e-2)
        assert row["meets_target"] == (row["ratio_to_f16"] >= 1.3)


def run_smoke(models, tmp_path, *extra, options=()):
    out = tmp_path / "smoke.json"
    result = subprocess.run(
        [sys.executable, SMOKE, "--loom", LOOM, "--model", models / "tiny.gguf", "--device", "cpu",
         "--concurrency", "8", "--out", out, "--log", tmp_path / "smoke.log", *options, "--",
         "--threads", "1", *extra],
        capture_output=True, text=True, timeout=600)
    return result, json.loads(out.read_text())


def test_serve_smoke_passes_on_the_cpu(models, tmp_path):
    result, summary = run_smoke(models, tmp_path, options=["--pd", "--draft"])
    logs = (tmp_path / "smoke.log").read_text()[-3000:]
    for extra in ("smoke_pd.log", "smoke_draft.log"):
        if (tmp_path / extra).exists():
            logs += (tmp_path / extra).read_text()[-3000:]
    assert result.returncode == 0, result.stdout + logs
    steps = summary["steps"]
    assert list(steps) == ["start", "completions", "chat", "concurrent", "graphs", "long_prompt",
                           "drain", "pd", "draft"]
    assert all(step["status"] == "passed" for step in steps.values()), steps
    assert steps["concurrent"]["streams"] == 8
    assert steps["graphs"]["loom_worker_steps_total"] > 0
    # Disaggregated: the long prompt handed off with its KV pushed, the mixed server's text.
    # On the CPU the workers' pools are not shared: the hand-off is pushed.
    assert steps["pd"]["pushed"] == 1 and steps["pd"]["transport"] == "pushed"
    assert steps["pd"]["text"] == steps["long_prompt"]["text"]
    # The model drafting for itself: drafts accepted, the text without drafts.
    assert steps["draft"]["accepted"] > 0 and steps["draft"]["text"] == steps["long_prompt"]["text"]
    assert steps["draft"]["sampled_accepted"] > 0  # the rejection sampling accepted drafts


def test_the_further_servers_are_skipped_without_the_time_for_them(models, tmp_path):
    result, summary = run_smoke(models, tmp_path, options=["--pd", "--draft", "--budget-s", "1"])
    assert result.returncode == 0, result.stdout
    assert summary["steps"]["pd"]["status"] == "skipped"
    assert summary["steps"]["draft"]["status"] == "skipped"


def test_serve_smoke_fails_on_a_wrong_answer(models, tmp_path):
    # A context of 40 tokens: the 1,500-token stream of the drain step is refused and the
    # 24-token completion ends early, so those steps must fail, naming the reason.
    result, summary = run_smoke(models, tmp_path, "--max-model-len", "40")
    assert result.returncode == 1
    steps = summary["steps"]
    assert steps["start"]["status"] == "passed"
    assert steps["drain"]["status"] == "failed", steps["drain"]
    assert summary["passed"] is False


def test_a_smoke_test_killed_by_its_limit_stops_the_server_and_keeps_its_findings(models, tmp_path):
    # quick.sh's `timeout` sends SIGTERM to the script only: the server, in a session of its
    # own, must be stopped by the script (and its process group, written to --pgid-file, is
    # killed by quick.sh besides), and the steps that ran so far are in the summary.
    out, pgid_file = tmp_path / "smoke.json", tmp_path / "serve.pgid"
    smoke = subprocess.Popen(
        [sys.executable, SMOKE, "--loom", LOOM, "--model", models / "tiny.gguf", "--device", "cpu",
         "--concurrency", "8", "--out", out, "--log", tmp_path / "smoke.log", "--pgid-file", pgid_file,
         "--", "--threads", "1"],
        stdout=subprocess.PIPE, text=True)
    for line in smoke.stdout:
        if line.startswith("serve_smoke: start: passed"):
            break
    else:
        pytest.fail(f"serve_smoke.py never started the server: {(tmp_path / 'smoke.log').read_text()[-3000:]}")
    pgid = int(pgid_file.read_text())
    smoke.send_signal(signal.SIGTERM)
    assert smoke.wait(timeout=60) == 143
    assert json.loads(out.read_text())["steps"]["start"]["status"] == "passed"
    # No process of the server's group is left running (killed, a worker may stay a zombie
    # until it is reaped).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and running_in_group(pgid):
        time.sleep(0.1)
    assert not running_in_group(pgid)


def running_in_group(pgid):
    running = []
    for entry in os.listdir("/proc"):
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            running.append(int(entry))
    return running
