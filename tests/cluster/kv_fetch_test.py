"""Cross-replica prefix fetch over real processes: two replicas, each worker with a host KV tier,
requests placed round-robin. The second of two prompts sharing a 16-block prefix lands on the
replica that does not hold it; instead of recomputing, that replica has its worker pull the
blocks from the other worker's host tier (Worker.FetchKvBlocks over gRPC) and reloads them. The
tokens equal those of the same request with fetching off (--kv-fetch-min-blocks 0), and the
request reports the prefix as cached. Killing the source worker while the fetch waits for it (its
steps slowed with --debug-step-delay-ms) fails the fetch, counted and logged, and the request
completes by recomputing, with the same tokens; no block stays held on the surviving replica.

With the workers' pools in shared memory (--kv-pool-shared-memory) the same fetch copies the
blocks straight out of the other worker's pool into this one's (pool-to-pool: no host tier on
either side, nothing reloaded), with the same tokens; and the source killed while the fetch
waits for it fails it the same way, leaking no block.
"""
import re
import time
import urllib.request

import pytest

import cluster_harness as h
from cluster_harness import make_request

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

PREFIX = "Document: " + " ".join(
    f"{word}{i % 7}" for i, word in enumerate(("river stone garden lantern harbor meadow copper violet "
                                                "signal orchard canyon willow ") .split() * 18)) + "\n"
MAX_TOKENS = 6
TIER = {"threads": 1, "kv_offload_memory": "32MiB", "kv_cache_memory": "24MiB"}
POOL = {"threads": 1, "kv_cache_memory": "24MiB", "kv_pool_shared_memory": "on"}  # no host tier


def first_request():
    return make_request(PREFIX + "Question: what is the first word?\nAnswer:", max_tokens=MAX_TOKENS,
                        ignore_eos=True)


def second_request():
    return make_request(PREFIX + "Question: name a metal in it.\nAnswer:", max_tokens=MAX_TOKENS,
                        ignore_eos=True)


@pytest.fixture(scope="module")
def binaries():
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)


def one(rig, request):
    [outcome] = h.generate_all(rig.coordinator.stub, [request], timeout=180)
    assert outcome.finished, outcome.describe()
    return outcome


def both_requests(rig, reference):
    """The first request, then the second on the other replica, with the reference's tokens."""
    first = one(rig, first_request())
    second = one(rig, second_request())
    assert first.replica_id != second.replica_id
    assert second.token_ids == reference.token_ids, (second.text, reference.text)
    return first, second


def recomputed_after_the_source_dies(rig, stream, reference):
    """replica-a killed while `stream`'s request, placed on replica-b, waits for its prefix: the
    fetch fails (counted and logged), the request recomputes it with the reference's tokens, and
    replica-b holds no block afterwards."""
    time.sleep(0.5)
    rig.workers["replica-a"].kill()
    second = stream.join(timeout=180)
    assert second.finished, second.describe()
    assert second.replica_id == "replica-b"
    assert second.token_ids == reference.token_ids
    status = rig.coordinator.wait_idle(timeout=30)["replica-b"]
    assert status.num_kv_fetch_failures == 1, status
    assert status.num_kv_fetches == 0
    assert status.num_free_blocks == status.num_kv_blocks
    assert "fetching a prefix from replica replica-a failed, recomputing it" in \
        rig.coordinator.log_tail(20000)


@pytest.fixture(scope="module")
def reference(binaries, tmp_path_factory):
    """The second request's tokens on a cluster that never fetches."""
    with h.running_cluster(tmp_path_factory.mktemp("no-fetch"), {"replica-a": TIER, "replica-b": TIER},
                           routing="round-robin", kv_fetch_min_blocks=0) as rig:
        first = one(rig, first_request())
        second = one(rig, second_request())
        assert first.replica_id != second.replica_id
        status = rig.coordinator.replicas()
        assert all(s.num_kv_fetches == 0 for s in status.values())
        return second


