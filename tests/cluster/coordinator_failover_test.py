"""Coordinator high availability (`loom serve --leader-lock`), over real processes: two
coordinators share a lock file and one `loom-worker --step-backend noop` lists both
(`--coordinator A,B`).

* The first to take the lock leads: the worker registers with it; the other follows: its
  /ready answers 503 with status "follower" and the leader's address, and it refuses worker
  registration with UNAVAILABLE naming the leader (the worker turns there).
* The leader is killed (SIGKILL, a crash) with streams in flight: the follower takes the lock
  at once, the worker (not restarted: the same process) turns to it and registers, and new
  requests over HTTP and gRPC complete through the new leader; afterwards no KV block is in use.
  The takeover time (kill to the replica healthy on the new leader) is printed;
  bench/coordinator_failover_bench.py would measure its distribution (not built yet).
"""
import json
import signal
import time
import urllib.request

import grpc
import pytest

import cluster_harness as h

TIMEOUT_S = 60


def completion(coordinator) -> dict:
    request = urllib.request.Request(
        coordinator.http_url.split("/v1")[0] + "/v1/completions",
        data=json.dumps({"prompt": "Hello", "max_tokens": 4, "ignore_eos": True}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


def test_a_follower_takes_over_when_the_leader_dies(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    lock = tmp_path / "leader.lock"
    processes = []
    try:
        a = h.Coordinator(tmp_path, name="coordinator-a", leader_lock=lock, max_num_seqs=8)
        processes.append(a)
        a.wait_for_line(r"loom: leading", TIMEOUT_S)
        b = h.Coordinator(tmp_path, name="coordinator-b", leader_lock=lock, max_num_seqs=8)
        processes.append(b)
        # B is listed first: as a follower it refuses and names A, where the worker turns.
        worker = h.Worker(tmp_path, f"{b.address},{a.address}", "replica-a", step_backend="noop",
                          threads=1, kv_cache_memory="4GiB")
        processes.append(worker)
        a.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        status, body = h.http_ready(b)
        assert status == 503 and body["status"] == "follower", body
        assert body["leader"] == a.address, body
        assert h.http_ready(a)[0] == 200
        assert completion(a)["usage"]["completion_tokens"] == 4
        refused = b.stub.Generate(h.make_request("Hello", max_tokens=4), timeout=TIMEOUT_S)
        with pytest.raises(Exception):
            list(refused)

        # Streams in flight on the leader when it dies (the worker paused so that they are).
        # (A client channel of its own: the harness closes the coordinator's on kill.)
        worker.signal(signal.SIGSTOP)
        client = grpc.insecure_channel(a.address)
        stub = h.stubs().grpc_pb.InferenceStub(client)
        streams = [h.Stream(stub, h.make_request("Hello", max_tokens=64, ignore_eos=True),
                            timeout=TIMEOUT_S) for _ in range(4)]
        assert h.wait_until(lambda: a.replicas()["replica-a"].num_running +
                            a.replicas()["replica-a"].num_waiting == 4, TIMEOUT_S)
        worker_pid = worker.pid
        killed_at = time.monotonic()
        a.kill()
        worker.signal(signal.SIGCONT)
        b.wait_for_line(r"loom: leading", TIMEOUT_S)
        b.wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        takeover_s = time.monotonic() - killed_at
        print(f"takeover: {takeover_s:.2f} s from the leader's death to the replica healthy on "
              f"the new leader")
        for stream in streams:
            outcome = stream.join(TIMEOUT_S)
            # Its coordinator died mid-stream: a retryable error, never a hang.
            assert outcome.code == grpc.StatusCode.UNAVAILABLE, outcome.describe()
        client.close()

        assert worker.alive() and worker.pid == worker_pid
        assert h.http_ready(b) == (200, {"status": "ok", "healthy_replicas": 1, "draining": False})
        assert completion(b)["usage"]["completion_tokens"] == 4
        assert h.generate(b.stub, h.make_request("Hello", max_tokens=4),
                          timeout=TIMEOUT_S).finished
        b.wait_idle(timeout=TIMEOUT_S)
        replica = b.replicas()["replica-a"]
        assert replica.num_kv_blocks - replica.num_free_blocks == 0
    finally:
        for process in reversed(processes):
            process.stop(timeout=5)
        for process in processes:
            print(process.log_tail())
