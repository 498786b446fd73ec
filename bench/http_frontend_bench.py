"""The HTTP front end against the one it replaced, in the same run: `loom serve` as built now
(Boost.Beast, event-driven) and as built at revision 7cc9b84 (cpp-httplib, a thread per open
request; bench/setup_http_baseline.sh builds it), each in front of the same `loom-worker` with
the no-op backend, so the front end and the coordinator are what is measured.

1. Load: `loom bench --api openai` (streamed /v1/completions, 16 prompt and 16 output tokens)
   at 1,000 concurrent streams: requests/s and p99 end-to-end latency. The old server gets
   --http-threads 1100 (enough for every stream; its default of 512 would queue half).
2. Idle streams: the worker stopped, 1,000 streams opened and left waiting: the coordinator's
   resident memory and thread count grown per idle stream.

Passes alternate between the two servers (--passes, 3 by default); medians are reported, and
each figure of the new server next to the old one's as a ratio. Writes
bench/results/http_frontend.json.

usage: .venv/bin/python bench/http_frontend_bench.py [--passes 3] [--concurrency 1000]
       [--num-requests 6000] [--idle-streams 1000] [--baseline PATH]
"""
import argparse
import asyncio
import json
import os
import pathlib
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance, write_record  # noqa: E402

OUTCOME_TIMEOUT_S = 300


def proc_status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith(field + ":")).split()[1])


async def hold_idle_streams(host: str, port: int, count: int, measure):
    """Opens `count` streamed requests (their heads read), calls measure(), closes them."""
    payload = json.dumps({"prompt": "Hello", "max_tokens": 4000, "ignore_eos": True,
                          "stream": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload

    async def one():
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), OUTCOME_TIMEOUT_S)
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head.decode())
        return writer

    writers = []
    # The old server takes a thread per request: open them in waves it can accept.
    for start in range(0, count, 100):
        writers += await asyncio.gather(*[one() for _ in range(min(100, count - start))])
    await asyncio.sleep(1.0)
    result = measure()
    for writer in writers:
        writer.close()
    return result


def run_pass(server: str, binary: str, log_dir: pathlib.Path, args) -> dict:
    h.LOOM_BIN = pathlib.Path(binary)
    worker = {"step_backend": "noop", "threads": 1, "kv_cache_memory": "8GiB"}
    flags = {"max_num_seqs": args.concurrency, "max_waiting": 4 * args.concurrency,
             "step_timeout_ms": 3600000, "heartbeat_timeout_ms": 3600000}
    if server == "httplib":
        flags["http_threads"] = args.concurrency + 100
    out = {}
    with h.running_cluster(log_dir / f"{server}-{time.monotonic_ns()}", {"replica-a": worker},
                           print_logs=False, **flags) as rig:
        coordinator = rig.coordinator
        base_url = coordinator.http_url
        report = log_dir / f"bench-{server}-{time.monotonic_ns()}.json"
        command = [str(SOURCE_DIR / "build" / "coordinator" / "loom"), "bench", "--api", "openai",
                   "--base-url", base_url, "--dataset", "random",
                   "--vocab-size", "49152", "--input-len", "16", "--output-len", "16",
                   "--concurrency", str(args.concurrency),
                   "--num-requests", str(args.num_requests), "--warmup", str(args.concurrency),
                   "--output", str(report)]
        run = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             timeout=OUTCOME_TIMEOUT_S * 4)
        if run.returncode != 0:
            raise RuntimeError(f"loom bench failed ({run.returncode}): {run.stderr[-2000:]}")
        level = json.loads(report.read_text())["runs"][0]
        out["requests_per_s"] = level["request_throughput"]
        out["e2e_p99_ms"] = level["e2e_ms"]["p99"]
        out["failed"] = level.get("failed", 0)
        coordinator.wait_idle(timeout=OUTCOME_TIMEOUT_S)

        # Idle streams: nothing can run while the worker is stopped.
        pid = coordinator.pid
        rss_before = proc_status(pid, "VmRSS")
        threads_before = proc_status(pid, "Threads")
        w = rig.workers["replica-a"]
        w.signal(signal.SIGSTOP)
        try:
            h.wait_stopped(w.pid, OUTCOME_TIMEOUT_S)
            host, port = base_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
            rss_held, threads_held = asyncio.run(hold_idle_streams(
                host, int(port), args.idle_streams,
                lambda: (proc_status(pid, "VmRSS"), proc_status(pid, "Threads"))))
        finally:
            w.signal(signal.SIGCONT)
        out["rss_kib_per_idle_stream"] = (rss_held - rss_before) / args.idle_streams
        out["threads_per_idle_stream"] = (threads_held - threads_before) / args.idle_streams
        coordinator.wait_idle(timeout=OUTCOME_TIMEOUT_S)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--num-requests", type=int, default=6000)
    parser.add_argument("--idle-streams", type=int, default=1000)
    parser.add_argument("--baseline", help="the old coordinator (default: bench/setup_http_baseline.sh)")
    parser.add_argument("--output", default=str(SOURCE_DIR / "bench" / "results" / "http_frontend.json"))
    args = parser.parse_args()
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        print(missing, file=sys.stderr)
        return 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    baseline = args.baseline or subprocess.run(
        ["bash", str(SOURCE_DIR / "bench" / "setup_http_baseline.sh")], check=True,
        capture_output=True, text=True).stdout.strip()
    servers = {"beast": str(h.LOOM_BIN), "httplib": baseline}
    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="loom-http-bench-"))
    print(f"http front end: {args.concurrency} concurrent streams, {args.passes} alternating passes; "
          f"logs in {log_dir}", flush=True)
    passes = {name: [] for name in servers}
    for p in range(args.passes):
        for name in (servers if p % 2 == 0 else reversed(list(servers))):
            result = run_pass(name, servers[name], log_dir, args)
            passes[name].append(result)
            print(f"pass {p + 1} {name}: {json.dumps(result)}", flush=True)

    medians = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
               for name, runs in passes.items()}
    new, old = medians["beast"], medians["httplib"]
    ratios = {
        "requests_per_s": new["requests_per_s"] / old["requests_per_s"],
        "e2e_p99_ms": new["e2e_p99_ms"] / old["e2e_p99_ms"],
        "rss_kib_per_idle_stream": (new["rss_kib_per_idle_stream"] / old["rss_kib_per_idle_stream"]
                                    if old["rss_kib_per_idle_stream"] > 0 else None),
    }
    print(f"requests/s: {new['requests_per_s']:.0f} vs {old['requests_per_s']:.0f} "
          f"(ratio {ratios['requests_per_s']:.2f}x)")
    print(f"e2e p99: {new['e2e_p99_ms']:.0f} ms vs {old['e2e_p99_ms']:.0f} ms "
          f"(ratio {ratios['e2e_p99_ms']:.2f}x)")
    print(f"per idle stream: {new['rss_kib_per_idle_stream']:.1f} KiB and "
          f"{new['threads_per_idle_stream']:.3f} threads vs {old['rss_kib_per_idle_stream']:.1f} KiB and "
          f"{old['threads_per_idle_stream']:.3f} threads")
    write_record(args.output, {
        "bench": "http_frontend",
        "provenance": provenance(),
        "config": vars(args) | {"baseline": baseline},
        "passes": passes,
        "medians": medians,
        "ratios_new_over_old": ratios,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
