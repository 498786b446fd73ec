"""Coordinator high availability (`loom serve --leader-lock`), over real processes: two
coordinators share a lock file and one `loom-worker --step-backend noop` lists both
(`--coordinator A,B`).

* The first to take the lock leads: the worker registers with it; the other follows: its
  /ready answers 503 with status "follower" and the leader's address, and it refuses worker
  registration and generation with UNAVAILABLE naming the leader (`loom-leader` metadata:
  the worker and the SDK turn there).
* The leader is killed (SIGKILL, a crash) under load: 32 streams in flight and 32 requests
  queued behind them, sent by the SDK with both addresses. The follower takes the lock at
  once; the worker (not restarted: the same process) turns to it, registers and reports
  the KV blocks it holds; the streams end with UNAVAILABLE (retryable) after their tokens;
  the queued requests, never started, are made again by the SDK on the new leader and
  complete; new requests over HTTP and gRPC complete; a warm prompt's cached tokens are
  as many as before; afterwards no KV block is in use. The takeover time (kill to the
  replica healthy on the new leader) is printed; bench/coordinator_failover_bench.py
  measures its distribution.
"""
import asyncio
import concurrent.futures
import json
import signal
import subprocess
import time
import urllib.request

import grpc
import pytest

import cluster_harness as h
from loom_client import AsyncLoomClient, LoomClient, RetryPolicy

# Outcomes that rest on time: scripts/test-slow-machine.sh runs them again on one core.
pytestmark = pytest.mark.slow_machine

TIMEOUT_S = 60
RUNNING = 32  # streams in flight when the leader dies (max_num_seqs)
QUEUED = 32   # requests waiting behind them
CLIENT_TOOL = h.BUILD_DIR / "tests" / "client" / "client_tool"
WARM_PROMPT = " ".join(f"word{i}" for i in range(120))


