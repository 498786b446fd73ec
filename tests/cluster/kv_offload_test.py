"""The host KV tier over real processes (`loom up --kv-offload-memory`): a pool too small for the
working set evicts cached blocks into the worker's host memory and reloads them on a later prefix
hit instead of recomputing. A reload must be invisible in the output: 100 greedy prompts (12 shared
documents, each followed by its own question, sent in waves so that every document is evicted
before it recurs) produce exactly the tokens of the same server without a host tier, while the
host tier served a large share of their prompt tokens. Tensor parallelism (`-tp 2`: each rank
offloads its own heads' slice) and an 8-bit KV cache (scales travel with their blocks) too.
Every block is free again at the end on both sides of the tier.
"""
import subprocess

import pytest

import cluster_harness as h
from cluster_harness import make_request

DOCUMENTS = [
    f"Document {d}: " + " ".join(f"{word}{d}" for word in
                                 ("river", "stone", "garden", "lantern", "harbor", "meadow", "copper",
                                  "violet", "signal", "orchard", "canyon", "willow") * 4)
    for d in range(12)]
QUESTIONS = ["Summarize it.", "What is the first word?", "Name a color in it.", "Is it long?",
             "Translate the title.", "Count the rivers.", "What comes last?", "Give one noun.",
             "Rewrite it shorter."]
WAVE = 6
MAX_TOKENS = 6


def prompts(count):
    return [f"{DOCUMENTS[i % len(DOCUMENTS)]}\nQuestion: {QUESTIONS[i % len(QUESTIONS)]}\nAnswer:"
            for i in range(count)]


@pytest.fixture(scope="module")
def binaries():
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)


def serve(tmp_path, name, count, **flags):
    """Greedy outcomes of prompts(count) in waves of WAVE, and the replica's final status."""
    up = h.Up(tmp_path / name, threads=1, kv_cache_memory=flags.pop("kv_cache_memory", "10MiB"),
              http_port=-1, **flags)
    try:
        up.wait_healthy(["replica-0"])
        texts = prompts(count)
        outcomes = []
        for start in range(0, count, WAVE):
            wave = [make_request(prompt=p, max_tokens=MAX_TOKENS, ignore_eos=True)
                    for p in texts[start:start + WAVE]]
            outcomes += h.generate_all(up.stub, wave, timeout=240)
        for outcome in outcomes:
            assert outcome.finished, (name, outcome.describe())
            assert len(outcome.token_ids) == MAX_TOKENS
        status = up.wait_idle()["replica-0"]
        return outcomes, status
    finally:
        up.stop()
        print(up.log_tail())


def assert_same_tokens(reference, offloaded, what):
    for ref, got in zip(reference, offloaded, strict=True):
        assert got.token_ids == ref.token_ids, (what, ref.request.prompt[-40:], ref.text, got.text)


def assert_tier_served(status, count):
    assert status.num_host_kv_blocks > 0
    assert status.num_kv_blocks_offloaded > 0, status
    assert status.num_kv_blocks_reloaded > 0, status
    # Every document recurs after its blocks left the pool: most recurrences reload them.
    document_tokens = 16 * (count - len(DOCUMENTS))
    assert status.num_host_hit_tokens >= 0.5 * document_tokens, status
    assert status.num_free_blocks == status.num_kv_blocks


def test_greedy_output_with_the_host_tier_equals_output_without_it(binaries, tmp_path):
    reference, plain = serve(tmp_path, "plain", 100)
    offloaded, tiered = serve(tmp_path, "tiered", 100, kv_offload_memory="64MiB")
    assert plain.num_host_kv_blocks == 0 and plain.num_kv_blocks_reloaded == 0
    assert_same_tokens(reference, offloaded, "offload on vs off")
    assert_tier_served(tiered, 100)


def test_tensor_parallel_ranks_and_8bit_kv_reload_their_own_slices(binaries, tmp_path):
    reference, _ = serve(tmp_path, "tp2-plain", 24, tensor_parallel_size=2, kv_cache_dtype="int8")
    offloaded, tiered = serve(tmp_path, "tp2-tiered", 24, tensor_parallel_size=2,
                              kv_cache_dtype="int8", kv_offload_memory="32MiB")
    assert_same_tokens(reference, offloaded, "tp2 int8 offload on vs off")
    assert_tier_served(tiered, 24)


def test_a_host_tier_smaller_than_one_block_is_refused_at_start(binaries):
    done = subprocess.run([h.WORKER_BIN, "--model", h.MODEL_PATH, "--coordinator", "127.0.0.1:9",
                           "--threads", "1", "--kv-cache-memory", "4MiB", "--kv-offload-memory", "1KiB"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "the KV host tier of 1024 bytes holds no block" in done.stderr, done.stderr[-2000:]
