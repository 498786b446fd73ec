"""Stopping the cluster: the coordinator drains on SIGTERM (in-flight requests complete, new ones
get UNAVAILABLE, exit status 0), gives up on what is left at --drain-timeout-s, and `loom up`
stops its worker children on SIGTERM and on SIGINT (Ctrl-C). A worker's own SIGTERM drains
its replica first (tests/cluster/drain_test.py) unless --drain-timeout-s is 0.
"""
import signal
import time

import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

CALL_TIMEOUT_S = 120


def FINISH(name):
    return h.stubs().pb.FinishReason.Value(name)


@pytest.fixture
def binaries():
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)


def refused_while_draining(stub, timeout_s=10):
    """Sends small requests until one is refused; the refusal (an Outcome), or None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcome = h.generate(stub, make_request("Hello", max_tokens=2), timeout=10)
        if outcome.code != grpc.StatusCode.OK:
            return outcome
        time.sleep(0.02)  # the signal has not been handled yet
    return None


def test_sigterm_drains_in_flight_requests_and_refuses_new_ones(tmp_path, binaries):
    with h.running_cluster(tmp_path, {"replica-a": {"threads": 2}}) as rig:
        coordinator = rig.coordinator
        streams = [h.Stream(coordinator.stub, make_request(p, max_tokens=64, ignore_eos=True), CALL_TIMEOUT_S)
                   for p in h.TEXT_PROMPTS[:4]]
        for stream in streams:
            assert stream.wait_tokens(1, timeout=60), stream.outcome.describe()
        coordinator.signal(signal.SIGTERM)
        refused = refused_while_draining(coordinator.stub)
        assert refused is not None, "requests were still accepted 10 s after SIGTERM"
        assert refused.code == grpc.StatusCode.UNAVAILABLE, refused.describe()
        still_running = sum(not s.done() for s in streams)
        for stream in streams:
            outcome = stream.join()
            assert outcome.finished, f"an in-flight request did not drain: {outcome.describe()}"
            assert outcome.finish_reason == FINISH("FINISH_REASON_LENGTH"), outcome.describe()
            assert len(outcome.token_ids) == 64, outcome.describe()
        rc = coordinator.wait(timeout=30)
        assert rc == 0, f"coordinator exit status {rc} after draining\n{coordinator.log_tail()}"
        assert still_running > 0, "every request had finished before the first refusal: drain untested"


def test_drain_timeout_ends_what_is_left_and_exits(tmp_path, binaries):
    with h.running_cluster(tmp_path, {"replica-a": {"threads": 2}}, drain_timeout_s=1) as rig:
        coordinator = rig.coordinator
        stream = h.Stream(coordinator.stub, make_request("Hello", max_tokens=4000, ignore_eos=True),
                          CALL_TIMEOUT_S)
        assert stream.wait_tokens(2, timeout=60), stream.outcome.describe()
        signalled_at = time.monotonic()
        coordinator.signal(signal.SIGTERM)
        rc = coordinator.wait(timeout=20)
        assert rc == 0, f"exit status {rc} ({time.monotonic() - signalled_at:.1f} s after SIGTERM)\n" \
                        f"{coordinator.log_tail()}"
        outcome = stream.join(timeout=10)
        # Cut off: an abort finish, or the call fails as the server goes away; never a hang.
        assert outcome.ended, outcome.describe()
        assert (outcome.code == grpc.StatusCode.OK and outcome.finish_reason == FINISH("FINISH_REASON_ABORT")) \
            or outcome.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                grpc.StatusCode.ABORTED), outcome.describe()
        assert len(outcome.token_ids) < 4000, outcome.describe()
        assert outcome.ended_at - signalled_at < 15, outcome.describe()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_loom_up_serves_and_stops_its_workers(tmp_path, binaries, stop_signal):
    up = h.Up(tmp_path, replicas=2, threads=1)
    try:
        up.wait_for_line(r"loom: ready \(2 replicas\)", h.REGISTER_TIMEOUT_S)
        children = up.children()
        assert len(children) == 2, f"loom up should run 2 worker children, has {children}"
        for pid in children:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            assert "loom-worker" in cmdline, cmdline
        status = up.replicas()
        assert len(status) == 2 and all(r.healthy for r in status.values()), status

        done = h.generate(up.stub, make_request(h.TEXT_PROMPTS[1], max_tokens=8), timeout=60)
        assert done.finished, done.describe()
        in_flight = h.Stream(up.stub, make_request(h.TEXT_PROMPTS[2], max_tokens=48, ignore_eos=True),
                             CALL_TIMEOUT_S)
        assert in_flight.wait_tokens(1, timeout=60), in_flight.outcome.describe()

        up.signal(stop_signal)
        outcome = in_flight.join()
        assert outcome.finished and len(outcome.token_ids) == 48, \
            f"the in-flight request did not drain: {outcome.describe()}"
        rc = up.wait(timeout=30)
        assert rc == 0, f"loom up exit status {rc}\n{up.log_tail()}"
        gone = h.wait_until(lambda: not any(h.pid_alive(pid) for pid in children), timeout=10)
        assert gone, f"worker children still alive after loom up exited: " \
                     f"{[pid for pid in children if h.pid_alive(pid)]}"
    finally:
        up.stop(timeout=5)
        print(up.log_tail())


def test_worker_sigterm_without_drain_exits_zero_and_its_replica_goes_down(tmp_path, binaries):
    """--drain-timeout-s 0: the worker stops at once (the drain itself: drain_test.py)."""
    with h.running_cluster(tmp_path, {"replica-a": {"threads": 2, "drain_timeout_s": 0}}) as rig:
        coordinator, worker = rig.coordinator, rig.workers["replica-a"]
        stream = h.Stream(coordinator.stub, make_request("Hello", max_tokens=2000, ignore_eos=True),
                          CALL_TIMEOUT_S)
        assert stream.wait_tokens(2, timeout=60), stream.outcome.describe()
        signalled_at = time.monotonic()
        worker.signal(signal.SIGTERM)
        rc = worker.wait(timeout=15)
        assert rc == 0, f"worker exit status {rc} after SIGTERM\n{worker.log_tail()}"
        # The request it was running ends (an error finish or a status), never hangs.
        outcome = stream.join(timeout=15)
        assert outcome.ended and outcome.finish_reason != FINISH("FINISH_REASON_LENGTH"), outcome.describe()
        assert outcome.finish_reason == FINISH("FINISH_REASON_ERROR") or outcome.code != grpc.StatusCode.OK, \
            outcome.describe()
        assert outcome.ended_at - signalled_at < 15, outcome.describe()
        coordinator.wait_replicas(lambda r: not r["replica-a"].healthy, 10, "replica-a unhealthy")
        refused = h.generate(coordinator.stub, make_request("Hello", max_tokens=4), timeout=10)
        assert refused.code == grpc.StatusCode.UNAVAILABLE, refused.describe()
