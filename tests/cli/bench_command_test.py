"""`loom bench` (cli/bench_command.cc, cli/bench_openai_client.cc) against a real `loom up`
(the no-op backend: only the request flow and the counting matter).

* --api grpc and --api openai (streaming POST /v1/completions with token-id prompts)
  run the same workload to completion and count every prompt and output token; the KV pool
  is whole afterwards.
* --api-key is sent as a bearer token: the right key works, a wrong one exits 1 with the
  server's 401.
* Requests the server refuses are counted as failed with the server's message, not lost; a
  request past --timeout-s is failed by the client (the stream is closed) and the server
  frees its KV blocks.
* Bad flags exit 2 with a message: multi-turn over the OpenAI API (its replies carry text,
  not the token ids the next turn appends), no vocabulary size for a server that gives none.
"""
import json
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

KEY = "sk-bench-test-key"
VOCAB = 49152  # SmolLM2's


STEP_MS = 5  # every step sleeps this long first, so a long request outlives a short deadline


def serving(directory, **flags):
    """`loom up` on the no-op engine, ready, stopped after the module's tests."""
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    up = h.Up(directory, step_backend="noop", threads=1, kv_cache_memory="64MiB", **flags)
    try:
        up.wait_for_line(r"loom: ready \(1 replicas\)", h.REGISTER_TIMEOUT_S)
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    yield from serving(tmp_path_factory.mktemp("bench"), debug_step_delay_ms=STEP_MS)


@pytest.fixture(scope="module")
def up_with_key(tmp_path_factory):
    yield from serving(tmp_path_factory.mktemp("bench_key"), api_key=KEY)


def bench(tmp_path, *args, timeout=120):
    out = tmp_path / "bench.json"
    done = subprocess.run([str(h.LOOM_BIN), "bench", *map(str, args), "--output", str(out)],
                          capture_output=True, text=True, timeout=timeout)
    report = json.loads(out.read_text()) if done.returncode == 0 else None
    return done, report


WORKLOAD = ["--concurrency", 3, "--num-requests", 7, "--input-len", 20, "--output-len", 5,
            "--warmup", 1]


@pytest.mark.parametrize("backend, api_flag", [("grpc", []), ("openai", ["--api", "openai"]),
                                               ("openai", ["--backend", "openai"])])
def test_both_apis_count_every_token(up, tmp_path, backend, api_flag):
    target = (["--address", up.address] if backend == "grpc"
              else [*api_flag, "--base-url", up.http_url, "--vocab-size", VOCAB])
    done, report = bench(tmp_path, *target, *WORKLOAD)
    assert done.returncode == 0, done.stderr
    assert report["api"] == backend
    # --backend is --api's deprecated name: it still works, and says so.
    assert ("--backend is deprecated: use --api openai" in done.stderr) == ("--backend" in api_flag)
    run = report["runs"][0]
    assert (run["completed"], run["failed"], run["errors"]) == (7, 0, [])
    assert run["input_tokens"] == 7 * 20
    assert run["output_tokens"] == 7 * 5
    assert 0 < run["ttft_ms"]["p50"] <= run["e2e_ms"]["p50"]
    assert "concurrency 3" in done.stdout and f"({backend})" in done.stdout
    up.wait_idle()


def test_openai_backend_accepts_the_v1_root_and_sends_the_api_key(up_with_key, tmp_path):
    done, report = bench(tmp_path, "--api", "openai", "--base-url", up_with_key.http_url + "/v1/",
                         "--api-key", KEY, "--vocab-size", VOCAB, *WORKLOAD)
    assert done.returncode == 0, done.stderr
    assert report["runs"][0]["completed"] == 7
    wrong, _ = bench(tmp_path, "--api", "openai", "--base-url", up_with_key.http_url,
                     "--api-key", "sk-wrong", "--vocab-size", VOCAB, *WORKLOAD)
    assert wrong.returncode == 1
    assert "HTTP 401" in wrong.stderr, wrong.stderr
    assert "sk-wrong" not in wrong.stderr


def test_refused_requests_are_counted_as_failed_with_the_servers_message(up, tmp_path):
    # Token ids drawn up to twice the vocabulary: the server answers 400 for most prompts.
    done, report = bench(tmp_path, "--api", "openai", "--base-url", up.http_url,
                         "--vocab-size", 2 * VOCAB, "--concurrency", 2, "--num-requests", 6,
                         "--input-len", 16, "--output-len", 4, "--warmup", 0)
    assert done.returncode == 0, done.stderr
    run = report["runs"][0]
    assert run["completed"] + run["failed"] == 6
    assert run["failed"] >= 1
    assert any("HTTP 400" in error and "outside the vocabulary" in error for error in run["errors"])
    up.wait_idle()


def test_openai_requests_past_the_deadline_fail_and_free_their_blocks(up, tmp_path):
    # 400 tokens take at least 400 x STEP_MS = 2 s: far past a 0.25 s deadline.
    done, report = bench(tmp_path, "--api", "openai", "--base-url", up.http_url,
                         "--vocab-size", VOCAB, "--concurrency", 2, "--num-requests", 2,
                         "--input-len", 16, "--output-len", 400, "--warmup", 0, "--timeout-s", 0.25)
    assert done.returncode == 0, done.stderr
    run = report["runs"][0]
    assert (run["completed"], run["failed"]) == (0, 2)
    assert run["errors"] and all("deadline of 0.25 s exceeded" in e for e in run["errors"])
    up.wait_idle()


def test_bad_flags_exit_2_with_a_message(up, tmp_path):
    multi_turn, _ = bench(tmp_path, "--api", "openai", "--base-url", up.http_url,
                          "--vocab-size", VOCAB, "--dataset", "multi-turn")
    assert multi_turn.returncode == 2
    assert "--api grpc" in multi_turn.stderr
    no_vocab, _ = bench(tmp_path, "--api", "openai", "--base-url", up.http_url)
    assert no_vocab.returncode == 2
    assert "--vocab-size" in no_vocab.stderr
    unreachable, _ = bench(tmp_path, "--api", "openai", "--base-url", "http://127.0.0.1:1",
                           "--vocab-size", VOCAB)
    assert unreachable.returncode == 1
    assert "cannot reach" in unreachable.stderr
    too_many, _ = bench(tmp_path, "--address", up.address, "--num-speculative-tokens", 17)
    assert too_many.returncode == 2
    assert "--num-speculative-tokens" in too_many.stderr


def test_speculation_asked_per_request_is_reported(up, tmp_path):
    # The no-op engine proposes n-gram drafts where its tokens repeat and accepts none: with
    # drafts asked for, whatever was proposed is counted and nothing accepted; with 0, no
    # draft at all.
    for drafts in (0, 4):
        done, report = bench(tmp_path, "--address", up.address, *WORKLOAD,
                             "--num-speculative-tokens", drafts)
        assert done.returncode == 0, done.stderr
        run = report["runs"][0]
        assert run["completed"] == 7
        assert run["accepted_tokens"] == 0 and run["acceptance_rate"] == 0.0
        if drafts == 0:
            assert run["draft_tokens"] == 0
    up.wait_idle()
