#!/usr/bin/env python3
"""Serving on the CPU: Loom (`loom up`, one worker) against llama.cpp's own server
(`llama-server -np 32`) on the same GGUF with the same threads, driven by the same client.

`loom bench` drives Loom's gRPC API only, so it cannot load llama-server; both servers are
driven instead by this script's load generator through the `openai` Python client on their
OpenAI-compatible /v1/completions endpoints (streaming, include_usage, temperature 0,
ignore_eos, max_tokens 128). Each level keeps C clients busy (each sends its next request
when its last one ends) until --requests-per-level requests have finished (default:
max(2 C, 8)); the prompts are ~130 tokens of random words, distinct per request (no
shared prefix for either server's prompt cache). Figures per level: output tokens/s (all
completion tokens / wall time from the first request sent to the last one finished), TTFT
p50/p99 (first streamed text), and Loom over llama.cpp. The servers run one at a time,
alternating (Loom, llama.cpp, Loom, llama.cpp for --passes 2); medians over the passes.
After each of Loom's levels, `loom bench` (Loom's own load generator, gRPC) runs the same
level with random prompts of the measured prompt length, recorded beside it for reference
(it shows the Python client's cost; --no-loom-bench skips it).
Load averages before each part are recorded; `machine_quiet` is set only if the 1-minute
load average was below 0.5 per core before every part. The client shares the CPU with the
server it drives, alike for both.

llama-server is built by bench/setup_llamacpp.sh (bench-only; never in CI or the serving
path) and run with llama.cpp's defaults except the flags below (recorded in the JSON):
-t/-tb THREADS, -np 32 (parallel slots = the top concurrency), -c 32 x --slot-ctx.

Commands (idle machine):
  cmake --build build --target loom loom-worker
  LLAMACPP_BUILD_ROOT=/work/llamacpp bench/setup_llamacpp.sh native server
  LLAMACPP_BUILD_ROOT=/work/llamacpp .venv/bin/python bench/serving_vs_llamacpp.py
(the native build is llama.cpp as built on the machine at hand; an AVX2-only machine's native
build is its AVX2 build. Add --wait-quiet 600 to wait for a quiet machine before each part.)
Both engines on AVX2 where the machine has AVX-512 (Loom's ISA is recorded in the JSON):
  bench/setup_llamacpp.sh avx2 server
  LOOM_CPU_ISA=avx2 .venv/bin/python bench/serving_vs_llamacpp.py --llama-build avx2 \
      --out bench/results/serving_vs_llamacpp_avx2.json

usage: bench/serving_vs_llamacpp.py [--clients 32,1] [--threads 2] [--passes 2]
       [--prompt-words N] [--max-tokens 128] [--requests-per-level N] [--llama-build native]
       [--wait-quiet S] [--engines loom,llamacpp] [--no-loom-bench]
       [--out bench/results/serving_vs_llamacpp.json] [--note TEXT]
writes bench/results/serving_vs_llamacpp.json. Loom's binaries come from $LOOM_BUILD_DIR
(default build/), llama-server from $LLAMACPP_BUILD_ROOT/llamacpp-<build>/bin (default build/).
"""
import argparse
import asyncio
import datetime
import json
import os
import pathlib
import platform
import random
import socket
import statistics
import sys
import tempfile
import time
import urllib.request

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from coordinator_overhead_bench import cpu_model, git_revision  # noqa: E402
from machine_load import load_1min, wait_quiet  # noqa: E402


LLAMACPP_ROOT = pathlib.Path(os.environ.get("LLAMACPP_BUILD_ROOT", SOURCE_DIR / "build"))

WORDS = ("time person year way day thing man world life hand part child eye woman place work "
         "week case point government company number group problem fact river mountain garden "
         "window paper music story morning evening summer winter city village market bridge "
         "table chair letter question answer reason color light water stone forest field road "
         "house school family friend teacher doctor animal bird flower tree apple bread coffee "
         "green blue small large quiet bright early late simple strong gentle careful happy "
         "walk read write open close carry build paint listen travel remember explain").split()


