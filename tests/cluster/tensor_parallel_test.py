"""Tensor-parallel replicas over real processes: `loom up --tensor-parallel 2` and `3` on the default
model (SmolLM2-135M: 9 query heads, 3 KV heads, FFN 1536; gloo ranks meeting through the
coordinator; 2 ranks split the heads 5 + 4 and both hold the KV head their groups share) serve
the same greedy text as the single-process engine; what cannot be split is refused with a clear
message (10 ranks for 9 heads; the random test model's FFN of 224 channels does not split into
32-element quantization blocks at 2 ranks).

Supported: up to one rank per query head (heads split as evenly as possible, KV heads split,
shared or replicated as the heads need), FFN channels that divide evenly, and splits that fall on
the weights' quantization blocks.
"""
import pathlib
import subprocess
import sys
import time

import grpc

import pytest

import cluster_harness as h
from cluster_harness import make_request

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land"]
MAX_TOKENS = 12


@pytest.fixture(scope="module", params=[2, 3], ids=["tp2", "tp3"])
def tp(request, tmp_path_factory):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    # Exact float activations (the default, said explicitly): the ranks' partial sums round
    # differently from one process's sums, and int8 activations turn such last-bit
    # differences into whole quantization steps now and then, so only f32 makes identical
    # greedy text a fair test of the split. tests/worker/tensor_parallel_test.cc bounds the int8 difference.
    up = h.Up(tmp_path_factory.mktemp(f"tp{request.param}"), tensor_parallel=request.param, threads=1,
              kv_cache_memory="64MiB", http_port=-1, activations="f32")
    try:
        up.wait_healthy(["replica-0"])
        yield up
    finally:
        up.stop()
        print(up.log_tail())


def test_ranks_serve_the_single_process_greedy_text(tp):
    replicas = tp.replicas()
    assert replicas["replica-0"].healthy
    outcomes = h.generate_all(tp.stub, [make_request(prompt=p, max_tokens=MAX_TOKENS) for p in PROMPTS])
    for prompt, outcome in zip(PROMPTS, outcomes):
        assert outcome.finished, outcome.describe()
        reference = h.loom_generate(prompt, MAX_TOKENS, threads=1, extra=["--activations", "f32"])
        assert outcome.text == reference.text, (prompt, outcome.text, reference.text)
    tp.wait_idle()


