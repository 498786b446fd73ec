"""Serving many requests from one coordinator (`loom serve`) and two single-worker replicas on
the default model, over real processes on loopback.

* 32 concurrent requests of different prompt lengths and sampling settings all finish with a
  finish reason; greedy text equals `loom generate`'s (batching across sequences and replicas
  changes nothing); a seeded sampled request is reproducible; both replicas got work; every KV
  block is free again afterwards.
* Stop strings end the text before the match (finish STOP); max_tokens ends it with LENGTH.
"""
import concurrent.futures

import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

REPLICAS = ("replica-a", "replica-b")
CALL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "serving"),
                           {replica: {"threads": 1} for replica in REPLICAS}) as rig:
        yield rig


@pytest.fixture(scope="module")
def references():
    """(prompt, max_tokens) -> `loom generate`'s greedy continuation, memoized."""
    cache = {}

    def get_all(keys):
        todo = [k for k in dict.fromkeys(keys) if k not in cache]
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for key, result in zip(todo, pool.map(lambda k: h.loom_generate(k[0], k[1], threads=1), todo)):
                cache[key] = result.text
        return [cache[k] for k in keys]
    return get_all


def FINISH(name):
    return h.stubs().pb.FinishReason.Value(name)


def assert_well_formed(outcome, max_tokens):
    """A completed call: status OK, a finish reason, token counts that add up."""
    assert outcome.finished, outcome.describe()
    assert outcome.finish_reason in (FINISH("FINISH_REASON_STOP"), FINISH("FINISH_REASON_LENGTH")), \
        outcome.describe()
    assert outcome.completion_tokens == len(outcome.token_ids), outcome.describe()
    assert outcome.prompt_tokens > 0, outcome.describe()
    if outcome.finish_reason == FINISH("FINISH_REASON_LENGTH"):
        assert len(outcome.token_ids) == max_tokens, outcome.describe()
    else:
        assert 0 < len(outcome.token_ids) <= max_tokens, outcome.describe()


def test_32_concurrent_requests_complete_and_greedy_text_equals_loom_generate(rig, references):
    coordinator = rig.coordinator
    start = coordinator.replicas()
    assert set(start) == set(REPLICAS), start

    # 16 greedy requests (each of the 8 prompts twice) and 16 sampled ones (temperature and
    # top_p, seeded; the first sampled request is repeated as the last, same seed).
    requests, greedy_keys = [], []
    for i in range(16):
        prompt = h.TEXT_PROMPTS[i % 8]
        max_tokens = (16, 24, 32)[(i % 8) % 3]
        requests.append(make_request(prompt, max_tokens=max_tokens))
        greedy_keys.append((prompt, max_tokens))
    sampled = []
    for i in range(15):
        prompt, max_tokens = greedy_keys[i % 8]
        sampled.append(make_request(prompt, max_tokens=max_tokens, temperature=0.9, top_p=0.9,
                                    seed=1000 + i))
    sampled.append(make_request(greedy_keys[0][0], max_tokens=greedy_keys[0][1], temperature=0.9,
                                top_p=0.9, seed=1000))
    requests += sampled

    outcomes = h.generate_all(coordinator.stub, requests, timeout=CALL_TIMEOUT_S)
    for outcome in outcomes:
        assert_well_formed(outcome, outcome.request.max_tokens)

    expected = references(greedy_keys)
    for outcome, (prompt, max_tokens), text in zip(outcomes[:16], greedy_keys, expected):
        assert outcome.text == text, (
            f"greedy output differs from loom generate for {prompt[:40]!r} (max_tokens {max_tokens}) "
            f"on {outcome.replica_id}:\n cluster: {outcome.text!r}\n local:   {text!r}")

    sampled_outcomes = outcomes[16:]
    assert sampled_outcomes[0].text == sampled_outcomes[-1].text, (
        "the same seeded request gave two different texts: "
        f"{sampled_outcomes[0].text!r} on {sampled_outcomes[0].replica_id} vs "
        f"{sampled_outcomes[-1].text!r} on {sampled_outcomes[-1].replica_id}")
    differing = sum(o.text != expected[i % 8] for i, o in enumerate(sampled_outcomes[:15]))
    assert differing > 0, "temperature 0.9 produced exactly the greedy text for all 15 sampled requests"

    served_by = {o.replica_id for o in outcomes}
    assert served_by == set(REPLICAS), f"requests ran on {served_by}, expected both replicas"

    end = coordinator.wait_idle()
    for replica in REPLICAS:
        assert end[replica].healthy
        assert end[replica].num_free_blocks == start[replica].num_free_blocks, end[replica]
        assert end[replica].num_kv_blocks == start[replica].num_kv_blocks, end[replica]
        assert end[replica].num_steps > start[replica].num_steps, end[replica]
        assert end[replica].num_tokens_computed > start[replica].num_tokens_computed, end[replica]


