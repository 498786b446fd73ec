"""End-to-end CPU serving: `loom up` on the default model (one replica by default, a worker with
all cores), and 1, 8 and 32 concurrent clients, each sending the same fixed prompts with
max_tokens 64 and ignore_eos. Reports the total output tokens/s of each round (tokens received /
wall time from the first request sent to the last one finished), median over --repeats rounds,
as a ratio against the single-stream decode rate of `loom generate` (the in-process engine, same
threads) measured in the same run from its stderr line `decode: N tokens in S s (R tokens/s)`.
Also reports median time to first token and end-to-end latency. Writes
bench/results/serving_cpu.json.

usage: .venv/bin/python bench/serving_cpu_bench.py [--clients 1,8,32] [--repeats 3]
       [--max-tokens 64] [--replicas 1] [--threads N]
"""
import argparse
import datetime
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance, write_record  # noqa: E402

PROMPTS = (
    "The capital of France is",
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue in simple words.",
    "List five uses of a paper clip:",
)

BASELINE_PROMPT = "Once upon a time, in a small village by the sea, there lived"


def baseline(args) -> dict:
    """`loom generate` single-stream decode rate, median of --repeats runs. `loom generate` stops
    at EOS (it has no ignore_eos), so it runs on a prompt whose greedy continuation is long."""
    rates = []
    for _ in range(args.repeats):
        result = h.loom_generate(BASELINE_PROMPT, args.max_tokens, threads=args.threads,
                                 extra=["--temperature", "0"])
        if result.decode_tokens < args.max_tokens // 2:
            raise h.HarnessError(f"loom generate decoded only {result.decode_tokens} tokens of "
                                 f"{BASELINE_PROMPT!r}: too few for a rate")
        rates.append(result.decode_tokens_per_s)
    return {"decode_tokens_per_s": statistics.median(rates), "samples": rates,
            "prompt": BASELINE_PROMPT}


def round_of(stub, clients: int, max_tokens: int) -> dict:
    requests = [h.make_request(PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens, ignore_eos=True)
                for i in range(clients)]
    started = time.monotonic()
    outcomes = h.generate_all(stub, requests, timeout=600)
    elapsed = time.monotonic() - started
    bad = [o.describe() for o in outcomes if not o.finished or len(o.token_ids) != max_tokens]
    if bad:
        raise h.HarnessError(f"{len(bad)} of {clients} requests did not complete: {bad[:3]}")
    tokens = sum(len(o.token_ids) for o in outcomes)
    return {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed,
            "ttft_s": statistics.median(o.first_token_at - o.started for o in outcomes),
            "latency_s": statistics.median(o.ended_at - o.started for o in outcomes)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="per worker (default: cores / replicas)")
    parser.add_argument("--out", default=str(SOURCE_DIR / "bench" / "results" / "serving_cpu.json"))
    args = parser.parse_args()
    if args.threads <= 0:
        args.threads = max(1, (os.cpu_count() or 1) // args.replicas)
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        sys.exit(missing)

    base = baseline(args)
    print(f"loom generate, 1 stream, {args.threads} threads: {base['decode_tokens_per_s']:.1f} decode tokens/s "
          f"(median of {base['samples']})", flush=True)

    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="loom_serving_bench_"))
    up = h.Up(log_dir, replicas=args.replicas, threads=args.threads)
    rows = []
    try:
        up.wait_for_line(rf"loom: ready \({args.replicas} replicas?\)", h.REGISTER_TIMEOUT_S)
        round_of(up.stub, 2, 8)  # warm up
        for clients in (int(c) for c in args.clients.split(",")):
            rounds = [round_of(up.stub, clients, args.max_tokens) for _ in range(args.repeats)]
            rate = statistics.median(r["tokens_per_s"] for r in rounds)
            row = {"clients": clients, "tokens_per_s": round(rate, 1),
                   "vs_loom_generate": round(rate / base["decode_tokens_per_s"], 3),
                   "ttft_s": round(statistics.median(r["ttft_s"] for r in rounds), 4),
                   "latency_s": round(statistics.median(r["latency_s"] for r in rounds), 4),
                   "samples_tokens_per_s": [round(r["tokens_per_s"], 1) for r in rounds]}
            rows.append(row)
            print(f"{clients:3d} clients: {row['tokens_per_s']:8.1f} output tokens/s = "
                  f"{row['vs_loom_generate']:.2f}x loom generate; median TTFT {row['ttft_s'] * 1000:.0f} ms, "
                  f"latency {row['latency_s']:.2f} s", flush=True)
        status = up.replicas()
    finally:
        rc = up.stop(timeout=30)
    if rc != 0:
        print(f"warning: loom up exited with {rc}\n{up.log_tail()}")

    record = {
        "benchmark": "serving_cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "provenance": provenance(),
        "host": platform.node(),
        "model": str(h.MODEL_PATH.relative_to(SOURCE_DIR)) if h.MODEL_PATH.is_relative_to(SOURCE_DIR)
        else str(h.MODEL_PATH),
        "settings": {"replicas": args.replicas, "threads_per_worker": args.threads,
                     "max_tokens": args.max_tokens, "ignore_eos": True, "repeats": args.repeats,
                     "prompts": list(PROMPTS)},
        "baseline": {"what": "loom generate single-stream decode tokens/s, same threads, same run", **base},
        "results": rows,
        "replicas_at_end": {rid: {"num_steps": r.num_steps, "num_mixed_steps": r.num_mixed_steps,
                                  "num_preemptions": r.num_preemptions} for rid, r in status.items()},
    }
    write_record(args.out, record)


if __name__ == "__main__":
    main()