def test_a_prefix_another_replica_holds_is_fetched_instead_of_recomputed(binaries, reference, tmp_path):
    with h.running_cluster(tmp_path, {"replica-a": TIER, "replica-b": TIER}, routing="round-robin") as rig:
        first, second = both_requests(rig, reference)
        status = rig.coordinator.replicas()
        fetcher = status[second.replica_id]
        assert fetcher.num_kv_fetches == 1, fetcher
        assert fetcher.num_kv_fetch_failures == 0
        assert fetcher.num_kv_fetched_blocks >= 12, fetcher
        assert fetcher.num_kv_blocks_reloaded >= 12, fetcher
        assert fetcher.num_host_hit_tokens >= 12 * 16, fetcher
        assert status[first.replica_id].num_kv_fetches == 0
        rig.coordinator.wait_idle()
        metrics = urllib.request.urlopen(rig.coordinator.http_url + "/metrics", timeout=10).read().decode()
        assert f'loom_kv_fetches_total{{model_name="SmolLM2-135M-Instruct.Q4_1",replica="{second.replica_id}"}} 1' \
            in metrics, [line for line in metrics.splitlines() if "fetch" in line]


def test_killing_the_source_mid_fetch_recomputes_and_leaks_nothing(binaries, reference, tmp_path):
    slow = dict(TIER, debug_step_delay_ms=1500)
    with h.running_cluster(tmp_path, {"replica-a": slow, "replica-b": TIER}, routing="round-robin",
                           heartbeat_timeout_ms=1000) as rig:
        first = one(rig, first_request())
        assert first.replica_id == "replica-a"
        stream = h.Stream(rig.coordinator.stub, second_request(), 180)
        # replica-b asks replica-a for the prefix; replica-a's plan copying it out sleeps 1.5 s,
        # and replica-b's worker waits on replica-a's for it.
        recomputed_after_the_source_dies(rig, stream, reference)


def test_a_prefix_in_another_replicas_shared_pool_is_copied_pool_to_pool(binaries, reference, tmp_path):
    with h.running_cluster(tmp_path, {"replica-a": POOL, "replica-b": POOL}, routing="round-robin") as rig:
        first, second = both_requests(rig, reference)
        status = rig.coordinator.wait_idle()
        fetcher = status[second.replica_id]
        assert fetcher.num_kv_fetches == fetcher.num_kv_pool_fetches == 1, fetcher
        assert fetcher.num_kv_fetch_failures == 0
        assert fetcher.num_kv_fetched_blocks >= 12, fetcher
        assert fetcher.num_kv_blocks_reloaded == 0 and fetcher.num_host_hit_tokens == 0, fetcher
        # Nothing stays held on either side once the requests ended.
        for replica in status.values():
            assert replica.num_free_blocks == replica.num_kv_blocks, replica
        metrics = urllib.request.urlopen(rig.coordinator.http_url + "/metrics", timeout=10).read().decode()
        assert f'loom_kv_pool_fetches_total{{model_name="SmolLM2-135M-Instruct.Q4_1",replica="{second.replica_id}"}} 1' \
            in metrics, [line for line in metrics.splitlines() if "fetch" in line]
        # The fetched prefix served the prompt from the pool: a prefix-cache hit.
        hits = re.search(r'loom_prefix_cache_hits_total\{[^}]*replica="%s"[^}]*\} (\S+)' % second.replica_id,
                         metrics)
        assert hits and float(hits.group(1)) >= 12 * 16, [m for m in metrics.splitlines() if "prefix" in m]


def test_killing_the_source_mid_pool_fetch_recomputes_and_leaks_nothing(binaries, reference, tmp_path):
    slow = dict(POOL, debug_step_delay_ms=1500)
    with h.running_cluster(tmp_path, {"replica-a": slow, "replica-b": POOL}, routing="round-robin",
                           heartbeat_timeout_ms=1000) as rig:
        # replica-a's second plan (its first output's step) sleeps 1.5 s while replica-b's worker
        # waits for the step that wrote the prefix (streamed: the request is still running there).
        stream_a = h.Stream(rig.coordinator.stub, first_request(), 180)
        assert stream_a.wait_tokens(1, timeout=120)
        stream = h.Stream(rig.coordinator.stub, second_request(), 180)
        recomputed_after_the_source_dies(rig, stream, reference)
