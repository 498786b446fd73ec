"""Coordinator overhead: `loom serve` driving one `loom-worker --step-backend noop` (tokens come back
at once), so step time is scheduler + plan building + the step RPC + applying results. Holds 1, 64
and 256 running sequences (short prompts, ignore_eos, max_tokens near the context) and measures,
from GetClusterState deltas over a window (never client-side):

  steps/s            num_steps delta / wall time
  ms per step        1000 / steps/s
  schedule ms/step   schedule_seconds delta / num_steps delta (coordinator CPU building plans)

once with --max-plans-in-flight 1 (the baseline, same run) and once with 2. A sequence lives at
most max_tokens (< the context) steps, a second or two at thousands of steps/s: the window is
polled every 0.1 s, sequences that ended are replaced, and only the poll intervals that saw all
n running count (each row records the time counted, window_s, and streams_started). Prints the targets:
< 1 ms per step at 256 sequences (2 in flight) and steps/s with 2 in flight >= 1.5x that with 1.
Writes bench/results/coordinator_overhead.json.

The Python client cannot read 256 streams at thousands of messages per second; each stream is
consumed on its own thread (--client-read all) or only its first message is read and the rest is
left to gRPC flow control (--client-read first, the default), which keeps the client off the CPU
the coordinator needs (2-core machines). For flow control to do that, the held streams' channel
advertises a small HTTP/2 window (--client-window-bytes, 1 KiB): after a few messages a stream's
writes wait for window the client never grants, the way a slow reader's do, and its tokens merge
in the coordinator's output queue. With gRPC's default window (64 KiB, grown by BDP probing) the
coordinator keeps writing a message per stream every --stream-interval-ms, and delivering them
(the coordinator's stream pump, the kernel's loopback TCP, the client's receive threads) takes
as much CPU as the steps being measured.

usage: .venv/bin/python bench/coordinator_overhead_bench.py [--sizes 1,64,256] [--window-s 3]
       [--client-read all|first] [--client-window-bytes 1024] [--kv-cache-memory 64GiB]
       [--stream-interval-ms MS] [--repeats 5]
"""
import argparse
import datetime
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import threading
import time

import grpc

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
import cluster_harness as h  # noqa: E402
from provenance import provenance, write_record  # noqa: E402

TARGET_MS_PER_STEP_AT_256 = 1.0
TARGET_PIPELINING_RATIO = 1.5
POLL_S = 0.1        # GetClusterState polls during a window
MIN_WINDOW_S = 0.5  # shorter windows (all sequences ended) are an error


