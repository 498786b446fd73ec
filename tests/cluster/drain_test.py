"""Scale-in drains a replica (Coordinator.Drain, called by `loom-worker` on SIGTERM): the
coordinator stops placing requests on it at once, the requests already there run to
completion on it, and then the worker exits and the replica leaves the per-replica gauges
(it is not "down"). Over real processes: a coordinator, the replica being scaled in and
another one. Nothing depends on speed: the drain is observed through the cluster state,
and the requests in flight are long enough (ignore_eos) that the drain cannot be missed
(checked)."""
import signal
import time
import urllib.request

import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

CALL_TIMEOUT_S = 300
LONG_TOKENS = 400  # in flight on the drained replica: far more than the checks take


@pytest.fixture
def binaries():
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)


def metrics(coordinator) -> str:
    with urllib.request.urlopen(f"{coordinator.http_url}/metrics", timeout=10) as response:
        return response.read().decode()


def test_sigterm_drains_the_replica_then_the_worker_exits(tmp_path, binaries):
    with h.ClusterRig(tmp_path, http_port=0) as rig:
        coordinator = rig.coordinator
        leaving = rig.add_worker("leaving", threads=1, drain_timeout_s=120)
        # Placed while it is the only replica: these run on the one being scaled in.
        streams = [h.Stream(coordinator.stub, make_request(p, max_tokens=LONG_TOKENS, ignore_eos=True),
                            CALL_TIMEOUT_S) for p in h.TEXT_PROMPTS[:2]]
        for stream in streams:
            assert stream.wait_tokens(1, timeout=120), stream.outcome.describe()
            assert stream.outcome.replica_id == "leaving"
        rig.add_worker("staying", threads=1)

        leaving.signal(signal.SIGTERM)
        coordinator.wait_replicas(lambda r: r["leaving"].draining, 30, "replica 'leaving' draining")
        in_flight = sum(not s.done() for s in streams)
        assert in_flight > 0, "the requests ended before the drain began: nothing was drained"

        # No new placement on the draining replica, though it is still healthy and idle-ish.
        assert coordinator.replicas()["leaving"].healthy, "the worker left before its requests ended"
        for prompt in h.TEXT_PROMPTS[:4]:
            outcome = h.generate(coordinator.stub, make_request(prompt, max_tokens=2), timeout=120)
            assert outcome.code == grpc.StatusCode.OK, outcome.describe()
            assert outcome.replica_id == "staying", outcome.describe()

        # The worker stays while its requests run; they all complete on it, in full.
        while not all(s.done() for s in streams):
            assert leaving.alive(), "the draining worker exited with requests in flight"
            time.sleep(0.05)
        for stream in streams:
            outcome = stream.join()
            assert outcome.finished, outcome.describe()
            assert outcome.finish_reason == h.stubs().pb.FinishReason.Value("FINISH_REASON_LENGTH")
            assert len(outcome.token_ids) == LONG_TOKENS, outcome.describe()

        # Then it goes, cleanly; the coordinator lets the replica go.
        assert leaving.wait(timeout=60) == 0, leaving.log_tail()
        assert "loom-worker: drained" in leaving.log_tail(100000), leaving.log_tail()
        replicas = coordinator.wait_replicas(lambda r: not r["leaving"].healthy, 30,
                                             "replica 'leaving' gone")
        assert replicas["leaving"].draining and replicas["staying"].healthy
        text = metrics(coordinator)
        assert 'loom_replica_up{model_name=' in text
        assert 'replica="leaving"' not in "\n".join(
            line for line in text.splitlines() if line.startswith("loom_replica_up")), text
        # Requests still go to the other replica.
        outcome = h.generate(coordinator.stub, make_request("Hello", max_tokens=2), timeout=120)
        assert outcome.code == grpc.StatusCode.OK and outcome.replica_id == "staying", outcome.describe()


def test_a_drained_replica_serves_again_when_its_worker_comes_back(tmp_path, binaries):
    """Scale-out after scale-in reuses the pod name: registering clears the drain."""
    with h.ClusterRig(tmp_path) as rig:
        coordinator = rig.coordinator
        first = rig.add_worker("r0", step_backend="noop", drain_timeout_s=30)
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, first.log_tail()
        coordinator.wait_replicas(lambda r: r["r0"].draining and not r["r0"].healthy, 30, "r0 drained")
        refused = h.generate(coordinator.stub, make_request("Hello", max_tokens=2), timeout=30)
        assert refused.code == grpc.StatusCode.UNAVAILABLE, refused.describe()
        rig.add_worker("r0", step_backend="noop")
        replicas = coordinator.wait_healthy(["r0"])
        assert not replicas["r0"].draining
        outcome = h.generate(coordinator.stub, make_request("Hello", max_tokens=2), timeout=30)
        assert outcome.code == grpc.StatusCode.OK and outcome.replica_id == "r0", outcome.describe()


def test_drain_timeout_lets_the_worker_go_with_requests_left(tmp_path, binaries):
    with h.ClusterRig(tmp_path) as rig:
        coordinator = rig.coordinator
        worker = rig.add_worker("r0", threads=1, drain_timeout_s=1)
        stream = h.Stream(coordinator.stub, make_request("Hello", max_tokens=4000, ignore_eos=True),
                          CALL_TIMEOUT_S)
        assert stream.wait_tokens(1, timeout=120), stream.outcome.describe()
        signalled = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.log_tail()
        assert "drain timed out with 1 requests left" in worker.log_tail(100000), worker.log_tail()
        outcome = stream.join(timeout=60)
        assert outcome.ended and len(outcome.token_ids) < 4000, outcome.describe()
        assert time.monotonic() - signalled < 30
