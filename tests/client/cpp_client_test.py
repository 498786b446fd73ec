"""The C++ SDK (loom::client) against real processes, through tests/client/client_tool.cc
and the example program client/examples/generate.cc:

* blocking and streaming Generate: greedy text equals `loom generate`'s; usage, logprobs;
* cancelling a stream mid-generation ends it CANCELLED and frees every KV block;
* a deadline that expires gives DEADLINE_EXCEEDED and frees every KV block;
* UNAVAILABLE before any token is retried until a worker registers;
* Tokenize/Detokenize round trip, Embed, ListModels, GetClusterState.
"""
import json
import subprocess
import time

import pytest

from client_test_util import LONG_RUN_TOKENS, PROMPT, blocks_in_use, h, require_cluster_binaries

TOOL = h.BUILD_DIR / "tests" / "client" / "client_tool"
EXAMPLE = h.BUILD_DIR / "client" / "examples" / "generate"


def run_tool(*args, timeout: float = 180) -> dict:
    done = subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    require_cluster_binaries()
    missing = h.require_binaries(TOOL, EXAMPLE)
    if missing:
        pytest.fail(missing)
    with h.running_cluster(tmp_path_factory.mktemp("cpp_client"), {"r0": {"threads": 1}}) as rig:
        yield rig


@pytest.fixture(scope="module")
def reference():
    return h.loom_generate(PROMPT, 16, threads=1).text


def test_blocking_generate_greedy_equals_loom_generate(rig, reference):
    out = run_tool("generate", "--address", rig.coordinator.address, "--prompt", PROMPT,
                   "--max-tokens", 16, "--logprobs", 1)
    assert out["code"] == "OK", out
    completion = out["completion"]
    assert completion["text"] == reference
    assert completion["finish_reason"] in ("stop", "length")
    assert completion["completion_tokens"] == len(completion["token_ids"]) > 0
    assert completion["prompt_tokens"] == len(h.tokenize(PROMPT))
    assert completion["attempts"] == 1
    assert [l["token_id"] for l in completion["logprobs"]] == completion["token_ids"]
    assert all(l["logprob"] <= 0 and l["top"] == 1 for l in completion["logprobs"])


def test_streaming_generate_joins_to_the_same_text(rig, reference):
    out = run_tool("generate", "--address", rig.coordinator.address, "--prompt", PROMPT,
                   "--max-tokens", 16, "--stream")
    assert out["code"] == "OK", out
    assert out["chunks"] >= 2
    assert out["completion"]["text"] == reference


def test_example_program_prints_the_completion(rig, reference):
    done = subprocess.run([str(EXAMPLE), "--address", rig.coordinator.address, "--max-tokens", "16",
                           "--stream", PROMPT], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout == reference + "\n"
    assert "finish:" in done.stderr


def test_cancel_mid_stream_frees_kv_blocks(rig):
    out = run_tool("stream-cancel", "--address", rig.coordinator.address, "--prompt", h.LONG_PARAGRAPH,
                   "--max-tokens", LONG_RUN_TOKENS, "--cancel-after", 4)
    assert "ended_early" not in out, out
    assert out["tokens_before_cancel"] >= 4
    assert out["end"]["code"] == "CANCELLED", out
    rig.coordinator.wait_idle(timeout=15)


@pytest.mark.slow_machine
def test_deadline_expiry_frees_kv_blocks(rig):
    start = time.monotonic()
    out = run_tool("generate", "--address", rig.coordinator.address, "--prompt", h.LONG_PARAGRAPH,
                   "--max-tokens", LONG_RUN_TOKENS, "--ignore-eos", "--timeout", 2)
    assert out["code"] == "DEADLINE_EXCEEDED", out
    assert time.monotonic() - start < 15
    rig.coordinator.wait_idle(timeout=15)
    assert blocks_in_use(rig.coordinator) == 0


def test_tokenize_detokenize_models_and_state(rig):
    text = "Hello, world! The quick brown fox."
    out = run_tool("info", "--address", rig.coordinator.address, "--text", text)
    assert out["tokenize"]["code"] == "OK", out
    assert out["token_ids"] == h.tokenize(text)
    assert out["text"] == text
    assert out["detokenize_invalid"]["code"] == "INVALID_ARGUMENT", out
    # Embed: the text and its token ids give one unit vector, bit for bit.
    assert out["embed"]["code"] == "OK", out
    first, second = out["embeddings"]
    assert first == second and len(first) == 576
    assert abs(sum(v * v for v in first) - 1.0) < 1e-4
    assert out["embed_prompt_tokens"] == 2 * len(out["token_ids"])
    assert out["embed_invalid"]["code"] == "INVALID_ARGUMENT", out
    assert [m["id"] for m in out["models"]] == [h.MODEL_PATH.stem]
    assert out["models"][0]["vocab_size"] == 49152
    assert out["model"] == h.MODEL_PATH.stem
    assert [r["replica_id"] for r in out["replicas"]] == ["r0"]
    assert out["replicas"][0]["healthy"]


def test_unavailable_before_the_first_token_is_retried(tmp_path, reference):
    require_cluster_binaries()
    with h.ClusterRig(tmp_path) as rig:
        args = [str(TOOL), "generate", "--address", rig.coordinator.address, "--prompt", PROMPT,
                "--max-tokens", "16", "--timeout", "120", "--max-attempts", "1000", "--backoff-ms", "100"]
        tool = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.0)  # UNAVAILABLE while no replica exists
            rig.add_worker("r0", threads=1)
            stdout, stderr = tool.communicate(timeout=150)
        finally:
            tool.kill()
        assert tool.returncode == 0, stderr
        out = json.loads(stdout)
        assert out["code"] == "OK", out
        assert out["completion"]["attempts"] > 1
        assert out["completion"]["text"] == reference