class HeldStreams:
    """n Generate streams kept running; add() starts more (to replace ones that ended)."""

    def __init__(self, stub, n: int, read_all: bool, max_tokens: int):
        self.stub, self.read_all, self.max_tokens = stub, read_all, max_tokens
        self.calls = []
        self.first = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.num_started = 0  # streams that got their first message (or failed)
        self.threads = []
        self.add(n)

    def add(self, n: int):
        for _ in range(n):
            request = h.make_request(f"Sequence {len(self.calls)}:", max_tokens=self.max_tokens,
                                     ignore_eos=True)
            call = self.stub.Generate(request, timeout=3600)
            self.calls.append(call)
            thread = threading.Thread(target=self._consume, args=(call,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _consume(self, call):
        try:
            next(call)
            self._started()
            if self.read_all:
                for _ in call:
                    pass
        except Exception:  # noqa: BLE001 - cancelled at the end
            self._started()

    def _started(self):
        with self.lock:
            self.num_started += 1
        self.first.release()

    def all_started(self) -> bool:
        with self.lock:
            return self.num_started >= len(self.calls)

    def wait_started(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for _ in self.calls:
            if not self.first.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
        return True

    def cancel(self):
        for call in self.calls:
            call.cancel()
        for thread in self.threads:
            thread.join(timeout=10)


def held_stream_channel(coordinator, window_bytes: int):
    """A channel whose HTTP/2 window is window_bytes (0: gRPC's default)."""
    options = [] if window_bytes <= 0 else [("grpc.http2.lookahead_bytes", window_bytes),
                                            ("grpc.http2.bdp_probe", 0)]
    return grpc.insecure_channel(coordinator.address, options=options)


def measure(coordinator, replica: str, n: int, window_s: float, read_all: bool, max_tokens: int,
            window_bytes: int) -> dict:
    channel = held_stream_channel(coordinator, window_bytes)
    streams = HeldStreams(h.stubs().grpc_pb.InferenceStub(channel), n, read_all, max_tokens)
    steps = elapsed = schedule_s = step_s = tokens = preemptions = 0
    try:
        if not streams.wait_started(timeout=120):
            raise h.HarnessError(f"{n} streams did not all start\n{coordinator.log_tail()}")
        coordinator.wait_replicas(lambda r: r[replica].num_running == n, 60, f"{n} sequences running")
        time.sleep(0.5)  # settle
        # A sequence lives at most max_tokens (< the context) steps, which a fast configuration
        # gets through in a second or two: sequences that end are replaced, and the window
        # counts only the poll intervals that began and ended with all n running.
        prev, t_prev = coordinator.replicas()[replica], time.monotonic()
        end = t_prev + window_s
        while time.monotonic() < end:
            time.sleep(POLL_S)
            s, t = coordinator.replicas()[replica], time.monotonic()
            full = s.num_running == n and s.num_waiting == 0
            if full and prev.num_running == n and prev.num_waiting == 0:
                steps += s.num_steps - prev.num_steps
                elapsed += t - t_prev
                schedule_s += s.schedule_seconds - prev.schedule_seconds
                step_s += s.step_seconds - prev.step_seconds
                tokens += s.num_tokens_computed - prev.num_tokens_computed
                preemptions += s.num_preemptions - prev.num_preemptions
            elif s.num_running + s.num_waiting < n and streams.all_started():
                streams.add(n - s.num_running - s.num_waiting)
            prev, t_prev = s, t
    finally:
        streams.cancel()
        channel.close()
    coordinator.wait_replicas(lambda r: r[replica].num_running == 0 and r[replica].num_waiting == 0,
                              60, "streams cancelled")
    if steps <= 0 or elapsed < MIN_WINDOW_S:
        raise h.HarnessError(f"{steps} steps in {elapsed:.2f} s with {n} sequences running: {prev}")
    return {
        "sequences": n,
        "window_s": round(elapsed, 2),
        "running_at_end": prev.num_running,
        "streams_started": len(streams.calls),
        "preemptions_in_window": preemptions,
        "steps": steps,
        "steps_per_s": round(steps / elapsed, 1),
        "ms_per_step": round(1000 * elapsed / steps, 4),
        "schedule_ms_per_step": round(1000 * schedule_s / steps, 4),
        "step_rpc_ms_per_step": round(1000 * step_s / steps, 4),
        "tokens_per_s": round(tokens / elapsed, 1),
    }


def run_config(plans_in_flight: int, args, log_dir: pathlib.Path) -> list[dict]:
    sizes = [int(s) for s in args.sizes.split(",")]
    flags = {"max_plans_in_flight": plans_in_flight, "max_num_seqs": max(sizes),
             "max_num_batched_tokens": max(512, max(sizes)), "max_waiting": 4 * max(sizes),
             "stream_interval_ms": args.stream_interval_ms}  # None: the server's default
    workers = {"replica-noop": {"step_backend": "noop", "threads": 1, "kv_cache_memory": args.kv_cache_memory}}
    rows = []
    with h.running_cluster(log_dir / f"plans{plans_in_flight}", workers, print_logs=False, **flags) as rig:
        reported = rig.coordinator.replicas()["replica-noop"]
        if reported.max_plans_in_flight and reported.max_plans_in_flight != plans_in_flight:
            raise h.HarnessError(f"asked for {plans_in_flight} plans in flight, status says {reported}")
        for n in sizes:
            row = measure(rig.coordinator, "replica-noop", n, args.window_s, args.client_read == "all",
                          args.max_tokens, args.client_window_bytes if args.client_read == "first" else 0)
            row["max_plans_in_flight"] = plans_in_flight
            print(f"  plans in flight {plans_in_flight}, {n:4d} seqs: {row['steps_per_s']:9.1f} steps/s, "
                  f"{row['ms_per_step']:.3f} ms/step (schedule {row['schedule_ms_per_step']:.3f} ms, "
                  f"step RPC {row['step_rpc_ms_per_step']:.3f} ms)", flush=True)
            rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,64,256")
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=5, help="windows per point; the median is reported")
    parser.add_argument("--client-read", choices=("all", "first"), default="first")
    parser.add_argument("--client-window-bytes", type=int, default=1024,
                        help="HTTP/2 window of the held streams' channel with --client-read first "
                             "(0: gRPC's default)")
    parser.add_argument("--kv-cache-memory", default="64GiB",
                        help="the noop worker's pool (sized, not allocated): 256 sequences of "
                             "8000 tokens fit, so no preemption disturbs a window")
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--stream-interval-ms", type=int, default=None,
                        help="the coordinator's --stream-interval-ms (default: its own default)")
    parser.add_argument("--out", default=str(SOURCE_DIR / "bench" / "results" / "coordinator_overhead.json"))
    args = parser.parse_args()
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        sys.exit(missing)

    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="loom_overhead_bench_"))
    print(f"coordinator overhead, noop worker; logs in {log_dir}", flush=True)
    results = {}
    # Interleaved (1, 2, 1, 2, ...): a shared machine's load drifts, and both configurations
    # should see the same drift.
    all_runs = {1: [], 2: []}
    for _ in range(args.repeats):
        for plans in (1, 2):
            all_runs[plans].append(run_config(plans, args, log_dir))
    for plans, runs in all_runs.items():
        merged = []
        for i, row in enumerate(runs[0]):
            samples = [run[i] for run in runs]
            merged.append({**row,
                           "steps_per_s": statistics.median(s["steps_per_s"] for s in samples),
                           "ms_per_step": statistics.median(s["ms_per_step"] for s in samples),
                           "schedule_ms_per_step": statistics.median(s["schedule_ms_per_step"] for s in samples),
                           "step_rpc_ms_per_step": statistics.median(s["step_rpc_ms_per_step"] for s in samples),
                           "samples": [{k: s[k] for k in ("steps_per_s", "ms_per_step", "schedule_ms_per_step")}
                                       for s in samples]})
        results[plans] = merged

    print("\nsequences  steps/s(1)  steps/s(2)  ratio 2/1 (target >= %.1f)  ms/step(2) (target < %.1f at 256)"
          % (TARGET_PIPELINING_RATIO, TARGET_MS_PER_STEP_AT_256))
    summary = []
    for one, two in zip(results[1], results[2]):
        ratio = two["steps_per_s"] / one["steps_per_s"]
        summary.append({"sequences": one["sequences"], "steps_per_s_1": one["steps_per_s"],
                        "steps_per_s_2": two["steps_per_s"], "pipelining_ratio": round(ratio, 3),
                        "meets_pipelining_target": ratio >= TARGET_PIPELINING_RATIO,
                        "ms_per_step_2": two["ms_per_step"],
                        "schedule_ms_per_step_2": two["schedule_ms_per_step"]})
        print(f"{one['sequences']:9d}  {one['steps_per_s']:10.1f}  {two['steps_per_s']:10.1f}  "
              f"{ratio:9.2f}x {'ok' if ratio >= TARGET_PIPELINING_RATIO else 'MISSED':>17s}  "
              f"{two['ms_per_step']:9.3f}")
    at_256 = next((s for s in summary if s["sequences"] == 256), None)
    if at_256 is not None:
        ok = at_256["ms_per_step_2"] < TARGET_MS_PER_STEP_AT_256
        print(f"256 sequences: {at_256['ms_per_step_2']:.3f} ms per step = "
              f"{at_256['ms_per_step_2'] / TARGET_MS_PER_STEP_AT_256:.2f}x the 1 ms target "
              f"({'ok' if ok else 'MISSED'})")

    record = {
        "benchmark": "coordinator_overhead",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "provenance": provenance(),
        "host": platform.node(),
        "model": str(h.MODEL_PATH.relative_to(SOURCE_DIR)) if h.MODEL_PATH.is_relative_to(SOURCE_DIR)
        else str(h.MODEL_PATH),
        "settings": {"window_s": args.window_s, "repeats": args.repeats, "client_read": args.client_read,
                     "client_window_bytes": args.client_window_bytes if args.client_read == "first" else 0,
                     "max_tokens": args.max_tokens, "worker": "loom-worker --step-backend noop --threads 1",
                     "stream_interval_ms": args.stream_interval_ms if args.stream_interval_ms is not None
                     else "default"},
        "targets": {"ms_per_step_at_256": TARGET_MS_PER_STEP_AT_256,
                    "pipelining_ratio": TARGET_PIPELINING_RATIO},
        "baseline": "--max-plans-in-flight 1, same run (interleaved with 2)",
        "plans_in_flight_1": results[1],
        "plans_in_flight_2": results[2],
        "summary": summary,
    }
    write_record(args.out, record)


if __name__ == "__main__":
    main()
