"""Worker failures with requests in flight, on a coordinator with two single-worker replicas.

* SIGKILL: the dead worker's requests end promptly (FINISH_REASON_ERROR, or complete elsewhere),
  the replica is reported unhealthy, new requests complete on the other replica, and a worker
  restarted with the same --replica-id registers again and serves.
* SIGSTOP (a stopped worker goes silent: --heartbeat-timeout-ms 2000): the same outcome as
  death, within the timeout; resumed, the worker is told to register again and the replica
  serves once more. --step-timeout-ms 2000 is the no-progress timeout: a slow machine's
  long first prefill reports progress and is never cut off by it (see liveness_test.py).
* The only replica dies: in-flight requests end, new ones are refused with UNAVAILABLE at once.
"""
import signal
import time

import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

REPLICAS = ("replica-a", "replica-b")
TIMEOUT_FLAGS = {"step_timeout_ms": 2000, "heartbeat_timeout_ms": 2000}
MAX_TOKENS = 200
CALL_TIMEOUT_S = 150


def FINISH(name):
    return h.stubs().pb.FinishReason.Value(name)


@pytest.fixture
def rig(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    with h.running_cluster(tmp_path, {r: {"threads": 1} for r in REPLICAS}, **TIMEOUT_FLAGS) as rig:
        yield rig


def start_streams_on_both_replicas(rig, n=8):
    """n long streams, each past its first tokens, placed on both replicas."""
    streams = [h.Stream(rig.coordinator.stub,
                        make_request(h.TEXT_PROMPTS[i % len(h.TEXT_PROMPTS)], max_tokens=MAX_TOKENS,
                                     ignore_eos=True), CALL_TIMEOUT_S)
               for i in range(n)]
    for stream in streams:
        assert stream.wait_tokens(2, timeout=60), stream.outcome.describe()
    placed = {s.outcome.replica_id for s in streams}
    assert placed == set(REPLICAS), f"streams placed on {placed}: least-loaded placement should use both"
    return streams


def check_failover(rig, streams, victim, failed_at, end_within_s):
    """The victim's streams end within end_within_s of the failure, with an error finish (or
    complete, retried elsewhere); the others complete; the victim is unhealthy; new requests
    complete on the survivor."""
    survivor = next(r for r in REPLICAS if r != victim)
    for stream in streams:
        if stream.outcome.replica_id != victim:
            continue
        outcome = stream.join(timeout=end_within_s + 5)
        assert outcome.code == grpc.StatusCode.OK and outcome.finish_reason, (
            f"a request in flight on the failed worker should end with a finish reason: {outcome.describe()}")
        if outcome.finish_reason == FINISH("FINISH_REASON_ERROR"):
            assert outcome.error_message, outcome.describe()
            assert outcome.ended_at - failed_at < end_within_s, (
                f"ended {outcome.ended_at - failed_at:.1f}s after the failure: {outcome.describe()}")
        else:
            assert outcome.finish_reason == FINISH("FINISH_REASON_LENGTH"), outcome.describe()
            assert len(outcome.token_ids) == MAX_TOKENS, outcome.describe()

    status = rig.coordinator.wait_replicas(lambda r: not r[victim].healthy, end_within_s,
                                           f"{victim} reported unhealthy")
    assert status[survivor].healthy, status

    fresh = h.generate_all(rig.coordinator.stub,
                           [make_request(p, max_tokens=8, ignore_eos=True) for p in h.TEXT_PROMPTS[:4]],
                           timeout=60)
    for outcome in fresh:
        assert outcome.finished and len(outcome.token_ids) == 8, outcome.describe()
        assert outcome.replica_id == survivor, outcome.describe()

    for stream in streams:
        if stream.outcome.replica_id == survivor:
            outcome = stream.join()
            assert outcome.finished and outcome.finish_reason == FINISH("FINISH_REASON_LENGTH"), \
                outcome.describe()
            assert len(outcome.token_ids) == MAX_TOKENS, outcome.describe()
    end = rig.coordinator.wait_idle()
    assert end[survivor].num_free_blocks == end[survivor].num_kv_blocks, end[survivor]


def test_killed_worker_fails_its_requests_and_a_restarted_one_serves_again(rig):
    streams = start_streams_on_both_replicas(rig)
    victim = rig.workers["replica-a"]
    killed_at = time.monotonic()
    victim.kill()
    check_failover(rig, streams, "replica-a", killed_at, end_within_s=5)

    rig.add_worker("replica-a", threads=1)  # waits until the coordinator reports it healthy
    status = rig.coordinator.replicas()["replica-a"]
    assert status.healthy and status.num_free_blocks == status.num_kv_blocks, status
    outcomes = h.generate_all(rig.coordinator.stub,
                              [make_request(p, max_tokens=8, ignore_eos=True) for p in h.TEXT_PROMPTS[:6]],
                              timeout=60)
    for outcome in outcomes:
        assert outcome.finished and len(outcome.token_ids) == 8, outcome.describe()
    assert "replica-a" in {o.replica_id for o in outcomes}, \
        f"the restarted replica got none of 6 concurrent requests: {[o.replica_id for o in outcomes]}"
    end = rig.coordinator.wait_idle()
    assert all(s.healthy and s.num_free_blocks == s.num_kv_blocks for s in end.values()), end


def test_hung_worker_is_treated_as_dead(rig):
    streams = start_streams_on_both_replicas(rig)
    victim = rig.workers["replica-a"]
    stopped_at = time.monotonic()
    victim.signal(signal.SIGSTOP)
    try:
        # The heartbeat timeout is 2 s: allow it plus detection and teardown.
        check_failover(rig, streams, "replica-a", stopped_at, end_within_s=8)
    finally:
        victim.signal(signal.SIGCONT)
    # Resumed, it heartbeats again: the coordinator tells it to register again, and the replica
    # serves once more with every block free.
    status = rig.coordinator.wait_replicas(lambda r: r["replica-a"].healthy, 30, "replica-a serving again")
    assert status["replica-a"].num_free_blocks == status["replica-a"].num_kv_blocks, status
    assert "registering again" in victim.log_tail(20000), victim.log_tail()


@pytest.fixture
def single(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    with h.running_cluster(tmp_path, {"replica-a": {"threads": 2}}, **TIMEOUT_FLAGS) as rig:
        yield rig


def test_no_replica_left_refuses_new_requests_at_once(single):
    stream = h.Stream(single.coordinator.stub, make_request("Hello", max_tokens=MAX_TOKENS, ignore_eos=True),
                      CALL_TIMEOUT_S)
    assert stream.wait_tokens(2, timeout=60), stream.outcome.describe()
    killed_at = time.monotonic()
    single.workers["replica-a"].kill()
    outcome = stream.join(timeout=10)
    assert outcome.code == grpc.StatusCode.OK, outcome.describe()
    assert outcome.finish_reason == FINISH("FINISH_REASON_ERROR"), outcome.describe()
    assert outcome.ended_at - killed_at < 5, outcome.describe()
    single.coordinator.wait_replicas(lambda r: not r["replica-a"].healthy, 5, "replica-a unhealthy")
    refused = h.generate(single.coordinator.stub, make_request("Hello", max_tokens=8), timeout=10)
    assert refused.code == grpc.StatusCode.UNAVAILABLE, refused.describe()
    assert refused.details and refused.ended_at - refused.started < 5, refused.describe()


@pytest.fixture
def one_seq_each(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    # Round-robin placement, so each replica gets exactly one waiting request (the prefix-aware
    # and least-loaded routers weigh tokens and may queue both behind the lighter replica).
    with h.running_cluster(tmp_path, {r: {"threads": 1} for r in REPLICAS}, max_num_seqs=1,
                           routing="round-robin", **TIMEOUT_FLAGS) as rig:
        yield rig


def test_waiting_requests_of_a_dead_replica_run_on_another(one_seq_each):
    """A request that has produced no output when its worker dies is placed again elsewhere."""
    coordinator = one_seq_each.coordinator
    running = []
    for prompt in h.TEXT_PROMPTS[1:3]:  # one running request per replica (--max-num-seqs 1)
        running.append(h.Stream(coordinator.stub, make_request(prompt, max_tokens=MAX_TOKENS, ignore_eos=True),
                                CALL_TIMEOUT_S))
        assert running[-1].wait_tokens(2, timeout=60), running[-1].outcome.describe()
    assert {s.outcome.replica_id for s in running} == set(REPLICAS), [s.outcome.describe() for s in running]
    waiting = [h.Stream(coordinator.stub, make_request(p, max_tokens=8, ignore_eos=True), CALL_TIMEOUT_S)
               for p in h.TEXT_PROMPTS[3:5]]
    coordinator.wait_replicas(lambda r: all(r[i].num_waiting == 1 for i in REPLICAS), 10,
                              "one request waiting on each replica")
    victim_stream = next(s for s in running if s.outcome.replica_id == "replica-a")
    one_seq_each.workers["replica-a"].kill()

    failed = victim_stream.join(timeout=10)
    assert failed.code == grpc.StatusCode.OK and failed.finish_reason == FINISH("FINISH_REASON_ERROR"), \
        failed.describe()
    for stream in waiting:
        outcome = stream.join(timeout=90)
        assert outcome.finished and len(outcome.token_ids) == 8, outcome.describe()
        assert outcome.replica_id == "replica-b", outcome.describe()
    survivor = next(s for s in running if s.outcome.replica_id == "replica-b").join()
    assert survivor.finished and len(survivor.token_ids) == MAX_TOKENS, survivor.describe()
    end = coordinator.wait_idle()
    assert not end["replica-a"].healthy and end["replica-b"].num_free_blocks == end["replica-b"].num_kv_blocks, end