def prompt_for(index: int, words: int) -> str:
    """Random common words, distinct per request index (same text for both servers)."""
    rng = random.Random(1000 + index)
    return "Continue this list: " + " ".join(rng.choice(WORDS) for _ in range(words))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def one_request(client, model: str, prompt: str, max_tokens: int) -> dict:
    started = time.monotonic()
    first = None
    usage = None
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            if first is None:
                first = time.monotonic()
        if getattr(chunk, "usage", None):
            usage = chunk.usage
    ended = time.monotonic()
    if usage is None:
        raise RuntimeError("the server sent no usage (stream_options.include_usage)")
    if first is None:
        raise RuntimeError("the server streamed no text")
    return {"ttft_s": first - started, "latency_s": ended - started, "started": started,
            "ended": ended, "completion_tokens": usage.completion_tokens,
            "prompt_tokens": usage.prompt_tokens}


async def level(base_url: str, model: str, clients: int, requests: int, args, offset: int) -> dict:
    import openai
    try:
        import httpx2 as httpx  # what this openai release is built on
    except ImportError:
        import httpx
    # No keep-alive: every request opens its own connection, for both servers alike
    # (llama-server closed a reused idle connection under the 1-client level, which the
    # client saw as "Server disconnected without sending a response").
    http_client = openai.DefaultAsyncHttpxClient(
        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=0))
    async with openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0,
                                  timeout=args.timeout_s, http_client=http_client) as client:
        queue = list(range(requests))
        results = []

        async def client_loop():
            while queue:
                index = queue.pop(0)
                results.append(await one_request(client, model, prompt_for(offset + index,
                                                                           args.prompt_words),
                                                 args.max_tokens))

        begin = time.monotonic()
        await asyncio.gather(*(client_loop() for _ in range(clients)))
        end = time.monotonic()
    short = [r for r in results if r["completion_tokens"] != args.max_tokens]
    if short:
        raise RuntimeError(f"{len(short)} of {requests} requests ended early: "
                           f"{[r['completion_tokens'] for r in short[:5]]} tokens")
    tokens = sum(r["completion_tokens"] for r in results)
    ttft = [r["ttft_s"] for r in results]
    return {"clients": clients, "requests": requests, "seconds": round(end - begin, 3),
            "output_tokens": tokens, "tokens_per_s": round(tokens / (end - begin), 2),
            "ttft_p50_s": round(percentile(ttft, 50), 4), "ttft_p99_s": round(percentile(ttft, 99), 4),
            "latency_p50_s": round(percentile([r["latency_s"] for r in results], 50), 4),
            "prompt_tokens_mean": round(statistics.mean(r["prompt_tokens"] for r in results), 1)}