def test_stop_string_ends_text_before_the_match(rig, references):
    prompt = h.TEXT_PROMPTS[1]
    (full,) = references([(prompt, 32)])
    # A stop string from the middle of the greedy text: the output is everything before its
    # first occurrence, and the match itself is not returned.
    stop = full[len(full) // 2:len(full) // 2 + 4]
    assert stop.strip(), f"the reference text {full!r} has no usable middle"
    outcome = h.generate(rig.coordinator.stub, make_request(prompt, max_tokens=32, stop=[stop]),
                         timeout=CALL_TIMEOUT_S)
    assert outcome.finished, outcome.describe()
    assert outcome.finish_reason == FINISH("FINISH_REASON_STOP"), outcome.describe()
    assert outcome.text == full[:full.index(stop)], f"stop {stop!r} in {full!r}: {outcome.describe()}"


def test_stop_token_id_ends_generation(rig):
    prompt = h.TEXT_PROMPTS[2]
    free = h.generate(rig.coordinator.stub, make_request(prompt, max_tokens=16, ignore_eos=True),
                      timeout=CALL_TIMEOUT_S)
    assert free.finished and len(free.token_ids) == 16, free.describe()
    stop_id = free.token_ids[6]
    first = free.token_ids.index(stop_id)
    outcome = h.generate(rig.coordinator.stub,
                         make_request(prompt, max_tokens=16, ignore_eos=True, stop_token_ids=[stop_id]),
                         timeout=CALL_TIMEOUT_S)
    assert outcome.finished, outcome.describe()
    assert outcome.finish_reason == FINISH("FINISH_REASON_STOP"), outcome.describe()
    # The tokens before the stop token are the same; the stop token may or may not be reported.
    assert outcome.token_ids[:first] == free.token_ids[:first], outcome.describe()
    assert len(outcome.token_ids) in (first, first + 1), outcome.describe()


def test_max_tokens_ends_with_length_and_ignore_eos_runs_to_it(rig):
    outcomes = h.generate_all(rig.coordinator.stub,
                              [make_request(p, max_tokens=n, ignore_eos=True)
                               for p, n in ((h.TEXT_PROMPTS[0], 1), (h.TEXT_PROMPTS[3], 7),
                                            (h.TEXT_PROMPTS[6], 20))],
                              timeout=CALL_TIMEOUT_S)
    for outcome, n in zip(outcomes, (1, 7, 20)):
        assert outcome.finished, outcome.describe()
        assert outcome.finish_reason == FINISH("FINISH_REASON_LENGTH"), outcome.describe()
        assert outcome.completion_tokens == n == len(outcome.token_ids), outcome.describe()
    rig.coordinator.wait_idle()


def test_token_id_prompt_equals_text_prompt(rig):
    """A prompt given as token ids generates the same as the text that tokenizes to them."""
    text = h.generate(rig.coordinator.stub, make_request(h.TEXT_PROMPTS[4], max_tokens=12),
                      timeout=CALL_TIMEOUT_S)
    assert text.finished, text.describe()
    ids = h.tokenize(h.TEXT_PROMPTS[4])
    assert len(ids) == text.prompt_tokens, (ids, text.describe())
    by_ids = h.generate(rig.coordinator.stub, make_request(token_ids=ids, max_tokens=12),
                        timeout=CALL_TIMEOUT_S)
    assert by_ids.finished, by_ids.describe()
    assert by_ids.token_ids == text.token_ids and by_ids.text == text.text, by_ids.describe()
    assert grpc.StatusCode.OK == by_ids.code


@pytest.mark.slow_machine
def test_every_call_of_mixed_traffic_ends_with_tokens_or_a_status(rig):
    """Valid, invalid, cancelled and deadline-bound calls side by side: each one ends (a finish
    reason with its tokens, or a gRPC status), nothing hangs, and every block comes back."""
    coordinator = rig.coordinator
    start = coordinator.wait_idle()
    kinds, streams = [], []
    for i in range(24):
        kind = ("ok", "invalid", "cancel", "deadline")[i % 4]
        if kind == "invalid":
            request = make_request(token_ids=[504, 10**6])
        elif kind == "ok":
            request = make_request(h.TEXT_PROMPTS[i % 8], max_tokens=12, temperature=0.7, seed=i)
        else:
            request = make_request(h.TEXT_PROMPTS[i % 8], max_tokens=2000, ignore_eos=True)
        kinds.append(kind)
        streams.append(h.Stream(coordinator.stub, request, timeout=4 if kind == "deadline" else CALL_TIMEOUT_S))
    for kind, stream in zip(kinds, streams):
        if kind == "cancel":
            stream.wait_tokens(1, timeout=60)
            stream.cancel()
    for kind, stream in zip(kinds, streams):
        outcome = stream.join()
        assert outcome.ended, outcome.describe()
        expected = {"ok": grpc.StatusCode.OK, "invalid": grpc.StatusCode.INVALID_ARGUMENT,
                    "cancel": grpc.StatusCode.CANCELLED, "deadline": grpc.StatusCode.DEADLINE_EXCEEDED}[kind]
        assert outcome.code == expected, f"{kind}: {outcome.describe()}"
        if kind == "ok":
            assert_well_formed(outcome, 12)
    end = coordinator.wait_idle()
    for replica in REPLICAS:
        assert end[replica].num_free_blocks == start[replica].num_free_blocks, end[replica]


def test_loom_up_reads_its_config_file_and_its_workers_do_not(tmp_path, monkeypatch):
    # LOOM_CONFIG names a file of serve and worker flags: `loom up` takes both and passes the
    # worker flags on its workers' command lines; the workers must not read the file
    # themselves (a serve flag there is no worker flag: they would refuse to start).
    config = tmp_path / "up.yaml"
    config.write_text("max-num-seqs: 3\nblock-size: 32\n")
    monkeypatch.setenv("LOOM_CONFIG", str(config))
    up = h.Up(tmp_path, threads=1, kv_cache_memory="64MiB", http_port=-1)
    try:
        up.wait_healthy(["replica-0"])
        outcome = h.generate_all(up.stub, [make_request("Hello", max_tokens=4, ignore_eos=True)], timeout=60)[0]
        assert outcome.finished and len(outcome.token_ids) == 4, outcome.describe()
        assert up.replicas()["replica-0"].block_size == 32  # the file's worker flag arrived
    finally:
        up.stop()
