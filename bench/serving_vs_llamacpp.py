#!/usr/bin/env python3
"""Serving on the CPU: Loom (`loom up`, one worker) against llama.cpp's own server
(`llama-server -np 32`) on the same GGUF with the same threads, driven by the same client.

The client (--client, default loom-bench) is `loom bench --api openai`, Loom's load
generator (C++) on the OpenAI-compatible /v1/completions endpoint of either server:
streaming, include_usage, temperature 0, ignore_eos, max_tokens 128, prompts of exactly
--prompt-tokens random token ids (the same ids for both servers; distinct per request, so
neither server's prompt cache finds a shared prefix). --client openai-python drives both
with the `openai` Python client instead (prompts of ~130 tokens of random words, as the
first runs of this bench did); it shares the 2 cores with the server and costs Loom
about 8% (see the JSON's gRPC reference).
Each level keeps C clients busy (each sends its next request when its last one ends) until
--requests-per-level requests have finished (default: max(2 C, 8)). Figures per level:
output tokens/s (all completion tokens / wall time from the first request sent to the last
one finished), TTFT p50/p99 (first streamed text), and Loom over llama.cpp. The servers run
one at a time, alternating (Loom, llama.cpp, Loom, llama.cpp for --passes 2); medians over
the passes.
Loom runs as `loom` (its defaults: float activations into the INT4/INT8 layers) and, with
--engines loom,loom-int8,llamacpp, also as `loom-int8` (`--activations int8`: each layer's
input quantized per 32 values for integer dot products, the arithmetic llama.cpp's CPU
backend uses for Q4_1 weights with its Q8_1 activations).
--grpc-reference also runs `loom bench` over Loom's gRPC API after each of Loom's levels.
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
       [--client loom-bench|openai-python] [--prompt-tokens 130] [--prompt-words N]
       [--max-tokens 128] [--requests-per-level N] [--llama-build native] [--wait-quiet S]
       [--engines loom,llamacpp] [--grpc-reference]
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
from provenance import provenance  # noqa: E402
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


async def python_level(base_url: str, model: str, clients: int, requests: int, args, offset: int) -> dict:
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


def loom_bench_level(server, clients: int, requests: int, args, seed: int) -> dict:
    """One level driven by `loom bench --api openai` on the server's /v1/completions."""
    import subprocess
    vocab = ["--vocab-size", str(server.vocab_size)] if server.vocab_size else []
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        done = subprocess.run(
            [str(h.LOOM_BIN), "bench", "--api", "openai", "--base-url", server.base_url,
             "--model", server.model, *vocab, "--concurrency", str(clients),
             "--num-requests", str(requests), "--input-len", str(args.prompt_tokens),
             "--output-len", str(args.max_tokens), "--warmup", "0", "--seed", str(seed),
             "--timeout-s", str(args.timeout_s), "--output", out.name],
            capture_output=True, text=True, timeout=args.timeout_s * 2)
        if done.returncode != 0:
            raise RuntimeError(f"loom bench exited {done.returncode}: {done.stderr[-2000:]}")
        run = json.loads(pathlib.Path(out.name).read_text())["runs"][0]
    if run["failed"]:
        raise RuntimeError(f"{server.name}: {run['failed']} requests failed: {run['errors'][:3]}")
    if run["output_tokens"] != requests * args.max_tokens:
        raise RuntimeError(f"{server.name}: {run['output_tokens']} output tokens, expected "
                           f"{requests} x {args.max_tokens}")
    return {"clients": clients, "requests": requests, "seconds": round(run["duration_s"], 3),
            "output_tokens": run["output_tokens"], "tokens_per_s": round(run["output_throughput"], 2),
            "ttft_p50_s": round(run["ttft_ms"]["p50"] / 1000, 4),
            "ttft_p99_s": round(run["ttft_ms"]["p99"] / 1000, 4),
            "latency_p50_s": round(run["e2e_ms"]["p50"] / 1000, 4),
            "prompt_tokens_mean": round(run["input_tokens"] / requests, 1)}


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
    """`loom up` with its defaults, or with `flags` (engine `name`)."""
    is_loom = True

    def __init__(self, name: str, flags: dict, args, log_dir):
        self.name, self.flags, self.args, self.log_dir = name, flags, args, log_dir

    def command(self) -> str:
        extra = "".join(f" --{k.replace('_', '-')} {v}" for k, v in self.flags.items())
        return (f"loom up --model {h.MODEL_PATH.name} --threads {self.args.threads}{extra} "
                "(defaults otherwise: one replica, one worker)")

    def __enter__(self):
        self.process = h.Up(self.log_dir, threads=self.args.threads, **self.flags)
        self.process.wait_for_line(r"loom: ready \(1 replicas?\)", h.REGISTER_TIMEOUT_S)
        self.base_url = self.process.http_url.rstrip("/") + "/v1"
        self.model = h.MODEL_PATH.stem
        with urllib.request.urlopen(self.base_url + "/models", timeout=10) as response:
            self.model = json.loads(response.read())["data"][0]["id"]
        models = self.process.stub.ListModels(h.stubs().pb.ListModelsRequest(), timeout=10)
        self.vocab_size = models.models[0].info.vocab_size
        return self

    def __exit__(self, *exc):
        rc = self.process.stop(timeout=30)
        if rc != 0:
            print(f"warning: loom up exited with {rc}\n{self.process.log_tail()}", flush=True)


