"""Admission under overload, soaked: `loom serve` with one `loom-worker` (the no-op backend by
default, so the coordinator's control flow is what is measured; --step-backend model for the model).

1. The sustainable rate, measured first in the same run: --max-num-seqs clients in a closed loop
   (each sends its next request when the last ends) for --calibration-s; completions per second.
   Also the median per-stream token rate, the in-flight throughput baseline.
2. The soak: twice that rate as Poisson arrivals for --duration-s (10 minutes by default), a
   quarter over HTTP (/v1/completions, streamed), 10% cancelled and 10% disconnected by the
   client at a random moment in their first 2 s (tests/cluster/soak_driver.py).

Prints each figure next to its limit as a ratio:
  lost (neither completed, rejected, cancelled nor disconnected) or hung: 0
  rejections without Retry-After: 0
  rejection latency p99 (send to RESOURCE_EXHAUSTED / 429): <= 50 ms
  in-flight throughput: median per-stream tokens/s during the soak >= 0.9x the calibration's
  coordinator RSS growth from the warm-up point (a quarter in) to the end: < 5%
  after the drain: no running or waiting sequence, every KV block free, and the
  loom_kv_cache_usage_perc gauge at 0
Writes bench/results/soak.json (exit status 1 when a limit is missed).

usage: .venv/bin/python bench/soak_bench.py [--duration-s 600] [--calibration-s 60]
       [--step-backend noop|model] [--max-tokens 2000] [--max-num-seqs 4] [--max-waiting 8] [--seed 1]
       [--http-threads 4]
"""
import argparse
import datetime
import json
import os
import pathlib
import sys
import tempfile
import time
import urllib.request

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
import soak_driver  # noqa: E402
from provenance import provenance  # noqa: E402

REJECT_P99_LIMIT_MS = 50.0
THROUGHPUT_LIMIT = 0.9
RSS_GROWTH_LIMIT = 0.05
OUTCOME_TIMEOUT_S = 300


