"""Overload soak driver shared by tests/cluster/overload_test.py (2 minutes, CI) and
bench/soak_bench.py (10 minutes): measures the sustainable request rate of a running cluster,
then offers twice that rate as an open-loop Poisson stream of gRPC and HTTP streaming requests,
some cancelled or disconnected by the client at a random moment, and accounts for every one.

Each request ends as exactly one of:
  completed     the final message / [DONE] with a finish reason
  rejected      RESOURCE_EXHAUSTED (gRPC, with `retry-after` trailing metadata) or HTTP 429
                (with a Retry-After header); its latency is kept
  cancelled     the client cancelled the gRPC call on purpose
  disconnected  the client closed its channel / socket mid-stream on purpose
  lost          anything else: another error, a stream without a finish, no end in time
A healthy run has lost == 0; afterwards the cluster must be idle with every KV block free.
"""
import dataclasses
import http.client
import json
import random
import statistics
import threading
import time
from typing import Optional

import grpc

import cluster_harness as h

KINDS = ("completed", "rejected", "cancelled", "disconnected", "lost")


@dataclasses.dataclass
class Result:
    kind: str = "lost"
    transport: str = "grpc"
    started: float = 0.0
    ended: Optional[float] = None
    first_token_at: Optional[float] = None
    last_token_at: Optional[float] = None
    tokens: int = 0
    retry_after: Optional[str] = None  # the rejection's Retry-After, as sent
    detail: str = ""

    @property
    def latency_s(self) -> Optional[float]:
        return None if self.ended is None else self.ended - self.started

    def stream_rate(self) -> Optional[float]:
        """Tokens per second between the first and the last token (a completed stream)."""
        if self.kind != "completed" or self.tokens < 2 or self.last_token_at is None:
            return None
        span = self.last_token_at - self.first_token_at
        return (self.tokens - 1) / span if span > 0 else None


@dataclasses.dataclass
class Plan:
    """What one request does."""
    transport: str       # grpc | http
    action: str          # finish | cancel | disconnect
    after_s: float = 0.0  # when to cancel / disconnect, from the start


def _grpc_request(prompt: str, max_tokens: int):
    return h.make_request(prompt, max_tokens=max_tokens, ignore_eos=True)


def run_grpc(coordinator, plan: Plan, prompt: str, max_tokens: int, timeout_s: float) -> Result:
    result = Result(transport="grpc", started=time.monotonic())
    # Each request is its own client, on its own connection: on a shared one, a rejection's
    # trailers would queue behind the other streams' data in the client's reader, and the
    # latency measured would be the client's.
    channel = grpc.insecure_channel(coordinator.address)
    stub = h.stubs().grpc_pb.InferenceStub(channel)
    call = stub.Generate(_grpc_request(prompt, max_tokens), timeout=timeout_s)
    timer = None
    if plan.action == "cancel":
        timer = threading.Timer(plan.after_s, call.cancel)
    elif plan.action == "disconnect":
        timer = threading.Timer(plan.after_s, channel.close)
    if timer is not None:
        timer.daemon = True
        timer.start()
    finish = 0
    try:
        for message in call:
            now = time.monotonic()
            if message.token_ids:
                if result.first_token_at is None:
                    result.first_token_at = now
                result.last_token_at = now
                result.tokens += len(message.token_ids)
            if message.finish_reason:
                finish = message.finish_reason
        result.ended = time.monotonic()
        if finish == h.stubs().pb.FINISH_REASON_LENGTH:
            result.kind = "completed"
        else:
            result.detail = f"ended with finish reason {finish}"
    except grpc.RpcError as error:
        result.ended = time.monotonic()
        code = error.code()
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            result.kind = "rejected"
            trailers = dict(error.trailing_metadata() or ())
            result.retry_after = trailers.get("retry-after")
        elif code == grpc.StatusCode.CANCELLED and plan.action in ("cancel", "disconnect"):
            result.kind = "cancelled" if plan.action == "cancel" else "disconnected"
        else:
            result.detail = f"{code} {error.details()}"
    finally:
        if timer is not None:
            timer.cancel()
        channel.close()
    return result