class LlamaServer:
    name = "llamacpp"
    is_loom = False
    vocab_size = 0  # loom bench reads it from /v1/models (meta.n_vocab)

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


def grpc_reference(server, clients: int, requests: int, prompt_tokens: int, args, seed: int) -> dict:
    """`loom bench` over Loom's gRPC API at the same level, for reference: random token-id
    prompts of the length the level's prompts had (a seed of their own: the level's prompts
    are in the prefix cache now)."""
    import subprocess
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([str(h.LOOM_BIN), "bench", "--address", server.process.address,
                        "--concurrency", str(clients), "--num-requests", str(requests),
                        "--input-len", str(prompt_tokens), "--output-len", str(args.max_tokens),
                        "--seed", str(seed), "--output", out.name],
                       check=True, capture_output=True, text=True, timeout=args.timeout_s)
        run = json.loads(pathlib.Path(out.name).read_text())["runs"][0]
    if run["failed"]:
        raise RuntimeError(f"loom bench: {run['failed']} requests failed: {run['errors'][:3]}")
    return {"tokens_per_s": round(run["output_throughput"], 2),
            "ttft_p50_s": round(run["ttft_ms"]["p50"] / 1000, 4),
            "ttft_p99_s": round(run["ttft_ms"]["p99"] / 1000, 4), "input_len": prompt_tokens,
            "requests": requests}


def run_server(make_server, args, log_dir, pass_index: int) -> dict:
    """One server's part of a pass: every level. The same prompts for every server of a pass
    (loom-bench client: seed = pass x 1000 + clients; openai-python: prompt indices)."""
    before = wait_quiet(args.quiet_limit, args.wait_quiet)
    offset = pass_index * 10_000
    with make_server(args, log_dir) as server:
        # Warm-up: two short requests (not measured).
        warm = argparse.Namespace(**{**vars(args), "max_tokens": 8})
        if args.client == "loom-bench":
            loom_bench_level(server, 2, 2, warm, seed=10**6)
        else:
            asyncio.run(python_level(server.base_url, server.model, 2, 2, warm, 10**6))
        rows = []
        for clients in args.clients:
            level_before = load_1min()
            requests = args.requests_per_level or max(2 * clients, 8)
            if args.client == "loom-bench":
                row = loom_bench_level(server, clients, requests, args, seed=pass_index * 1000 + clients)
            else:
                row = asyncio.run(python_level(server.base_url, server.model, clients, requests, args,
                                               offset))
            row["load_1min_before"] = level_before
            rows.append(row)
            offset += requests
            print(f"{server.name:9s} {clients:3d} clients: {row['tokens_per_s']:7.1f} tok/s, TTFT p50 "
                  f"{row['ttft_p50_s'] * 1000:.0f} ms p99 {row['ttft_p99_s'] * 1000:.0f} ms "
                  f"(prompt {row['prompt_tokens_mean']:.0f} tokens; load {level_before})", flush=True)
            if server.is_loom and args.grpc_reference:
                row["loom_bench_grpc"] = grpc_reference(server, clients, requests,
                                                        round(row["prompt_tokens_mean"]), args,
                                                        seed=pass_index * 1000 + clients + 500)
                print(f"{'':9s} {'':3s} loom bench (gRPC): {row['loom_bench_grpc']['tokens_per_s']:7.1f} "
                      f"tok/s, TTFT p50 {row['loom_bench_grpc']['ttft_p50_s'] * 1000:.0f} ms", flush=True)
        command = server.command()
    return {"engine": server.name, "command": command, "load_1min_before": before,
            "load_1min_after": load_1min(), "levels": rows}


