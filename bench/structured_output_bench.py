"""Throughput of constrained decoding under load: `loom up` on the default model, 16
concurrent chat requests through the official `openai` client, constrained (a JSON schema,
or a required tool call) against unconstrained, in the same run, alternating rounds.

Every request produces exactly --max-tokens tokens, so the rounds compare like for like:
unconstrained rounds set ignore_eos; constrained rounds use a schema whose shortest
document is longer than --max-tokens (an array of at least 200 short strings), so the
grammar never lets the reply end early ("length" each time). Reports output tokens/s per
round kind (median of --repeats) and the ratio constrained / unconstrained (target >= 0.9).
Writes bench/results/structured_output_serving.json.

usage: .venv/bin/python bench/structured_output_bench.py [--clients 16] [--repeats 3]
       [--max-tokens 64] [--threads N]
"""
import argparse
import concurrent.futures
import datetime
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import openai

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance, write_record  # noqa: E402

MESSAGES = [{"role": "user", "content": "List many short words as a JSON array."}]
# No document shorter than 200 strings: the reply always runs to max_tokens.
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 200}
TOOL = {"type": "function", "function": {"name": "record_words", "parameters": {
    "type": "object", "properties": {"words": SCHEMA}, "required": ["words"]}}}
KINDS = {
    "unconstrained": {"extra_body": {"ignore_eos": True}},
    "json_schema": {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "words", "schema": SCHEMA, "strict": True}}},
    "tool_call_required": {"tools": [TOOL], "tool_choice": "required"},
}


def round_of(client, model, kind: str, clients: int, max_tokens: int) -> dict:
    def one(i):
        response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens,
                                                  temperature=1.0, seed=i, **KINDS[kind])
        return response.usage.completion_tokens, response.choices[0].finish_reason

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(one, range(clients)))
    elapsed = time.monotonic() - started
    bad = [r for r in results if r[0] != max_tokens or r[1] != "length"]
    if bad:
        raise h.HarnessError(f"{kind}: {len(bad)} of {clients} replies were not {max_tokens} tokens: {bad[:3]}")
    tokens = sum(r[0] for r in results)
    return {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="worker threads (default: all cores)")
    parser.add_argument("--out", default=str(SOURCE_DIR / "bench" / "results" / "structured_output_serving.json"))
    args = parser.parse_args()
    args.threads = args.threads or os.cpu_count() or 1
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        sys.exit(missing)

    load_before = os.getloadavg()
    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="loom_structured_bench_"))
    up = h.Up(log_dir, replicas=1, threads=args.threads)
    samples = {kind: [] for kind in KINDS}
    try:
        up.wait_healthy(["replica-0"], timeout=300)
        client = openai.OpenAI(base_url=up.http_url + "/v1", api_key="unused", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        for kind in KINDS:  # warm up (compiles the grammars once: later rounds hit the cache)
            round_of(client, model, kind, 2, args.max_tokens)
        for _ in range(args.repeats):
            for kind in KINDS:
                samples[kind].append(round_of(client, model, kind, args.clients, args.max_tokens))
    finally:
        rc = up.stop(timeout=30)
    if rc != 0:
        print(f"warning: loom up exited with {rc}\n{up.log_tail()}")

    rates = {kind: statistics.median(s["tokens_per_s"] for s in runs) for kind, runs in samples.items()}
    base = rates["unconstrained"]
    results = []
    for kind, rate in rates.items():
        row = {"kind": kind, "tokens_per_s": round(rate, 1), "vs_unconstrained": round(rate / base, 3),
               "samples_tokens_per_s": [round(s["tokens_per_s"], 1) for s in samples[kind]]}
        results.append(row)
        print(f"{args.clients} clients, {kind:20s} {row['tokens_per_s']:8.1f} output tokens/s = "
              f"{row['vs_unconstrained']:.3f}x unconstrained (target >= 0.9)", flush=True)

    record = {
        "benchmark": "structured_output_serving",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "provenance": provenance(),
        "machine": {"host": platform.node(),
                    # Other processes' load skews single rounds: compare the samples too.
                    "loadavg_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "settings": {"clients": args.clients, "max_tokens": args.max_tokens, "repeats": args.repeats,
                     "threads": args.threads, "temperature": 1.0, "schema": SCHEMA},
        "target": "constrained tokens/s >= 0.9 x unconstrained, same run",
        "results": results,
    }
    write_record(args.out, record)


if __name__ == "__main__":
    main()
