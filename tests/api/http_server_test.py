"""The event-driven HTTP front end (api/http_server, api/http_connection) at scale, over real
`loom serve` and `loom-worker --step-backend noop` processes.

The worker is SIGSTOPped, so no step runs and every accepted stream stays open and idle:
* 2,000 concurrent SSE streams are held while the coordinator's thread count stays where it
  was before them (the old thread-per-request server needed a thread for each), and every
  stream gets its `: keep-alive` comment after 5 s of silence;
* requests beyond the waiting queue are answered 429 with Retry-After and an OpenAI error body
  by admission itself (no step can run to make room) while the 2,000 are held;
* the clients then close their connections: the coordinator sees each one go (no write is
  pending on an idle stream: the connection watches the socket) and cancels its request, so
  once the worker resumes the cluster is idle long before the requests' 4,000 tokens each
  could have been generated, no KV block is in use, and a new request completes.
"""
import asyncio
import json
import pathlib
import resource
import signal
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402
import soak_driver  # noqa: E402

STREAMS = 2000
EXTRA = 64
MAX_NUM_SEQS = 8
MAX_WAITING = STREAMS
# Timeouts that are never expected to fire: each only bounds a failure.
OUTCOME_TIMEOUT_S = 120
# Threads the coordinator may start while the streams open besides the HTTP server's fixed
# ones (gRPC's executor grows on its own schedule); the old server needed 2,000.
THREAD_SLACK = 8


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def request_bytes(host: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def open_request(host: str, port: int, body: dict):
    """Sends one request; returns (reader, writer, status, headers) once the head arrived."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request_bytes(host, body))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), OUTCOME_TIMEOUT_S)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in
               (line.split(":", 1) for line in lines[1:] if ":" in line)}
    return reader, writer, status, headers


async def read_body(reader, headers) -> bytes:
    return await asyncio.wait_for(reader.readexactly(int(headers["content-length"])),
                                  OUTCOME_TIMEOUT_S)


@pytest.fixture
def rig(tmp_path):
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)
    # The client side holds ~2,100 sockets.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard or soft < hard < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    worker = {"backend": "noop", "threads": 1, "kv_cache_memory": "4GiB"}
    # The worker is stopped on purpose: liveness must not give up on it during the test.
    with h.running_cluster(tmp_path, {"replica-a": worker}, max_num_seqs=MAX_NUM_SEQS,
                           max_waiting=MAX_WAITING, step_timeout_ms=3600000,
                           heartbeat_timeout_ms=3600000) as rig:
        yield rig


def test_thousands_of_idle_streams_hold_no_threads_and_overload_is_429_at_once(rig):
    coordinator, worker = rig.coordinator, rig.workers["replica-a"]
    host, port = coordinator.http_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    port = int(port)

    async def scenario():
        # One request first: whatever starts lazily on the first request has started.
        _, writer, status, headers = await open_request(
            host, port, {"prompt": "Hello", "max_tokens": 2})
        assert status == 200, headers
        writer.close()
        baseline = threads_of(coordinator.pid)

        worker.signal(signal.SIGSTOP)
        h.wait_stopped(worker.pid, OUTCOME_TIMEOUT_S)
        stream_body = {"prompt": "Hello", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        streams = await asyncio.gather(
            *[open_request(host, port, stream_body) for _ in range(STREAMS)])
        refused = [s for s in streams if s[2] != 200]
        assert not refused, [(s[2], s[3]) for s in refused[:3]]
        assert all(s[3]["content-type"] == "text/event-stream" for s in streams)
        held_threads = threads_of(coordinator.pid)
        print(f"coordinator threads: {baseline} before, {held_threads} with {STREAMS} streams open")
        assert held_threads <= baseline + THREAD_SLACK, (baseline, held_threads)

        # Beyond the queue: refused by admission while no step can run.
        extra = await asyncio.gather(*[open_request(host, port, stream_body) for _ in range(EXTRA)])
        rejected = [e for e in extra if e[2] == 429]
        assert len(rejected) >= EXTRA - MAX_NUM_SEQS, [e[2] for e in extra]
        for reader, _, status, headers in rejected:
            assert headers.get("retry-after") == "1", headers
            error = json.loads(await read_body(reader, headers))["error"]
            assert error["code"] == "queue_full" and error["type"] == "rate_limit_error", error
        assert all(e[2] in (200, 429) for e in extra), [e[2] for e in extra]

        # Five seconds of silence: every stream gets its keep-alive comment.
        async def keep_alive(reader):
            return await asyncio.wait_for(reader.readuntil(b"\n\n"), OUTCOME_TIMEOUT_S)

        comments = await asyncio.gather(*[keep_alive(s[0]) for s in streams])
        assert all(b": keep-alive" in c for c in comments), comments[:3]
        assert threads_of(coordinator.pid) <= baseline + THREAD_SLACK

        # The clients go: each request is cancelled.
        for _, writer, _, _ in streams + extra:
            writer.close()
        await asyncio.sleep(0)
        return baseline

    try:
        baseline = asyncio.run(scenario())
    finally:
        worker.signal(signal.SIGCONT)
    # 2,000 x 4,000 tokens at 8 per step would take hours: idle soon means cancelled.
    coordinator.wait_idle(timeout=OUTCOME_TIMEOUT_S)
    assert soak_driver.kv_blocks_in_use(coordinator) == 0
    assert h.wait_until(lambda: threads_of(coordinator.pid) <= baseline + THREAD_SLACK, 30)

    async def after():
        reader, writer, status, headers = await open_request(
            host, port, {"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        body = json.loads(await read_body(reader, headers))
        writer.close()
        return status, body

    status, body = asyncio.run(after())
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 4, body