def wait_http_ok(url: str, process, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if not process.alive():
            raise h.HarnessError(f"{process.name} exited\n{process.log_tail()}")
        if time.monotonic() > deadline:
            raise h.HarnessError(f"{url} not ready within {timeout}s\n{process.log_tail()}")
        time.sleep(0.2)


class LoomServer:
    name = "loom"

    def __init__(self, args, log_dir):
        self.args, self.log_dir = args, log_dir

    def command(self) -> str:
        return (f"loom up --model {h.MODEL_PATH.name} --threads {self.args.threads} "
                "(defaults otherwise: one replica, one worker)")

    def __enter__(self):
        self.process = h.Up(self.log_dir, threads=self.args.threads)
        self.process.wait_for_line(r"loom: ready \(1 replicas?\)", h.REGISTER_TIMEOUT_S)
        self.base_url = self.process.http_url.rstrip("/") + "/v1"
        self.model = h.MODEL_PATH.stem
        with urllib.request.urlopen(self.base_url + "/models", timeout=10) as response:
            self.model = json.loads(response.read())["data"][0]["id"]
        return self

    def __exit__(self, *exc):
        rc = self.process.stop(timeout=30)
        if rc != 0:
            print(f"warning: loom up exited with {rc}\n{self.process.log_tail()}", flush=True)


class LlamaServer:
    name = "llamacpp"

    def __init__(self, args, log_dir):
        self.args, self.log_dir = args, log_dir
        self.binary = LLAMACPP_ROOT / f"llamacpp-{args.llama_build}" / "bin" / "llama-server"
        slots = max(args.clients)
        self.flags = ["-t", str(args.threads), "-tb", str(args.threads), "-np", str(slots),
                      "-c", str(slots * args.slot_ctx)]

    def command(self) -> str:
        return f"llama-server -m {h.MODEL_PATH.name} {' '.join(self.flags)} --host 127.0.0.1 --port PORT"

    def __enter__(self):
        if not self.binary.exists():
            raise SystemExit(f"no {self.binary}: run LLAMACPP_BUILD_ROOT={LLAMACPP_ROOT} "
                             f"bench/setup_llamacpp.sh {self.args.llama_build} server")
        port = free_port()
        self.process = h.Process([self.binary, "-m", h.MODEL_PATH, *self.flags, "--host", "127.0.0.1",
                                  "--port", str(port)], "llama-server", self.log_dir)
        wait_http_ok(f"http://127.0.0.1:{port}/health", self.process, 120)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.model = h.MODEL_PATH.stem
        return self

    def __exit__(self, *exc):
        self.process.stop(timeout=30)


def loom_bench(server, clients: int, requests: int, prompt_tokens: int, args) -> dict:
    """`loom bench` (Loom's own load generator, gRPC API) at the same level, for reference:
    random token-id prompts of the length the OpenAI client's prompts had."""
    import subprocess
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([str(h.LOOM_BIN), "bench", "--address", server.process.address,
                        "--concurrency", str(clients), "--num-requests", str(requests),
                        "--input-len", str(prompt_tokens), "--output-len", str(args.max_tokens),
                        "--seed", str(clients), "--output", out.name],
                       check=True, capture_output=True, text=True, timeout=args.timeout_s)
        run = json.loads(pathlib.Path(out.name).read_text())["runs"][0]
    if run["failed"]:
        raise RuntimeError(f"loom bench: {run['failed']} requests failed: {run['errors'][:3]}")
    return {"tokens_per_s": round(run["output_throughput"], 2),
            "ttft_p50_s": round(run["ttft_ms"]["p50"] / 1000, 4),
            "ttft_p99_s": round(run["ttft_ms"]["p99"] / 1000, 4), "input_len": prompt_tokens,
            "requests": requests}


def run_server(server_class, args, log_dir, offset: int) -> dict:
    before = wait_quiet(args.quiet_limit, args.wait_quiet)
    with server_class(args, log_dir) as server:
        # Warm-up: two short requests (not measured).
        asyncio.run(level(server.base_url, server.model, 2, 2,
                          argparse.Namespace(**{**vars(args), "max_tokens": 8}), 10**6))
        rows = []
        for clients in args.clients:
            level_before = load_1min()
            requests = args.requests_per_level or max(2 * clients, 8)
            row = asyncio.run(level(server.base_url, server.model, clients, requests, args, offset))
            row["load_1min_before"] = level_before
            rows.append(row)
            offset += requests
            print(f"{server.name:8s} {clients:3d} clients: {row['tokens_per_s']:7.1f} tok/s, TTFT p50 "
                  f"{row['ttft_p50_s'] * 1000:.0f} ms p99 {row['ttft_p99_s'] * 1000:.0f} ms "
                  f"(prompt {row['prompt_tokens_mean']:.0f} tokens; load {level_before})", flush=True)
            if server_class is LoomServer and args.loom_bench:
                row["loom_bench"] = loom_bench(server, clients, requests,
                                               round(row["prompt_tokens_mean"]), args)
                print(f"{'':8s} {'':3s} loom bench (gRPC): {row['loom_bench']['tokens_per_s']:7.1f} tok/s, "
                      f"TTFT p50 {row['loom_bench']['ttft_p50_s'] * 1000:.0f} ms", flush=True)
        command = server.command()
    return {"engine": server_class.name, "command": command, "load_1min_before": before,
            "load_1min_after": load_1min(), "levels": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="32,1")
    parser.add_argument("--threads", type=int, default=2, help="both servers (default 2)")
    parser.add_argument("--passes", type=int, default=2, help="alternating passes per server")
    parser.add_argument("--prompt-words", type=int, default=126, help="~130 prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests-per-level", type=int, default=0,
                        help="default max(2 x clients, 8)")
    parser.add_argument("--slot-ctx", type=int, default=384,
                        help="llama-server context per slot (-c = slots x this)")
    parser.add_argument("--llama-build", default="native",
                        help="$LLAMACPP_BUILD_ROOT/llamacpp-<name> (default native)")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--out", default=str(SOURCE_DIR / "bench" / "results" / "serving_vs_llamacpp.json"))
    parser.add_argument("--no-loom-bench", dest="loom_bench", action="store_false",
                        help="skip `loom bench` (gRPC) at each level of Loom's passes")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                        help="before each server start, wait up to S seconds for a quiet machine")
    parser.add_argument("--engines", default="loom,llamacpp", help="for trials: loom or llamacpp alone")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    engines = [e for e in (LoomServer, LlamaServer) if e.name in args.engines.split(",")]
    args.clients = [int(c) for c in args.clients.split(",")]
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        sys.exit(missing)
    cores = len(os.sched_getaffinity(0))
    quiet_limit = args.quiet_limit = 0.5 * cores

    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="serving_vs_llamacpp_"))
    parts = []
    offset = 0
    for index in range(args.passes):
        for server_class in engines:
            part = run_server(server_class, args, log_dir, offset)
            part["pass"] = index + 1
            parts.append(part)
            offset += 10_000

    summary = []
    for clients in args.clients:
        row = {"clients": clients}
        for engine in [e.name for e in engines]:
            levels = [lv for p in parts if p["engine"] == engine for lv in p["levels"]
                      if lv["clients"] == clients]
            row[engine] = {key: round(statistics.median(lv[key] for lv in levels), 4)
                           for key in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s", "latency_p50_s",
                                       "prompt_tokens_mean")}
            row[engine]["samples_tokens_per_s"] = [lv["tokens_per_s"] for lv in levels]
            grpc = [lv["loom_bench"] for lv in levels if "loom_bench" in lv]
            if grpc:
                row[engine]["loom_bench_grpc"] = {
                    key: round(statistics.median(g[key] for g in grpc), 4)
                    for key in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s")}
        summary.append(row)
        if len(engines) < 2:
            continue
        row["loom_over_llamacpp_throughput"] = round(
            row["loom"]["tokens_per_s"] / row["llamacpp"]["tokens_per_s"], 3)
        row["llamacpp_over_loom_ttft_p50"] = round(
            row["llamacpp"]["ttft_p50_s"] / row["loom"]["ttft_p50_s"], 3)
        row["llamacpp_over_loom_ttft_p99"] = round(
            row["llamacpp"]["ttft_p99_s"] / row["loom"]["ttft_p99_s"], 3)
        print(f"{clients:3d} clients: Loom {row['loom']['tokens_per_s']:.1f} tok/s vs llama.cpp "
              f"{row['llamacpp']['tokens_per_s']:.1f} = {row['loom_over_llamacpp_throughput']:.2f}x; "
              f"TTFT p50 {row['loom']['ttft_p50_s'] * 1000:.0f} vs {row['llamacpp']['ttft_p50_s'] * 1000:.0f} ms",
              flush=True)

    top = next((r for r in summary if r["clients"] == 32), None)
    targets = {}
    if top and len(engines) == 2:
        targets["throughput_32_clients_ge_2x_llamacpp"] = top["loom_over_llamacpp_throughput"] >= 2
        targets["ttft_p50_32_clients_le_llamacpp"] = (top["loom"]["ttft_p50_s"]
                                                      <= top["llamacpp"]["ttft_p50_s"])
    loads = [p["load_1min_before"] for p in parts] + [lv["load_1min_before"] for p in parts
                                                       for lv in p["levels"]]
    machine_quiet = all(load < quiet_limit for load in loads)
    record = {
        "benchmark": "serving_vs_llamacpp",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "revision": git_revision(),
        "command": " ".join([os.path.relpath(sys.argv[0], SOURCE_DIR)] + sys.argv[1:]),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "host": platform.node()},
        "model": h.MODEL_PATH.name,
        "machine_quiet": machine_quiet,
        "machine_quiet_rule": f"1-minute load average < 0.5 per core ({quiet_limit:g}) before every "
                              "server start and every level",
        "settings": {"threads": args.threads, "clients": args.clients, "max_tokens": args.max_tokens,
                     "prompt_words": args.prompt_words, "temperature": 0, "ignore_eos": True,
                     "stream": True, "requests_per_level": args.requests_per_level or "max(2 x clients, 8)",
                     "client": "openai Python client (AsyncOpenAI), /v1/completions, one per server",
                     "llamacpp_build": f"llama-cpp-python 0.3.36 (source build, bench/setup_llamacpp.sh "
                                       f"{args.llama_build} server)",
                     "loom_cpu_isa": os.environ.get("LOOM_CPU_ISA") or "automatic (the best the CPU has)"},
        "passes": parts,
        "summary": summary,
        "targets_met": targets,
    }
    notes = [args.note] if args.note else []
    if not machine_quiet:
        notes.append(f"machine not quiet: 1-minute load average {min(loads)}-{max(loads)} on {cores} "
                     f"cores (limit {quiet_limit:g}); rerun on an idle machine")
    if notes:
        record["note"] = " ".join(notes)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
