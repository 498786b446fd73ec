"""Continuous batching in the coordinator's scheduler, observed from outside: a short request
that arrives while a long one decodes joins the running batch (it finishes first), its prompt is
prefilled in chunks alongside the decode (num_mixed_steps from GetClusterState), and chunking
changes no greedy token. Priority classes: among waiting requests the lower priority value runs
first.
"""
import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

CALL_TIMEOUT_S = 120
TOKEN_BUDGET = 64  # --max-num-batched-tokens: a 155-token prompt needs at least 3 chunks


def FINISH(name):
    return h.stubs().pb.FinishReason.Value(name)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "batching"), {"replica-a": {"threads": 2}},
                           max_num_batched_tokens=TOKEN_BUDGET) as rig:
        yield rig


def test_short_request_joins_a_running_decode_and_finishes_first(rig):
    coordinator = rig.coordinator
    long = h.Stream(coordinator.stub, make_request(h.TEXT_PROMPTS[1], max_tokens=400, ignore_eos=True),
                    CALL_TIMEOUT_S)
    try:
        assert long.wait_tokens(4, timeout=60), long.outcome.describe()
        before = coordinator.replicas()["replica-a"]
        # A prompt of ~155 tokens: with a 64-token budget and one decode per step it takes at
        # least three steps, each of which also holds the long request's decode.
        short = h.generate(coordinator.stub, make_request(h.LONG_PARAGRAPH, max_tokens=8),
                           timeout=CALL_TIMEOUT_S)
        assert short.finished, short.describe()
        assert short.prompt_tokens > 2 * TOKEN_BUDGET, short.describe()
        assert not long.done(), (
            f"the long request ended before the short one: {long.outcome.describe()}")
        after = coordinator.replicas()["replica-a"]
        mixed = after.num_mixed_steps - before.num_mixed_steps
        assert mixed >= 2, (
            f"{mixed} mixed steps while a {short.prompt_tokens}-token prompt was prefilled during a "
            f"decode with a {TOKEN_BUDGET}-token budget (expected chunks alongside the decode): {after}")
        # Chunked prefill next to another sequence's decode changes no greedy token.
        reference = h.loom_generate(h.LONG_PARAGRAPH, 8, threads=1).text
        assert short.text == reference, f"\n cluster: {short.text!r}\n local:   {reference!r}"
    finally:
        long.cancel()
        long.join()
    coordinator.wait_idle()


def test_overlapping_arrivals_mix_prefill_with_decodes(rig):
    coordinator = rig.coordinator
    idle = coordinator.wait_idle()["replica-a"]
    # An anchor decodes for the whole test, so every arrival finds a running decode however
    # slowly this client sees tokens (a fast engine can finish a short request before a
    # loaded client notices its second token).
    # Its deadline is no limit on model speed: it is cancelled once the four are done.
    anchor = h.Stream(coordinator.stub, make_request(h.TEXT_PROMPTS[1], max_tokens=4000, ignore_eos=True),
                      5 * CALL_TIMEOUT_S)
    try:
        assert anchor.wait_tokens(2, timeout=60), anchor.outcome.describe()
        before = coordinator.replicas()["replica-a"]
        streams = []
        for prompt in h.TEXT_PROMPTS[4:8]:
            streams.append(h.Stream(coordinator.stub, make_request(prompt, max_tokens=24, ignore_eos=True),
                                    CALL_TIMEOUT_S))
            streams[-1].wait_tokens(2, timeout=60)  # the next prompt arrives during this one's decode
        outcomes = [s.join() for s in streams]
        for outcome in outcomes:
            assert outcome.finished and len(outcome.token_ids) == 24, outcome.describe()
        after = coordinator.replicas()["replica-a"]
        assert not anchor.done(), f"the anchor ended early: {anchor.outcome.describe()}"
    finally:
        anchor.cancel()
        anchor.join()
    # Each arrival's first prompt chunk is admitted into a step that holds the anchor's decode.
    mixed = after.num_mixed_steps - before.num_mixed_steps
    assert mixed >= len(outcomes), f"{mixed} mixed steps for {len(outcomes)} arrivals: {after}"
    # Every step of the window carries the anchor's decode. When the four requests' 4 x 23
    # decodes (their first token comes from the prefill) share those steps, the window computes
    # at least that many tokens more than it has steps; one sequence per step would not.
    steps = after.num_steps - before.num_steps
    tokens = after.num_tokens_computed - before.num_tokens_computed
    assert tokens - steps >= 4 * 23, (
        f"{tokens} tokens in {steps} steps for 4 overlapping requests of 24 tokens beside a "
        "running decode: the decodes did not share steps")
    assert coordinator.wait_idle()["replica-a"].num_free_blocks == idle.num_free_blocks


# The priority test runs on the no-op backend with a fixed step time: it is about the
# coordinator's queue, not the model, and a sleep per step bounds how fast the running request
# can go (below).
PRIORITY_STEP_MS = 20
PRIORITY_RUNNING_TOKENS = 4000  # >= 4000 x 20 ms = 80 s of sleeps; cancelled long before


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    workers = {"replica-a": {"backend": "noop", "threads": 1, "kv_cache_memory": "1GiB",
                             "debug_step_delay_ms": PRIORITY_STEP_MS}}
    with h.running_cluster(tmp_path_factory.mktemp("priority"), workers, max_num_seqs=1) as rig:
        yield rig


def test_lower_priority_value_runs_first_among_waiting_requests(one_at_a_time):
    # Independent of this machine's speed: every step of the running request sleeps
    # PRIORITY_STEP_MS first, so it cannot end before 80 s whatever the CPU (a slower machine
    # only lengthens it), and the test cancels it as soon as the state shows both others
    # queued. Arrival order is observed too (the second request is sent only once the first is
    # counted as waiting), not assumed from a sleep.
    coordinator = one_at_a_time.coordinator
    running = h.Stream(coordinator.stub, make_request(h.TEXT_PROMPTS[1], max_tokens=PRIORITY_RUNNING_TOKENS,
                                                      ignore_eos=True), CALL_TIMEOUT_S)
    assert running.wait_tokens(2, timeout=60), running.outcome.describe()

    def waiting():
        return coordinator.replicas()["replica-a"].num_waiting

    # Both wait behind the running one (--max-num-seqs 1); the later but more urgent one goes first.
    background = h.Stream(coordinator.stub, make_request(h.TEXT_PROMPTS[3], max_tokens=8, priority=5),
                          CALL_TIMEOUT_S)
    assert h.wait_until(lambda: waiting() == 1, 30), "the first request should be waiting"
    urgent = h.Stream(coordinator.stub, make_request(h.TEXT_PROMPTS[2], max_tokens=8, priority=0),
                      CALL_TIMEOUT_S)
    assert h.wait_until(lambda: waiting() == 2, 30), "both requests should be waiting behind the running one"
    assert not running.done(), f"the running request ended early: {running.outcome.describe()}"
    running.cancel()  # frees the only slot: the two waiting requests are scheduled by priority
    assert running.join().code == grpc.StatusCode.CANCELLED, running.outcome.describe()
    background_out, urgent_out = background.join(), urgent.join()
    for outcome in (background_out, urgent_out):
        assert outcome.finished and len(outcome.token_ids) == 8, outcome.describe()
    assert urgent_out.first_token_at < background_out.first_token_at, (
        "priority 0 (sent later) started after priority 5: "
        f"{urgent_out.first_token_at - background_out.first_token_at:+.3f} s")
    coordinator.wait_idle()
