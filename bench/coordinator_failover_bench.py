"""Coordinator failover time (`loom serve --leader-lock`): two coordinators share a lock file and
one `loom-worker --step-backend noop` lists both. Each round SIGKILLs the leader (a crash) and
measures the time until the worker's replica is healthy on the follower that takes over, then
starts a new follower in the dead one's place; --kills rounds (20 by default). Before each kill
the leader serves --prompts prompts (sharing a prefix) twice; the second pass's prefix hit rate
is compared with the new leader's first pass over the same prompts: the worker reports the KV
blocks it holds when it registers, so the cache survives the failover (the time includes that
report and its adoption).

Prints the failover time's p50/p99/max next to the 5 s target as a ratio, and next to the
worker's heartbeat interval (how often it would notice a lost coordinator by itself) measured in
the same run. Writes bench/results/coordinator_failover.json.

usage: .venv/bin/python bench/coordinator_failover_bench.py [--kills 20]
"""
import argparse
import os
import pathlib
import re
import socket
import statistics
import sys
import tempfile
import time

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance, write_record  # noqa: E402

TARGET_S = 5.0
TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def hit_rate(coordinator, prompts) -> float:
    """Prompt tokens served from the prefix cache over all prompt tokens, one pass."""
    cached = total = 0
    for prompt in prompts:
        code, answer = h.post_json(coordinator.http_url.split("/v1")[0] + "/v1/completions",
                                   {"prompt": prompt, "max_tokens": 1}, timeout=TIMEOUT_S)
        assert code == 200, answer
        cached += answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        total += answer["usage"]["prompt_tokens"]
    return cached / total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--output", default=str(SOURCE_DIR / "bench" / "results" / "coordinator_failover.json"))
    args = parser.parse_args()
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        print(missing, file=sys.stderr)
        return 1
    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="loom-failover-"))
    lock = log_dir / "leader.lock"
    processes = []
    times = []
    hits_before, hits_after = [], []
    shared = " ".join(f"rule{i}" for i in range(150))
    prompts = [f"{shared} question {q}: " + " ".join(f"w{q}x{i}" for i in range(60))
               for q in range(args.prompts)]
    try:
        # Fixed ports, so that the worker's list stays valid as coordinators are replaced.
        ports = [free_port(), free_port()]

        def start(slot, name):
            coordinator = h.Coordinator(log_dir, name=name, leader_lock=lock, grpc_port=ports[slot])
            processes.append(coordinator)
            return coordinator
        coordinators = [start(0, "coordinator-0")]
        coordinators[0].wait_for_line(r"loom: leading", TIMEOUT_S)
        coordinators.append(start(1, "coordinator-1"))
        addresses = ",".join(c.address for c in coordinators)
        worker = h.Worker(log_dir, addresses, "replica-a", step_backend="noop", threads=1,
                          kv_cache_memory="1GiB")
        processes.append(worker)
        leader = 0
        coordinators[leader].wait_healthy(["replica-a"], timeout=TIMEOUT_S)
        match = re.search(r"heartbeat every (\d+) ms", worker.log_path.read_text(errors="replace"))
        heartbeat_ms = float(match.group(1)) if match else None
        for kill in range(args.kills):
            follower = 1 - leader
            hit_rate(coordinators[leader], prompts)  # warm (already warm after a failover)
            hits_before.append(hit_rate(coordinators[leader], prompts))
            killed_at = time.monotonic()
            coordinators[leader].kill()
            coordinators[follower].wait_healthy(["replica-a"], timeout=TIMEOUT_S)
            times.append(time.monotonic() - killed_at)
            hits_after.append(hit_rate(coordinators[follower], prompts))
            print(f"kill {kill + 1}: {times[-1] * 1000:.0f} ms; prefix hit rate {hits_before[-1]:.3f} "
                  f"before, {hits_after[-1]:.3f} after", flush=True)
            # A new follower where the leader was (same port: the worker's list holds).
            coordinators[leader] = start(leader, f"coordinator-{leader}-{kill}")
            leader = follower
    finally:
        for process in reversed(processes):
            process.stop(timeout=5)
    p50, p99 = statistics.median(times), percentile(times, 0.99)
    print(f"failover over {len(times)} leader kills: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms; p99 / 5 s target = {p99 / TARGET_S:.3f}"
          + (f"; p50 / heartbeat interval ({heartbeat_ms:.0f} ms) = {p50 * 1000 / heartbeat_ms:.2f}"
             if heartbeat_ms else ""))
    hit_before, hit_after = statistics.median(hits_before), statistics.median(hits_after)
    print(f"prefix hit rate (median over kills): {hit_before:.3f} on the old leader, {hit_after:.3f} "
          f"on the new one; after / before = {hit_after / hit_before:.3f}")
    write_record(args.output, {
        "bench": "coordinator_failover",
        "provenance": provenance(),
        "config": vars(args),
        "failover_s": times,
        "p50_s": p50,
        "p99_s": p99,
        "max_s": max(times),
        "target_s": TARGET_S,
        "p99_over_target": p99 / TARGET_S,
        "heartbeat_interval_ms": heartbeat_ms,
        "prefix_hit_rate_before": hits_before,
        "prefix_hit_rate_after": hits_after,
        "hit_rate_after_over_before": hit_after / hit_before,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
