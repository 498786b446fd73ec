"""`loom-worker --quantization int8|int4` on a Hugging Face directory (the random Llama 3 model,
float32, written by tests/common/hf_checkpoint.py): the worker quantizes the linear layers at load
with `loom quantize`'s code, still registers with a coordinator serving the unquantized
directory (same fingerprint), and serves the greedy text of `loom generate` on the file
`loom quantize --format <same>` writes from that directory.
"""
import pathlib
import subprocess
import sys

import pytest

import cluster_harness as h
from cluster_harness import make_request

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "worker"))
sys.path.insert(0, str(TESTS / "common"))

import hf_checkpoint  # noqa: E402
import random_model  # noqa: E402

PROMPTS = ["the quick brown fox", "once upon a time"]
MAX_TOKENS = 10


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_worker_quantizes_a_directory_at_load_like_loom_quantize(tmp_path, fmt):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    spec = random_model.SPECS["llama3_rope"]
    gguf_path = random_model.write_model(spec, tmp_path / "model.gguf")
    rope = spec.llama3_rope
    directory = hf_checkpoint.write_hf_directory(
        gguf_path, tmp_path / "hf", dtype="float32",
        rope_scaling={"rope_type": "llama3", "factor": rope["factor"],
                      "low_freq_factor": rope["low_freq_factor"],
                      "high_freq_factor": rope["high_freq_factor"],
                      "original_max_position_embeddings": rope["original_context_length"]})
    quantized = tmp_path / f"{fmt}.gguf"
    done = subprocess.run([str(h.LOOM_BIN), "quantize", "--model", str(directory), "--out",
                           str(quantized), "--format", fmt], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    coordinator = h.Coordinator(tmp_path, model=directory, http_port=-1)
    worker = None
    try:
        worker = h.Worker(tmp_path, coordinator.address, "q", model=directory, quantization=fmt,
                          kv_cache_memory="16MiB")
        coordinator.wait_healthy(["q"])
        outcomes = h.generate_all(coordinator.stub,
                                  [make_request(prompt=p, max_tokens=MAX_TOKENS) for p in PROMPTS])
        for prompt, outcome in zip(PROMPTS, outcomes):
            assert outcome.finished, outcome.describe()
            reference = h.loom_generate(prompt, MAX_TOKENS, model=quantized, threads=1)
            unquantized = h.loom_generate(prompt, MAX_TOKENS, model=directory, threads=1)
            assert outcome.text == reference.text, (fmt, prompt, outcome.text, reference.text)
            print(fmt, repr(prompt), repr(outcome.text), "unquantized:", repr(unquantized.text))
    finally:
        if worker is not None:
            worker.stop(timeout=10)
        coordinator.stop(timeout=10)