def run_http(coordinator, plan: Plan, prompt: str, max_tokens: int, timeout_s: float) -> Result:
    result = Result(transport="http", started=time.monotonic())
    url = coordinator.http_url.split("//", 1)[1].split("/", 1)[0]
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    body = json.dumps({"model": "", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True})
    deadline = result.started + plan.after_s if plan.action == "disconnect" else None
    try:
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status == 429:
            result.ended = time.monotonic()
            result.kind = "rejected"
            result.retry_after = response.getheader("Retry-After")
            response.read()
            return result
        if response.status != 200:
            result.ended = time.monotonic()
            result.detail = f"HTTP {response.status}: {response.read()[:200]!r}"
            return result
        # Read in large chunks and count events without parsing each one: a Python client
        # parsing every SSE line of many streams is slow enough to delay the other requests.
        finished = False
        tail = b""
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                result.ended = time.monotonic()
                result.kind = "disconnected"
                return result  # the finally closes the socket mid-stream
            chunk = response.read1(65536)
            if not chunk:
                break
            now = time.monotonic()
            window = tail + chunk
            events = window.count(b"data: ") - tail.count(b"data: ")
            if b"data: [DONE]" in window:
                finished = True
                events -= 1
            if b'"error"' in window:
                result.detail = f"error event: {window[-300:]!r}"
                break
            if events > 0:
                if result.first_token_at is None:
                    result.first_token_at = now
                result.last_token_at = now
                result.tokens += events  # one event per token or more: a lower bound
            if finished:
                break
            tail = window[-16:]
        result.ended = time.monotonic()
        if finished and not result.detail:
            result.kind = "completed"
        elif not result.detail:
            result.detail = "the stream ended without [DONE]"
    except (OSError, http.client.HTTPException) as error:
        result.ended = time.monotonic()
        result.detail = f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    return result


def run_one(coordinator, plan: Plan, prompt: str, max_tokens: int, timeout_s: float) -> Result:
    forward_pass = run_http if plan.transport == "http" else run_grpc
    try:
        return forward_pass(coordinator, plan, prompt, max_tokens, timeout_s)
    except Exception as error:  # a client bug must show as lost, not vanish with its thread
        return Result(transport=plan.transport, detail=f"client exception {error!r}")


