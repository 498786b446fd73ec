"""Pipeline-parallel replicas over real processes: `loom up --pipeline-parallel-size 2` (two worker
processes, each a contiguous range of layers, the residual stream passed stage to stage over gloo;
the last stage samples) and `-pp 2 -tp 2` (four processes: two stages of two tensor-parallel ranks)
serve exactly the tokens and log-probabilities of the same replica without stages: a stage runs its
layers with the same kernels on the same rows, so nothing may differ in a single bit (greedy and
seeded sampling, the top-5 log-probabilities of every token). On the default model (30 layers:
15 + 15), and on random models that exercise what a stage boundary must carry: an untied LM head on
the last stage and the embedding on the first (qwen2_mqa), sliding-window layers numbered by the
whole model (llama_swa: 3 layers split 2 + 1, windows smaller than the prompts), and stages of
tensor-parallel groups (llama3_rope). Killing a stage mid-stream fails the replica, its streams
migrate to the other replica (--migration-limit) and end with the tokens of an uninterrupted run,
and the surviving stage stops (nothing waits for a dead stage).
"""
import pathlib
import sys
import threading
import time

import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land"]
MAX_TOKENS = 12
MIGRATED_TOKENS = 40


class Outcomes(list):
    num_kv_blocks = 0


def requests(prompts):
    """Greedy and seeded sampled requests, each with its top-5 log-probabilities."""
    out = [make_request(prompt=p, max_tokens=MAX_TOKENS, num_logprobs=5) for p in prompts]
    out += [make_request(prompt=p, max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.95, seed=11 + i,
                         num_logprobs=5) for i, p in enumerate(prompts)]
    return out


def serve(tmp_path, name, model=h.MODEL_PATH, **flags):
    """The outcomes of requests(PROMPTS) on `loom up` with `flags`, and the replica's KV blocks."""
    up = h.Up(tmp_path / name, model=model, threads=1, kv_cache_memory="32MiB", http_port=-1, **flags)
    try:
        up.wait_healthy(["replica-0"])
        outcomes = Outcomes(h.generate_all(up.stub, requests(PROMPTS), timeout=180))
        for outcome in outcomes:
            assert outcome.finished, (name, outcome.describe())
        up.wait_idle()
        outcomes.num_kv_blocks = up.replicas()["replica-0"].num_kv_blocks
        return outcomes
    finally:
        up.stop()
        print(up.log_tail())


def logprob_rows(outcome):
    return [(o.token_id, o.logprob, [(t.token_id, t.logprob) for t in o.top_logprobs])
            for o in outcome.logprobs]


def assert_same(reference, staged, what):
    for ref, got in zip(reference, staged, strict=True):
        assert got.token_ids == ref.token_ids, (what, ref.request.text, got.text, ref.text)
        assert got.text == ref.text
        # Bit for bit: float32 values compared exactly.
        assert logprob_rows(got) == logprob_rows(ref), (what, ref.request.text)
        assert len(got.logprobs) == len(got.token_ids) > 0


@pytest.fixture(scope="module")
def binaries():
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)


def test_two_stages_serve_one_process_tokens_and_logprobs_on_the_default_model(binaries, tmp_path):
    reference = serve(tmp_path, "pp1")
    staged = serve(tmp_path, "pp2", pipeline_parallel_size=2)
    assert_same(reference, staged, "pp2")
    # Uneven stages (vLLM's VLLM_PP_LAYER_PARTITION), as a deployment balances the LM head.
    uneven = serve(tmp_path, "pp2-19-11", pipeline_parallel_size=2, pipeline_layer_partition="19,11")
    assert_same(reference, uneven, "pp2 19 + 11")
    # Each stage holds 15 of the 30 layers' KV: the same per-worker budget holds twice the blocks.
    assert 2 * reference.num_kv_blocks <= staged.num_kv_blocks <= 2 * reference.num_kv_blocks + 1, \
        (staged.num_kv_blocks, reference.num_kv_blocks)