def kv_usage_gauge(http_url: str) -> list:
    base = http_url.split("/v1")[0]
    text = urllib.request.urlopen(f"{base}/metrics", timeout=30).read().decode()
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("loom_kv_cache_usage_perc{") or line.startswith("loom_kv_cache_usage_perc ")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--calibration-s", type=float, default=60)
    parser.add_argument("--step-backend", choices=("noop", "model"), default="noop")
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-waiting", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--http-threads", type=int, default=4,
                        help="the coordinator's HTTP threads (open requests hold none)")
    parser.add_argument("--output", default=str(SOURCE_DIR / "bench" / "results" / "soak.json"))
    args = parser.parse_args()
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        print(missing, file=sys.stderr)
        return 1
    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="loom-soak-"))
    worker = {"step_backend": args.step_backend, "threads": 1 if args.step_backend == "noop" else 2,
              "kv_cache_memory": "4GiB" if args.step_backend == "noop" else None}
    print(f"soak: {args.step_backend} worker, {args.duration_s:.0f} s at twice the sustainable rate; "
          f"logs in {log_dir}", flush=True)
    with h.running_cluster(log_dir, {"replica-a": worker}, print_logs=False,
                           max_num_seqs=args.max_num_seqs, max_waiting=args.max_waiting,
                           http_threads=args.http_threads) as rig:
        coordinator = rig.coordinator
        calibration = soak_driver.measure_sustainable_rate(
            coordinator, args.max_num_seqs, args.calibration_s, args.max_tokens, OUTCOME_TIMEOUT_S)
        print(f"sustainable: {calibration['rate_per_s']:.2f} requests/s "
              f"({calibration['completed']} completed in {args.calibration_s:.0f} s, "
              f"{calibration['median_stream_tokens_per_s']:.0f} tokens/s per stream)", flush=True)
        if calibration["rate_per_s"] <= 0 or calibration["not_completed"] or calibration["hung"]:
            print(f"calibration failed: {calibration}", file=sys.stderr)
            return 1
        rate = 2 * calibration["rate_per_s"]
        soak = soak_driver.run_overload(coordinator, rate, args.duration_s, args.max_tokens,
                                        OUTCOME_TIMEOUT_S, seed=args.seed,
                                        drain_timeout_s=OUTCOME_TIMEOUT_S)
        idle = True
        try:
            coordinator.wait_idle(timeout=60)
        except h.HarnessError as error:
            print(error, file=sys.stderr)
            idle = False
        blocks_in_use = soak_driver.kv_blocks_in_use(coordinator)
        gauge = kv_usage_gauge(coordinator.http_url)
        rss_after_drain = soak_driver.rss_bytes(coordinator.pid)

    counts = soak["counts"]
    reject_p99 = soak["reject_latency_ms"]["p99"]
    throughput_ratio = (soak["median_grpc_stream_tokens_per_s"] / calibration["median_stream_tokens_per_s"]
                        if soak["median_grpc_stream_tokens_per_s"] else 0.0)
    checks = {
        "nothing_lost": counts["lost"] == 0 and soak["hung"] == 0,
        "every_request_accounted": sum(counts.values()) == soak["offered"],
        "overloaded": counts["rejected"] > 0,
        "retry_after_on_every_rejection": soak["rejections_without_retry_after"] == 0,
        "reject_p99_within_limit": reject_p99 is not None and reject_p99 <= REJECT_P99_LIMIT_MS,
        "in_flight_throughput_kept": throughput_ratio >= THROUGHPUT_LIMIT,
        "rss_growth_within_limit": soak["rss_growth"] < RSS_GROWTH_LIMIT,
        "idle_with_no_kv_blocks_in_use": idle and blocks_in_use == 0 and bool(gauge) and all(v == 0 for v in gauge),
    }
    print(f"offered {soak['offered']} requests at {rate:.2f}/s (2x sustainable) over {soak['sent_s']:.0f} s: "
          + ", ".join(f"{kind} {counts[kind]}" for kind in soak_driver.KINDS), flush=True)
    print(f"  by transport: {soak['by_transport']}")
    print(f"  rejection latency: p50 {soak['reject_latency_ms']['p50']:.1f} ms, p99 {reject_p99:.1f} ms, "
          f"max {soak['reject_latency_ms']['max']:.1f} ms; p99 = {reject_p99 / REJECT_P99_LIMIT_MS:.2f}x "
          f"the {REJECT_P99_LIMIT_MS:.0f} ms limit" if reject_p99 is not None else "  no rejection")
    print(f"  in-flight throughput: {soak['median_grpc_stream_tokens_per_s'] or 0:.0f} tokens/s per gRPC stream = "
          f"{throughput_ratio:.2f}x the calibration's (limit {THROUGHPUT_LIMIT})")
    print(f"  coordinator RSS: {soak['rss_warm_bytes'] / 2**20:.1f} MiB at warm-up, "
          f"{soak['rss_end_bytes'] / 2**20:.1f} MiB at the end: growth {100 * soak['rss_growth']:.2f}% = "
          f"{soak['rss_growth'] / RSS_GROWTH_LIMIT:.2f}x the 5% limit; {rss_after_drain / 2**20:.1f} MiB after the drain")
    print(f"  after the drain: {blocks_in_use} KV blocks in use, loom_kv_cache_usage_perc {gauge}")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    result = {
        "benchmark": "soak",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "provenance": provenance(),
        "config": {"step_backend": args.step_backend, "max_tokens": args.max_tokens, "max_num_seqs": args.max_num_seqs,
                   "max_waiting": args.max_waiting, "http_threads": args.http_threads, "duration_s": args.duration_s,
                   "calibration_s": args.calibration_s, "seed": args.seed,
                   "http_fraction": 0.25, "cancel_fraction": 0.1, "disconnect_fraction": 0.1},
        "calibration": calibration,
        "soak": soak,
        "limits": {"reject_p99_ms": REJECT_P99_LIMIT_MS, "in_flight_throughput_ratio": THROUGHPUT_LIMIT,
                   "rss_growth": RSS_GROWTH_LIMIT},
        "ratios": {"reject_p99_vs_limit": reject_p99 / REJECT_P99_LIMIT_MS if reject_p99 is not None else None,
                   "in_flight_throughput": throughput_ratio,
                   "rss_growth_vs_limit": soak["rss_growth"] / RSS_GROWTH_LIMIT},
        "after_drain": {"kv_blocks_in_use": blocks_in_use, "kv_cache_usage_gauge": gauge,
                        "rss_bytes": rss_after_drain, "idle": idle},
        "checks": checks,
    }
    pathlib.Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