def completion(coordinator, prompt: str = "Hello") -> dict:
    request = urllib.request.Request(
        coordinator.http_url.split("/v1")[0] + "/v1/completions",
        data=json.dumps({"prompt": prompt, "max_tokens": 4, "ignore_eos": True}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


def cached_tokens(coordinator) -> int:
    """Cached prompt tokens of a long prompt's second run (its first warms the cache)."""
    for _ in range(2):
        answer = completion(coordinator, WARM_PROMPT)
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_follower_takes_over_when_the_leader_dies(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN, CLIENT_TOOL)
    if missing:
        pytest.fail(missing)
    processes = []
    try:
        a, b = h.leader_and_standby(tmp_path, processes, TIMEOUT_S, {"max_num_seqs": RUNNING},
                                    {"max_num_seqs": RUNNING})
        # B is listed first: as a follower it refuses and names A, where the worker turns.
        worker = h.Worker(tmp_path, f"{b.address},{a.address}", "replica-a", step_backend="noop",
                          threads=1, kv_cache_memory="4GiB", debug_step_delay_ms=20)
        processes.append(worker)
        a.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        status, body = h.http_ready(b)
        assert status == 503 and body["status"] == "follower", body
        assert body["leader"] == a.address, body
        assert h.http_ready(a)[0] == 200
        assert completion(a)["usage"]["completion_tokens"] == 4
        refused = b.stub.Generate(h.make_request("Hello", max_tokens=4), timeout=TIMEOUT_S)
        with pytest.raises(grpc.RpcError) as error:
            list(refused)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("loom-leader", a.address) in tuple(error.value.trailing_metadata()), error.value

        # The SDK given the follower first: refused with the leader's address, it turns there.
        async def via_follower():
            async with AsyncLoomClient(f"{b.address},{a.address}", timeout=TIMEOUT_S) as aio:
                return await aio.generate("Hello", max_tokens=4)
        turned = asyncio.run(via_follower())
        assert turned.completion_tokens == 4 and turned.attempts == 2, turned
        # And the C++ SDK (loom::client, through tests/client/client_tool).
        tool = subprocess.run([str(CLIENT_TOOL), "generate", "--address", f"{b.address},{a.address}",
                               "--prompt", "Hello", "--max-tokens", "4", "--timeout", str(TIMEOUT_S)],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        assert tool.returncode == 0, tool.stderr
        out = json.loads(tool.stdout)
        assert out["code"] == "OK" and out["completion"]["attempts"] == 2, out

        # Under load when the leader dies: 32 streams in flight (each has tokens) and 32
        # requests queued behind them (max_num_seqs 32), the queued ones sent by the SDK
        # with both coordinators' addresses, as a client outside Kubernetes would.
        client = grpc.insecure_channel(a.address)  # the harness closes a's own on kill
        stub = h.stubs().grpc_pb.InferenceStub(client)
        hit_before = cached_tokens(a)
        assert hit_before > 0
        streams = [h.Stream(stub, h.make_request(f"Stream {i}", max_tokens=4000, ignore_eos=True),
                            timeout=TIMEOUT_S) for i in range(RUNNING)]
        assert all(stream.wait_tokens(1, TIMEOUT_S) for stream in streams)
        sdk = LoomClient(f"{a.address},{b.address}", timeout=TIMEOUT_S,
                         retry=RetryPolicy(max_attempts=40, max_backoff=0.5))
        with concurrent.futures.ThreadPoolExecutor(QUEUED) as pool:
            queued = [pool.submit(sdk.generate, f"Queued {i}", max_tokens=8, ignore_eos=True)
                      for i in range(QUEUED)]
            assert h.wait_until(lambda: a.replicas()["replica-a"].num_waiting == QUEUED, TIMEOUT_S)
            worker_pid = worker.pid
            killed_at = time.monotonic()
            a.kill()
            b.wait_for_line(r"loom: leading", TIMEOUT_S)
            b.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
            takeover_s = time.monotonic() - killed_at
            print(f"takeover: {takeover_s:.2f} s from the leader's death to the replica healthy on "
                  f"the new leader")
            for stream in streams:
                outcome = stream.join(TIMEOUT_S)
                # Its coordinator died mid-stream: a retryable error, never a hang.
                assert outcome.code == grpc.StatusCode.UNAVAILABLE, outcome.describe()
                assert outcome.token_ids, outcome.describe()
            # The queued requests had not started: the SDK made them again on the new leader.
            completions = [future.result(timeout=TIMEOUT_S) for future in queued]
        assert all(c.completion_tokens == 8 and c.finish_reason for c in completions), completions[0]
        assert max(c.attempts for c in completions) > 1
        client.close()

        assert worker.alive() and worker.pid == worker_pid
        assert h.http_ready(b) == (200, {"status": "ok", "healthy_replicas": 1, "draining": False})
        assert completion(b)["usage"]["completion_tokens"] == 4
        assert sdk.generate("Hello", max_tokens=4).completion_tokens == 4
        # The new leader adopted the blocks the worker held: the cached prompt still hits.
        hit_after = cached_tokens(b)
        print(f"cached prompt tokens of the warm prompt: {hit_before} before, {hit_after} after")
        assert hit_after >= hit_before
        sdk.close()
        b.wait_idle(timeout=TIMEOUT_S)
        replica = b.replicas()["replica-a"]
        assert replica.num_kv_blocks - replica.num_free_blocks == 0
    finally:
        h.stop_all(processes)


def test_a_stopped_leader_hands_over_before_it_drains(tmp_path):
    """SIGTERM (a rolling update) with standbys: the leader resigns first, so the cluster serves
    on through the standby at once instead of refusing new requests for the whole drain; its
    streams in flight end with an error (over HTTP, a 503-type error event and [DONE]) once
    the worker follows the new leader, and its queued requests, never started, end
    UNAVAILABLE and are made again by the SDK on the new leader. The drain timeout (120 s)
    is far longer than anything here takes: a leader that drained first would hold all of it."""
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    processes = []
    try:
        a, b = h.leader_and_standby(tmp_path, processes, TIMEOUT_S,
                                    {"max_num_seqs": 4, "drain_timeout_s": 120}, {"max_num_seqs": 4})
        worker = h.Worker(tmp_path, f"{a.address},{b.address}", "replica-a", step_backend="noop",
                          threads=1, kv_cache_memory="1GiB", debug_step_delay_ms=20)
        processes.append(worker)
        a.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        client = grpc.insecure_channel(a.address)
        stub = h.stubs().grpc_pb.InferenceStub(client)
        streams = [h.Stream(stub, h.make_request(f"Stream {i}", max_tokens=4000, ignore_eos=True),
                            timeout=TIMEOUT_S * 2) for i in range(4)]
        assert all(stream.wait_tokens(1, TIMEOUT_S) for stream in streams)
        sdk = LoomClient(f"{a.address},{b.address}", timeout=TIMEOUT_S * 2,
                         retry=RetryPolicy(max_attempts=40, max_backoff=0.5))
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            queued = [pool.submit(sdk.generate, f"Queued {i}", max_tokens=8, ignore_eos=True)
                      for i in range(4)]
            assert h.wait_until(lambda: a.replicas()["replica-a"].num_waiting == 4, TIMEOUT_S)
            a.signal(signal.SIGTERM)
            b.wait_for_line(r"loom: leading", TIMEOUT_S)
            b.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
            for stream in streams:
                outcome = stream.join(TIMEOUT_S)
                assert outcome.reason_name() == "FINISH_REASON_ERROR", outcome.describe()
                assert "lost its worker" in outcome.error_message and outcome.token_ids
                assert len(outcome.token_ids) < 4000
            completions = [future.result(timeout=TIMEOUT_S) for future in queued]
        assert all(c.completion_tokens == 8 for c in completions), completions[0]
        assert min(c.attempts for c in completions) > 1
        # The old leader drained nothing it still led, and exited long before its timeout.
        assert a.wait(TIMEOUT_S) == 0
        assert "handing leadership over" in a.log_path.read_text()
        assert completion(b)["usage"]["completion_tokens"] == 4
        client.close()
        sdk.close()
        b.wait_idle(timeout=TIMEOUT_S)
    finally:
        h.stop_all(processes)
