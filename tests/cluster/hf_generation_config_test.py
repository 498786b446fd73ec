"""generation_config.json's sampling parameters become the defaults of requests that leave a
field unset (vLLM's `--generation-config auto`, the default; `vllm` ignores them); a request
that sets a field keeps its value.

`loom up --model DIR` serves a random Qwen2 directory (tests/common/hf_checkpoint.py) whose
generation_config.json is rewritten per case. Sampling is observed through its effect: with
ignore_eos, a sampled continuation differs from the greedy one for at least one of several
seeds, while greedy (temperature 0, or top_k 1) gives the same text for every seed.
"""
import json
import pathlib
import sys
import urllib.request

import pytest

import cluster_harness as h
from cluster_harness import make_request

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "worker"))
sys.path.insert(0, str(TESTS / "common"))

import hf_checkpoint  # noqa: E402
import random_model  # noqa: E402

PROMPT = "the quick brown fox"
MAX_TOKENS = 12
SEEDS = [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    root = h.cluster_log_dir(tmp_path_factory, "hf_genconfig")
    gguf_path = random_model.write_model(random_model.SPECS["qwen2_mqa"], root / "model.gguf")
    return hf_checkpoint.write_hf_directory(gguf_path, root / "base", dtype="float32")


def with_generation_config(base, target, **fields):
    target.mkdir()
    for item in base.iterdir():
        if item.name != "generation_config.json":
            (target / item.name).symlink_to(item)
    config = json.loads((base / "generation_config.json").read_text())
    config.update(fields)
    (target / "generation_config.json").write_text(json.dumps(config))
    return target


def grpc_texts(up, **sampling):
    requests = [make_request(prompt=PROMPT, max_tokens=MAX_TOKENS, seed=seed, **sampling)
                for seed in SEEDS]
    for request in requests:
        request.ignore_eos = True
    outcomes = h.generate_all(up.stub, requests)
    for outcome in outcomes:
        assert outcome.finished, outcome.describe()
    return [outcome.text for outcome in outcomes]


def http_texts(up, **body):
    with urllib.request.urlopen(f"{up.http_url}/v1/models", timeout=30) as response:
        model = json.loads(response.read())["data"][0]["id"]
    texts = []
    for seed in SEEDS:
        payload = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "seed": seed,
                   "ignore_eos": True, **body}
        request = urllib.request.Request(f"{up.http_url}/v1/completions",
                                         data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            texts.append(json.loads(response.read())["choices"][0]["text"])
    return texts


def serve(tmp_path, directory, **flags):
    up = h.Up(tmp_path, model=directory, threads=1, kv_cache_memory="16MiB", **flags)
    up.wait_healthy(["replica-0"])
    return up


def test_model_temperature_is_the_default_and_a_request_overrides_it(base_dir, tmp_path):
    directory = with_generation_config(base_dir, tmp_path / "hot", temperature=1.5)
    up = serve(tmp_path, directory)
    try:
        greedy = grpc_texts(up, temperature=0.0)  # set: overrides the model's 1.5
        assert len(set(greedy)) == 1
        unset = grpc_texts(up)  # unset: the model's 1.5, not the gRPC API's greedy
        assert any(text != greedy[0] for text in unset), unset
    finally:
        up.stop()


def test_without_generation_defaults_an_unset_grpc_temperature_is_greedy(base_dir, tmp_path):
    """The check above can fail: the same requests are greedy without the model default,
    and with `--generation-config vllm`, which ignores it."""
    up = serve(tmp_path, base_dir)
    try:
        assert len(set(grpc_texts(up))) == 1
    finally:
        up.stop()
    directory = with_generation_config(base_dir, tmp_path / "ignored", temperature=1.5)
    up = serve(tmp_path, directory, generation_config="vllm")
    try:
        assert len(set(grpc_texts(up))) == 1
    finally:
        up.stop()


def test_openai_requests_take_the_model_temperature_before_openai_s(base_dir, tmp_path):
    directory = with_generation_config(base_dir, tmp_path / "cold", temperature=0.0)
    up = serve(tmp_path, directory)
    try:
        greedy = http_texts(up)  # unset: the model's 0, not OpenAI's 1
        assert len(set(greedy)) == 1
        sampled = http_texts(up, temperature=1.5)  # set: the request's
        assert any(text != greedy[0] for text in sampled), sampled
    finally:
        up.stop()
    up = serve(tmp_path, base_dir)  # no model default: OpenAI's temperature 1 samples
    try:
        assert len(set(http_texts(up))) > 1
    finally:
        up.stop()


def test_openai_requests_take_the_model_top_k(base_dir, tmp_path):
    directory = with_generation_config(base_dir, tmp_path / "topk", top_k=1)
    up = serve(tmp_path, directory)
    try:
        # temperature set, top_k unset: the model's top_k 1 makes it greedy.
        greedy = http_texts(up, temperature=1.5)
        assert len(set(greedy)) == 1
        # top_k set too (-1: off): the request's value wins.
        sampled = http_texts(up, temperature=1.5, top_k=-1)
        assert any(text != greedy[0] for text in sampled), sampled
    finally:
        up.stop()


def test_an_out_of_range_default_is_refused_at_load(base_dir, tmp_path):
    directory = with_generation_config(base_dir, tmp_path / "bad", top_p=1.5)
    up = None
    with pytest.raises(Exception) as error:
        up = h.Up(tmp_path, model=directory, threads=1, kv_cache_memory="16MiB")
        up.wait_healthy(["replica-0"], timeout=30)
    if up is not None:
        up.stop()
    assert "top_p" in str(error.value)