def run_worker(args, timeout=60):
    return subprocess.run([str(h.WORKER_BIN), "--coordinator", "127.0.0.1:1", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_more_ranks_than_heads_are_refused():
    done = run_worker(["--model", str(h.MODEL_PATH), "--world-size", "10", "--rank", "0"])
    assert done.returncode == 2
    assert "more than the model's 9 attention heads" in done.stderr


def test_a_split_off_the_quantization_blocks_is_refused(tmp_path):
    """llama_gqa's 224 FFN channels over 4 ranks: 56 each, which cuts its 32-wide quantization
    blocks into pieces of 8 (a cut into halves of 16 loads: INT8 g16 with F32 scales)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
    import random_model  # noqa: E402

    path = tmp_path / "llama_gqa.gguf"
    random_model.write_model(random_model.SPECS["llama_gqa"], path)
    coordinator = h.Coordinator(tmp_path, model=path, http_port=-1)
    try:
        # Both ranks meet, then each fails to load its shard with the reason.
        ranks = [subprocess.Popen(
            [str(h.WORKER_BIN), "--model", str(path), "--coordinator", coordinator.address,
             "--world-size", "4", "--rank", str(rank), "--threads", "1", "--listen", "127.0.0.1:0",
             "--rendezvous-timeout-ms", "20000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(4)]
        for rank in ranks:
            _, stderr = rank.communicate(timeout=60)
            assert rank.returncode != 0
            assert "cannot be split" in stderr and "tensor parallelism" in stderr, stderr
    finally:
        coordinator.stop()


@pytest.mark.slow_machine
def test_killing_one_rank_fails_its_replica_and_the_other_keeps_serving(tmp_path):
    """A 2-rank replica beside a single-worker one: SIGKILL one rank mid-stream. The tensor-parallel
    replica's requests end with an error (or are retried elsewhere when they had no output yet), it
    is reported down, the other replica keeps serving, and the surviving rank still stops on
    SIGTERM (nothing hangs in a collective)."""
    import threading

    coordinator = h.Coordinator(tmp_path, http_port=-1, step_timeout_ms=3000, heartbeat_timeout_ms=3000)
    processes = [coordinator]
    try:
        ranks = [None, None]

        def start(rank):  # both at once: each waits for the other at rendezvous
            ranks[rank] = h.Worker(tmp_path, coordinator.address, "tp", threads=1, world_size=2,
                                   rank=rank, rendezvous_id="kill-test", kv_cache_memory="64MiB")

        starters = [threading.Thread(target=start, args=(r,)) for r in range(2)]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        assert all(ranks), "a rank did not start"
        processes += ranks
        solo = h.Worker(tmp_path, coordinator.address, "solo", threads=1, kv_cache_memory="64MiB")
        processes.append(solo)
        coordinator.wait_healthy(["tp", "solo"])

        streams = [h.Stream(coordinator.stub, make_request(f"{p} {i}", max_tokens=300, ignore_eos=True), 120)
                   for i, p in enumerate(PROMPTS * 2)]
        for stream in streams:
            assert stream.wait_tokens(2, timeout=60), stream.outcome.describe()
        on_tp = [s for s in streams if s.outcome.replica_id == "tp"]
        assert on_tp, "no stream was placed on the tensor-parallel replica"

        killed_at = time.monotonic()
        ranks[1].kill()
        for stream in on_tp:
            outcome = stream.join(timeout=30)
            assert outcome.code == grpc.StatusCode.OK and outcome.finish_reason == FINISH("FINISH_REASON_ERROR"), \
                outcome.describe()
            assert outcome.ended_at - killed_at < 10, outcome.describe()
        status = coordinator.wait_replicas(lambda r: not r["tp"].healthy, 10, "tp reported down")
        assert status["solo"].healthy
        fresh = h.generate_all(coordinator.stub, [make_request(p, max_tokens=6) for p in PROMPTS], timeout=60)
        for outcome in fresh:
            assert outcome.finished and outcome.replica_id == "solo", outcome.describe()
        for stream in streams:
            if stream.outcome.replica_id == "solo":
                assert stream.join(timeout=120).finished, stream.outcome.describe()
        # The surviving rank is not stuck in a collective: it stops on SIGTERM.
        assert ranks[0].stop(timeout=15) is not None, "rank 0 did not stop on SIGTERM"
    finally:
        for process in reversed(processes):
            process.stop(timeout=5)


def FINISH(name):
    return h.stubs().pb.FinishReason.Value(name)


@pytest.mark.parametrize("spec, ranks", [("llama3_rope", 2), ("qwen2_mqa", 3), ("mixtral_top2", 2),
                                         ("glm4_sandwich", 2), ("granite_scaled", 2),
                                         ("gpt_oss_sinks", 2), ("gpt_oss_sinks", 4),
                                         ("qwen2moe_shared", 2), ("glm4moe", 2),
                                         ("olmo2_swa", 2), ("olmoe", 2), ("ernie45_moe", 2),
                                         ("exaone4_swa", 2), ("granitemoe_shared", 2),
                                         ("deepseek2_qlora", 2)])
def test_random_models_split_evenly_and_unevenly(tmp_path, spec, ranks):
    """llama3_rope (4 heads, 2 KV heads) on 2 ranks splits evenly; qwen2_mqa (5 heads, 1 KV head,
    Q/K/V biases, neox RoPE, separate LM head) on 3 ranks splits 2 + 2 + 1 with the KV head on every
    rank; mixtral_top2 (4 experts, top 2) slices every expert's channels over 2 ranks, each rank
    routing alike with the whole router; glm4_sandwich slices its fused gate/up and its partially
    rotating heads, its post norms running on the summed outputs; granite_scaled scales the
    summed sub-layer outputs and the gathered logits; gpt_oss_sinks slices its sinks by query
    head and its experts' MXFP4 blocks and biases, rank 0 alone adding the row-parallel biases
    (attention output, expert down); on 4 ranks each expert's 16 channels cut its MXFP4 blocks
    in half (INT8 g16 with F32 scales, the same values), as gpt-oss's 2,880 over 4 GPUs do;
    qwen2moe_shared slices its shared expert's channels like a dense FFN's, each rank gating
    its partial sum with the whole gate; glm4moe slices its dense first layer, its experts and
    its ungated shared expert, each rank choosing experts alike with the whole router and
    selection bias, and skips its MTP layer; olmo2_swa and olmoe gather every rank's q and k
    columns for their QK-norm over all heads (olmo2_swa without pre-norms); ernie45_moe
    routes by softmax with its selection bias; granitemoe_shared slices its experts and its
    ungated shared expert under Granite's multipliers; deepseek2_qlora slices its latent
    attention by head (each rank decompressing its heads' keys and values from the whole
    latent) and routes in expert groups.
    Greedy text through `loom up` equals the
    single-process engine's."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
    import random_model  # noqa: E402

    path = tmp_path / f"{spec}.gguf"
    random_model.write_model(random_model.SPECS[spec], path)
    up = h.Up(tmp_path, model=path, tensor_parallel=ranks, threads=1, kv_cache_memory="16MiB",
              http_port=-1)
    try:
        up.wait_healthy(["replica-0"])
        prompts = ["the quick brown fox", "hello world, this is", "once upon a time"]
        outcomes = h.generate_all(up.stub, [make_request(prompt=p, max_tokens=10) for p in prompts])
        for prompt, outcome in zip(prompts, outcomes):
            assert outcome.finished, outcome.describe()
            reference = h.loom_generate(prompt, 10, model=path, threads=1)
            assert outcome.text == reference.text, (spec, prompt, outcome.text, reference.text)
    finally:
        up.stop()