def test_stages_of_tensor_parallel_ranks_serve_the_tensor_parallel_tokens(binaries, tmp_path):
    """PP=2 x TP=2 against TP=2 alone (the tensor-parallel partial sums round as they do without
    stages), and greedy text against one process with exact activations."""
    reference = serve(tmp_path, "tp2", tensor_parallel=2)
    staged = serve(tmp_path, "pp2tp2", tensor_parallel=2, pipeline_parallel_size=2)
    assert_same(reference, staged, "pp2 x tp2")


def random_model(tmp_path, spec):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
    import random_model as rm  # noqa: E402

    path = tmp_path / f"{spec}.gguf"
    rm.write_model(rm.SPECS[spec], path)
    return path


@pytest.mark.parametrize("spec, flags", [
    ("qwen2_mqa", {"pipeline_parallel_size": 2}),
    ("llama_swa", {"pipeline_parallel_size": 2}),
    ("llama_swa", {"pipeline_parallel_size": 3}),
    ("llama3_rope", {"pipeline_parallel_size": 2, "tensor_parallel": 2}),
], ids=["qwen2_mqa-pp2", "llama_swa-pp2", "llama_swa-pp3", "llama3_rope-pp2tp2"])
def test_random_models_across_stages(binaries, tmp_path, spec, flags):
    path = random_model(tmp_path, spec)
    reference_flags = {"tensor_parallel": flags["tensor_parallel"]} if "tensor_parallel" in flags else {}
    reference = serve(tmp_path, "reference", model=path, **reference_flags)
    staged = serve(tmp_path, "staged", model=path, **flags)
    assert_same(reference, staged, spec)