class Launcher:
    """Runs requests on their own threads and keeps every Result."""

    def __init__(self, coordinator, max_tokens: int, timeout_s: float):
        self.coordinator, self.max_tokens, self.timeout_s = coordinator, max_tokens, timeout_s
        self.results: list[Result] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._count = 0

    def launch(self, plan: Plan, on_done=None) -> None:
        self._count += 1
        prompt = f"Soak request {self._count}: say something about queues."

        def body():
            result = run_one(self.coordinator, plan, prompt, self.max_tokens, self.timeout_s)
            with self._lock:
                self.results.append(result)
            if on_done is not None:
                on_done(result)

        thread = threading.Thread(target=body, daemon=True)
        with self._lock:
            self.threads.append(thread)
        thread.start()

    def join(self, timeout_s: float) -> int:
        """Waits for every request, those launched meanwhile too (a request's end may launch
        the next); returns how many did not end in time (hung)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                alive = [thread for thread in self.threads if thread.is_alive()]
            if not alive or time.monotonic() >= deadline:
                return len(alive)
            alive[0].join(min(0.5, max(0.0, deadline - time.monotonic())))


def measure_sustainable_rate(coordinator, concurrency: int, duration_s: float, max_tokens: int,
                             timeout_s: float) -> dict:
    """Closed loop: `concurrency` clients (the replicas' running capacity), each sending its next
    gRPC request when the last one ends, for duration_s. The completion rate is the rate the
    cluster sustains with nothing queued."""
    launcher = Launcher(coordinator, max_tokens, timeout_s)
    stop_at = time.monotonic() + duration_s
    start = time.monotonic()

    def next_one(_result=None):
        if time.monotonic() < stop_at:
            launcher.launch(Plan("grpc", "finish"), on_done=next_one)

    for _ in range(concurrency):
        next_one()
    hung = launcher.join(duration_s + timeout_s)
    elapsed = time.monotonic() - start
    results = launcher.results
    completed = [r for r in results if r.kind == "completed"]
    # Requests that ended within the window set the rate (the last ones overran it).
    in_window = [r for r in completed if r.ended <= stop_at]
    rates = [r.stream_rate() for r in completed if r.stream_rate()]
    return {
        "concurrency": concurrency,
        "window_s": duration_s,
        "elapsed_s": elapsed,
        "requests": len(results),
        "completed": len(completed),
        "not_completed": len(results) - len(completed),
        "hung": hung,
        "rate_per_s": len(in_window) / duration_s,
        "median_stream_tokens_per_s": statistics.median(rates) if rates else None,
        "details": sorted({r.detail for r in results if r.kind != "completed"})[:5],
    }


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def percentile(values: list, fraction: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def latency_summary(values_ms: list) -> dict:
    return {"p50": percentile(values_ms, 0.5), "p99": percentile(values_ms, 0.99),
            "max": max(values_ms) if values_ms else None}


def run_overload(coordinator, rate_per_s: float, duration_s: float, max_tokens: int,
                 timeout_s: float, seed: int = 1, http_fraction: float = 0.25,
                 cancel_fraction: float = 0.1, disconnect_fraction: float = 0.1,
                 action_within_s: float = 2.0, warmup_fraction: float = 0.25,
                 drain_timeout_s: float = 120.0) -> dict:
    """Open loop: Poisson arrivals at rate_per_s for duration_s; a request is sent over HTTP
    with probability http_fraction, and cancelled or disconnected (uniformly within
    action_within_s of its start) with the given probabilities. The coordinator's RSS is read at
    warmup_fraction of the run and at its end."""
    rng = random.Random(seed)
    launcher = Launcher(coordinator, max_tokens, timeout_s)
    start = time.monotonic()
    end = start + duration_s
    warm_at = start + warmup_fraction * duration_s
    rss_warm = None
    next_at = start
    offered = 0
    while True:
        next_at += rng.expovariate(rate_per_s)
        if next_at >= end:
            break
        now = time.monotonic()
        if rss_warm is None and now >= warm_at:
            rss_warm = rss_bytes(coordinator.pid)
        if next_at > now:
            time.sleep(next_at - now)
        roll = rng.random()
        action = ("cancel" if roll < cancel_fraction else
                  "disconnect" if roll < cancel_fraction + disconnect_fraction else "finish")
        transport = "http" if rng.random() < http_fraction else "grpc"
        launcher.launch(Plan(transport, action, rng.uniform(0.0, action_within_s)))
        offered += 1
    if rss_warm is None:
        rss_warm = rss_bytes(coordinator.pid)
    rss_end = rss_bytes(coordinator.pid)
    sent_s = time.monotonic() - start
    hung = launcher.join(drain_timeout_s)
    results = list(launcher.results)
    counts = {kind: sum(1 for r in results if r.kind == kind) for kind in KINDS}
    counts["lost"] += hung  # no Result at all: its thread never ended
    rejected = [r for r in results if r.kind == "rejected"]
    reject_ms = [1000 * r.latency_s for r in rejected]
    # gRPC streams only: they count tokens exactly, as the calibration's do (SSE events are a
    # lower bound).
    rates = [r.stream_rate() for r in results if r.transport == "grpc" and r.stream_rate()]
    return {
        "offered_rate_per_s": rate_per_s,
        "duration_s": duration_s,
        "sent_s": sent_s,
        "offered": offered,
        "counts": counts,
        "hung": hung,
        "by_transport": {t: {kind: sum(1 for r in results if r.transport == t and r.kind == kind)
                             for kind in KINDS} for t in ("grpc", "http")},
        "rejections_without_retry_after": sum(1 for r in rejected if not r.retry_after),
        "reject_latency_ms": latency_summary(reject_ms),
        "reject_latency_ms_by_transport": {
            t: latency_summary([1000 * r.latency_s for r in rejected if r.transport == t])
            for t in ("grpc", "http")},
        "completed_rate_per_s": counts["completed"] / sent_s,
        "median_grpc_stream_tokens_per_s": statistics.median(rates) if rates else None,
        "rss_warm_bytes": rss_warm,
        "rss_end_bytes": rss_end,
        "rss_growth": (rss_end - rss_warm) / rss_warm,
        "lost_details": sorted({r.detail for r in results if r.kind == "lost"})[:10],
    }


def kv_blocks_in_use(coordinator) -> int:
    return sum(s.num_kv_blocks - s.num_free_blocks for s in coordinator.replicas().values())