ENGINES = {
    "loom": lambda args, log_dir: LoomServer("loom", {}, args, log_dir),
    "loom-int8": lambda args, log_dir: LoomServer("loom-int8", {"activations": "int8"}, args, log_dir),
    "llamacpp": lambda args, log_dir: LlamaServer(args, log_dir),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="32,1")
    parser.add_argument("--threads", type=int, default=2, help="both servers (default 2)")
    parser.add_argument("--passes", type=int, default=2, help="alternating passes per server")
    parser.add_argument("--client", choices=("loom-bench", "openai-python"), default="loom-bench")
    parser.add_argument("--prompt-tokens", type=int, default=130,
                        help="loom-bench client: prompt length in tokens")
    parser.add_argument("--prompt-words", type=int, default=126,
                        help="openai-python client: words per prompt (~130 tokens)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests-per-level", type=int, default=0,
                        help="default max(2 x clients, 8)")
    parser.add_argument("--slot-ctx", type=int, default=384,
                        help="llama-server context per slot (-c = slots x this)")
    parser.add_argument("--llama-build", default="native",
                        help="$LLAMACPP_BUILD_ROOT/llamacpp-<name> (default native)")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--out", default=str(SOURCE_DIR / "bench" / "results" / "serving_vs_llamacpp.json"))
    parser.add_argument("--grpc-reference", action="store_true",
                        help="also run `loom bench` over gRPC at each level of Loom's passes")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                        help="before each server start, wait up to S seconds for a quiet machine")
    parser.add_argument("--engines", default="loom,llamacpp",
                        help=f"in order, of {','.join(ENGINES)} (one alone for trials)")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    engines = args.engines.split(",")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        sys.exit(f"unknown engines {unknown}: choose from {list(ENGINES)}")
    args.clients = [int(c) for c in args.clients.split(",")]
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        sys.exit(missing)
    cores = len(os.sched_getaffinity(0))
    quiet_limit = args.quiet_limit = 0.5 * cores

    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="serving_vs_llamacpp_"))
    parts = []
    for index in range(args.passes):
        for engine in engines:
            part = run_server(ENGINES[engine], args, log_dir, index)
            part["pass"] = index + 1
            parts.append(part)

    summary = []
    looms = [e for e in engines if e != "llamacpp"]
    for clients in args.clients:
        row = {"clients": clients}
        for engine in engines:
            levels = [lv for p in parts if p["engine"] == engine for lv in p["levels"]
                      if lv["clients"] == clients]
            row[engine] = {key: round(statistics.median(lv[key] for lv in levels), 4)
                           for key in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s", "latency_p50_s",
                                       "prompt_tokens_mean")}
            row[engine]["samples_tokens_per_s"] = [lv["tokens_per_s"] for lv in levels]
            grpc = [lv["loom_bench_grpc"] for lv in levels if "loom_bench_grpc" in lv]
            if grpc:
                row[engine]["loom_bench_grpc"] = {
                    key: round(statistics.median(g[key] for g in grpc), 4)
                    for key in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s")}
        summary.append(row)
        if "llamacpp" not in engines:
            continue
        for loom in looms:
            # "loom_over_llamacpp_*" for Loom's defaults, "<engine>_over_llamacpp_*" otherwise.
            ratio = row[loom]["tokens_per_s"] / row["llamacpp"]["tokens_per_s"]
            row[f"{loom}_over_llamacpp_throughput"] = round(ratio, 3)
            row[f"llamacpp_over_{loom}_ttft_p50"] = round(
                row["llamacpp"]["ttft_p50_s"] / row[loom]["ttft_p50_s"], 3)
            row[f"llamacpp_over_{loom}_ttft_p99"] = round(
                row["llamacpp"]["ttft_p99_s"] / row[loom]["ttft_p99_s"], 3)
            print(f"{clients:3d} clients: {loom} {row[loom]['tokens_per_s']:.1f} tok/s vs llama.cpp "
                  f"{row['llamacpp']['tokens_per_s']:.1f} = {ratio:.2f}x; TTFT p50 "
                  f"{row[loom]['ttft_p50_s'] * 1000:.0f} vs {row['llamacpp']['ttft_p50_s'] * 1000:.0f} ms",
                  flush=True)

    top = next((r for r in summary if r["clients"] == 32), None)
    targets = {}
    if top and "llamacpp" in engines:
        for loom in looms:
            prefix = "" if loom == "loom" else f"{loom}_"
            targets[f"{prefix}throughput_32_clients_ge_2x_llamacpp"] = (
                top[f"{loom}_over_llamacpp_throughput"] >= 2)
            targets[f"{prefix}ttft_p50_32_clients_le_llamacpp"] = (
                top[loom]["ttft_p50_s"] <= top["llamacpp"]["ttft_p50_s"])
    loads = [p["load_1min_before"] for p in parts] + [lv["load_1min_before"] for p in parts
                                                       for lv in p["levels"]]
    machine_quiet = all(load < quiet_limit for load in loads)
    record = {
        "benchmark": "serving_vs_llamacpp",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "provenance": provenance(),
        "command": " ".join([os.path.relpath(sys.argv[0], SOURCE_DIR)] + sys.argv[1:]),
        "host": platform.node(),
        "model": h.MODEL_PATH.name,
        "machine_quiet": machine_quiet,
        "machine_quiet_rule": f"1-minute load average < 0.5 per core ({quiet_limit:g}) before every "
                              "server start and every level",
        "settings": {"threads": args.threads, "clients": args.clients, "max_tokens": args.max_tokens,
                     **({"prompt_tokens": args.prompt_tokens} if args.client == "loom-bench"
                        else {"prompt_words": args.prompt_words}),
                     "temperature": 0, "ignore_eos": True,
                     "stream": True, "requests_per_level": args.requests_per_level or "max(2 x clients, 8)",
                     "client": ("loom bench --api openai (C++), /v1/completions, token-id prompts"
                                if args.client == "loom-bench" else
                                "openai Python client (AsyncOpenAI), /v1/completions, one per server"),
                     "engines": {e: ENGINES[e](args, log_dir).command() for e in engines},
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