def test_more_stages_than_layers_are_refused(binaries, tmp_path):
    path = random_model(tmp_path, "qwen2_mqa")  # 2 layers
    coordinator = h.Coordinator(tmp_path, model=path, http_port=-1)
    try:
        import subprocess
        done = subprocess.run(
            [str(h.WORKER_BIN), "--model", str(path), "--coordinator", coordinator.address,
             "--world-size", "3", "--rank", "0", "--pipeline-parallel-size", "3", "--threads", "1",
             "--rendezvous-timeout-ms", "5000"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "pipeline parallel size 3 is more than the model's 2 layers" in done.stderr
    finally:
        coordinator.stop()


def test_stages_that_disagree_on_the_partition_are_refused(binaries, tmp_path):
    """Two workers given different --pipeline-layer-partition lists would compute layers 15-17
    twice: the coordinator refuses the replica and names the fix."""
    import subprocess
    coordinator = h.Coordinator(tmp_path, http_port=-1)
    stages = []
    try:
        stages = [subprocess.Popen(
            [str(h.WORKER_BIN), "--model", str(h.MODEL_PATH), "--coordinator", coordinator.address,
             "--world-size", "2", "--rank", str(rank), "--pipeline-parallel-size", "2",
             "--pipeline-layer-partition", partition, "--threads", "1", "--listen", "127.0.0.1:0",
             "--kv-cache-memory", "16MiB", "--rendezvous-timeout-ms", "20000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank, partition in ((0, "18,12"), (1, "15,15"))]
        # The rank whose registration completes the replica is refused and exits with the reason;
        # the replica never serves (the other rank, registered first, waits for a new group).
        deadline = time.monotonic() + 90
        while all(stage.poll() is None for stage in stages) and time.monotonic() < deadline:
            time.sleep(0.2)
        refused = [stage for stage in stages if stage.poll() is not None]
        assert refused, "neither stage was refused"
        _, stderr = refused[0].communicate(timeout=10)
        assert refused[0].returncode != 0
        assert "pipeline stage 1 holds layers [15, 30) but should start at layer 18" in stderr, stderr
        assert not any(r.healthy for r in coordinator.replicas().values())
    finally:
        for stage in stages:
            stage.kill()
            stage.communicate()
        coordinator.stop()


def FINISH(name):
    return h.stubs().pb.FinishReason.Value(name)


@pytest.mark.slow_machine
def test_killing_a_stage_fails_its_replica_and_its_requests_migrate(binaries, tmp_path):
    """A 2-stage replica beside a single-worker one, the coordinator with --migration-limit 1:
    SIGKILL the first stage mid-stream (the last stage is then waiting on it or about to). The
    staged replica is reported down within seconds; its streams, which had already streamed
    tokens, continue on the other replica from where they were (prompt and outputs recomputed
    there) and end with exactly the tokens an uninterrupted run gives; the surviving stage is
    not stuck in a receive: it stops on SIGTERM."""
    coordinator = h.Coordinator(tmp_path, http_port=-1, step_timeout_ms=3000, heartbeat_timeout_ms=3000,
                                migration_limit=1)
    processes = [coordinator]
    try:
        stages = [None, None]

        def start(rank):  # both at once: each waits for the other at rendezvous
            stages[rank] = h.Worker(tmp_path, coordinator.address, "pp", threads=1, world_size=2,
                                    rank=rank, pipeline_parallel_size=2, rendezvous_id="kill-test",
                                    kv_cache_memory="64MiB")

        starters = [threading.Thread(target=start, args=(r,)) for r in range(2)]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        assert all(stages), "a stage did not start"
        processes += stages
        solo = h.Worker(tmp_path, coordinator.address, "solo", threads=1, kv_cache_memory="64MiB")
        processes.append(solo)
        coordinator.wait_healthy(["pp", "solo"])

        # Greedy and seeded: a migrated seeded sequence replays its draws.
        requests = [make_request(f"{p} {i}", max_tokens=MIGRATED_TOKENS, ignore_eos=True,
                                 **({"temperature": 0.8, "seed": 5 + i} if i % 2 else {}))
                    for i, p in enumerate(PROMPTS * 2)]
        streams = [h.Stream(coordinator.stub, request, 180) for request in requests]
        for stream in streams:  # placed: the first token names the replica
            assert stream.wait_tokens(1, timeout=60), stream.outcome.describe()
        on_pp = [s for s in streams if s.outcome.replica_id == "pp"]
        assert on_pp, "no stream was placed on the pipeline-parallel replica"
        # The kill follows the pp streams' second tokens at once: waiting for every stream's
        # second token first let a loaded machine finish the pp streams before the kill, and
        # then nothing migrated.
        for stream in on_pp:
            assert stream.wait_tokens(2, timeout=60), stream.outcome.describe()
        stages[0].kill()
        assert any(len(s.outcome.token_ids) < MIGRATED_TOKENS for s in on_pp), \
            "every stream on pp had finished before the kill"
        coordinator.wait_replicas(lambda r: not r["pp"].healthy, 10, "pp reported down")
        outcomes = [stream.join(timeout=180) for stream in streams]
        for outcome in outcomes:
            assert outcome.finish_reason == FINISH("FINISH_REASON_LENGTH"), outcome.describe()
            assert len(outcome.token_ids) == MIGRATED_TOKENS, outcome.describe()
        # The migrated streams are what one uninterrupted run on the survivor gives.
        references = h.generate_all(coordinator.stub, [s.outcome.request for s in on_pp], timeout=180)
        for stream, reference in zip(on_pp, references):
            assert reference.replica_id == "solo" and reference.finished, reference.describe()
            assert stream.outcome.token_ids == reference.token_ids, stream.outcome.describe()
            assert stream.outcome.text == reference.text
        assert "requests with output migrate to other replicas" in coordinator.log_tail(10**6)
        # The last stage is not stuck waiting for the dead one's activations.
        assert stages[1].stop(timeout=15) is not None, "the last stage did not stop on SIGTERM"
    finally:
        for process in reversed(processes):
            process.stop(timeout=5)
