"""A client that goes away mid-generation (cancels the call, lets its deadline pass, or closes its
channel) frees its sequence: the replica's free-block count returns to its starting value within
a bounded wait, and the cluster keeps serving.
"""
import grpc
import pytest

import cluster_harness as h
from cluster_harness import make_request

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

FREE_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "cancellation"), {"replica-a": {"threads": 2}}) as rig:
        yield rig


def long_request():
    # ~155 prompt tokens (10 blocks) and far more output than the test waits for.
    return make_request(h.LONG_PARAGRAPH, max_tokens=2000, ignore_eos=True)


def assert_blocks_in_use_then_freed(coordinator, start, stop_client):
    in_use = coordinator.replicas()["replica-a"]
    assert in_use.num_free_blocks < start.num_free_blocks, f"the stream holds no blocks: {in_use}"
    stop_client()
    end = coordinator.wait_idle(timeout=FREE_TIMEOUT_S)["replica-a"]
    assert end.num_free_blocks == start.num_free_blocks, end
    assert end.num_running == 0 and end.num_waiting == 0, end


def test_cancelled_stream_frees_its_blocks(rig):
    coordinator = rig.coordinator
    start = coordinator.wait_idle()["replica-a"]
    stream = h.Stream(coordinator.stub, long_request(), timeout=120)
    assert stream.wait_tokens(5, timeout=60), stream.outcome.describe()

    def cancel():
        stream.cancel()
        outcome = stream.join()
        assert outcome.code == grpc.StatusCode.CANCELLED, outcome.describe()
    assert_blocks_in_use_then_freed(coordinator, start, cancel)


def test_expired_deadline_ends_the_call_and_frees_its_blocks(rig):
    coordinator = rig.coordinator
    start = coordinator.wait_idle()["replica-a"]
    # A short prompt, so the first tokens come well before the 5 s deadline even on a busy machine.
    stream = h.Stream(coordinator.stub, make_request(h.TEXT_PROMPTS[4], max_tokens=2000, ignore_eos=True),
                      timeout=5)
    assert stream.wait_tokens(2, timeout=4), stream.outcome.describe()

    def expire():
        outcome = stream.join(timeout=10)
        assert outcome.code == grpc.StatusCode.DEADLINE_EXCEEDED, outcome.describe()
        assert outcome.ended_at - outcome.started < 8, outcome.describe()
    assert_blocks_in_use_then_freed(coordinator, start, expire)


def test_closed_client_channel_frees_its_blocks(rig):
    coordinator = rig.coordinator
    start = coordinator.wait_idle()["replica-a"]
    channel = grpc.insecure_channel(coordinator.address)
    stub = h.stubs().grpc_pb.InferenceStub(channel)
    stream = h.Stream(stub, long_request(), timeout=120)
    assert stream.wait_tokens(5, timeout=60), stream.outcome.describe()

    def close():
        channel.close()
        outcome = stream.join(timeout=10)
        assert outcome.code != grpc.StatusCode.OK, outcome.describe()
    assert_blocks_in_use_then_freed(coordinator, start, close)


def test_many_cancelled_streams_free_everything_and_serving_continues(rig):
    coordinator = rig.coordinator
    start = coordinator.wait_idle()["replica-a"]
    streams = [h.Stream(coordinator.stub, make_request(p, max_tokens=2000, ignore_eos=True), timeout=120)
               for p in h.TEXT_PROMPTS]
    for stream in streams:
        assert stream.wait_tokens(1, timeout=60), stream.outcome.describe()

    def cancel_all():
        for stream in streams:
            stream.cancel()
        for stream in streams:
            assert stream.join().code == grpc.StatusCode.CANCELLED, stream.outcome.describe()
    assert_blocks_in_use_then_freed(coordinator, start, cancel_all)
    after = h.generate(coordinator.stub, make_request("Hello", max_tokens=8, ignore_eos=True), timeout=60)
    assert after.finished and len(after.token_ids) == 8, after.describe()
    assert coordinator.wait_idle()["replica-a"].num_free_blocks == start.num_free_blocks
