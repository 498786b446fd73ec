"""`loom up --model DIR --tensor-parallel 2` on Hugging Face directories of the random models
(tests/common/hf_checkpoint.py from tests/worker/random_model.py): each rank maps the
safetensors files and packs only its rows / columns of each matrix, and the greedy text equals
the single-process engine's on the same directory (`loom generate --model DIR`). Logits against
the numpy reference at TP=1 are checked in tests/worker/hf_model_test.py.
"""
import pathlib
import sys

import pytest

import cluster_harness as h
from cluster_harness import make_request

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "worker"))
sys.path.insert(0, str(TESTS / "common"))

import hf_checkpoint  # noqa: E402
import random_model  # noqa: E402

PROMPTS = ["the quick brown fox", "hello world, this is", "once upon a time"]
MAX_TOKENS = 10


@pytest.mark.parametrize("family", ["llama3_rope", "qwen2_mqa", "qwen3_qknorm", "qwen2_yarn",
                                    "qwen3moe_top8", "phi3_longrope"])
def test_tensor_parallel_ranks_serve_the_single_process_text(tmp_path, family):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    spec = (random_model.QWEN3_SPEC if family == "qwen3_qknorm" else
            random_model.SPECS["qwen2_mqa"] if family == "qwen2_yarn" else random_model.SPECS[family])
    gguf_path = random_model.write_model(spec, tmp_path / f"{family}.gguf")
    rope_scaling = None
    if spec.llama3_rope is not None:
        rope = spec.llama3_rope
        rope_scaling = {"rope_type": "llama3", "factor": rope["factor"],
                        "low_freq_factor": rope["low_freq_factor"],
                        "high_freq_factor": rope["high_freq_factor"],
                        "original_max_position_embeddings": rope["original_context_length"]}
    if family == "qwen2_yarn":
        rope_scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    directory = hf_checkpoint.write_hf_directory(gguf_path, tmp_path / family, dtype="float32",
                                                 rope_scaling=rope_scaling)
    up = h.Up(tmp_path, model=directory, tensor_parallel=2, threads=1, kv_cache_memory="16MiB",
              http_port=-1)
    try:
        up.wait_healthy(["replica-0"])
        outcomes = h.generate_all(up.stub, [make_request(prompt=p, max_tokens=MAX_TOKENS) for p in PROMPTS])
        for prompt, outcome in zip(PROMPTS, outcomes):
            assert outcome.finished, outcome.describe()
            reference = h.loom_generate(prompt, MAX_TOKENS, model=directory, threads=1)
            assert outcome.text == reference.text, (family, prompt, outcome.text, reference.text)
    finally:
        up.stop()
