"""Prefix caching and prefix-aware routing, end to end on CPU (`loom up`, the default model).

Three measurements, each against a baseline measured in the same run:

1. TTFT with a shared 1024-token system prompt and short user turns: median time to first token
   with prefix caching on (the system prompt primed once) vs off. Target: >= 5x lower.
2. A multi-turn chat workload on 4 single-worker replicas (`loom up --replicas 4 --threads 1`):
   concurrent conversations, each with its own system prompt, resending its whole history (its
   own generated tokens included) every turn. Output tokens/s and prefix-cache hit rate (cached
   prompt tokens / prompt tokens, from the responses) for --routing prefix, round-robin and
   least-loaded; each (round, policy) on a fresh cluster, the policies' order rotated per round,
   medians over --chat-repeats rounds. Target: prefix >= 1.5x round-robin throughput.
3. Overhead when nothing is shared: output tokens/s on unique random prompts with caching on vs
   off, rounds alternated, medians. Target: >= 0.98. Also the coordinator's scheduling time per
   step on vs off (what caching adds to), which the machine's background noise does not drown.

Prompts are token ids (exact lengths; the history of a conversation is its ids, so a turn's
prefix is exactly the previous turn's prompt and answer). Writes bench/results/prefix_cache.json.

usage: .venv/bin/python bench/prefix_cache_bench.py [--quick]
"""
import argparse
import datetime
import os
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import threading
import time

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance, write_record  # noqa: E402

PARAGRAPH = ("The coordinator schedules continuous batches across replicas and owns the block table "
             "of every replica's paged key-value cache. Workers run the transformer on the blocks "
             "they are told to use, and report the tokens they sample. Requests that share a prefix "
             "can reuse the blocks computed for it instead of computing them again. ")
QUESTIONS = ("How are blocks shared?", "What does a worker report?", "Why is prefill expensive?",
             "Summarize the design in one sentence.", "What happens on preemption?",
             "Which replica gets a request?", "What is the block size?", "Explain the router.")


def tokenize(stub, text: str) -> list:
    response = stub.Tokenize(h.stubs().pb.TokenizeRequest(text=text, add_special_tokens=False),
                             timeout=h.RPC_TIMEOUT_S)
    return list(response.token_ids)


def system_prompt(stub, length: int, variant: int = 0) -> list:
    """`length` token ids of realistic text; `variant` makes a different prompt of that length."""
    text = f"System prompt {variant}. " + PARAGRAPH * (length // 40 + 2)
    ids = tokenize(stub, text)
    if len(ids) < length:
        raise h.HarnessError(f"the paragraph gave only {len(ids)} tokens")
    return ids[:length]


def call(stub, token_ids: list, max_tokens: int, **fields) -> dict:
    """One Generate call: TTFT, tokens, cached prompt tokens."""
    request = h.make_request(token_ids=token_ids, max_tokens=max_tokens, ignore_eos=True)
    for key, value in fields.items():
        setattr(request, key, value)
    started = time.monotonic()
    first = None
    tokens = []
    last = None
    replica_id = ""
    for message in stub.Generate(request, timeout=600):
        if message.token_ids and first is None:
            first = time.monotonic()
        tokens.extend(message.token_ids)
        replica_id = replica_id or message.replica_id  # only the first message names it
        last = message
    if last is None or last.finish_reason == 0 or len(tokens) != max_tokens:
        raise h.HarnessError(f"request did not complete: {last}")
    return {"ttft_s": first - started, "latency_s": time.monotonic() - started, "tokens": tokens,
            "prompt_tokens": last.prompt_tokens, "cached_prompt_tokens": last.cached_prompt_tokens,
            "replica_id": replica_id}


def start_up(log_dir: pathlib.Path, replicas: int, threads: int, **flags) -> h.Up:
    up = h.Up(log_dir, replicas=replicas, threads=threads, http_port=-1, **flags)
    up.wait_for_line(rf"loom: ready \({replicas} replicas?\)", h.REGISTER_TIMEOUT_S)
    return up


# ---------------------------------------------------------------------------------------------
# 1. TTFT with a shared system prompt.

def ttft_bench(log_dir, args) -> dict:
    servers = {mode: start_up(log_dir / f"ttft_{mode}", 1, args.threads, prefix_caching=mode)
               for mode in ("on", "off")}
    try:
        stub = servers["on"].stub
        system = system_prompt(stub, 1024)
        turns = [tokenize(stub, f"\nUser: {q}\nAssistant:") for q in QUESTIONS]
        for server in servers.values():
            call(server.stub, system + turns[0], 2)  # warm up (and prime the cache)
        samples = {"on": [], "off": []}
        cached = []
        for repeat in range(args.ttft_repeats):
            for i, turn in enumerate(turns):
                # A user turn nobody sent before (the repeat number varies it), alternating modes.
                user = turn + tokenize(stub, f" ({repeat})")
                for mode in (("on", "off") if (repeat + i) % 2 == 0 else ("off", "on")):
                    result = call(servers[mode].stub, system + user, 4)
                    samples[mode].append(result["ttft_s"])
                    if mode == "on":
                        cached.append(result["cached_prompt_tokens"] / result["prompt_tokens"])
    finally:
        for server in servers.values():
            server.stop(timeout=30)
    on, off = statistics.median(samples["on"]), statistics.median(samples["off"])
    row = {"system_prompt_tokens": len(system), "requests_per_mode": len(samples["on"]),
           "median_ttft_s_cached": round(on, 4), "median_ttft_s_uncached": round(off, 4),
           "ttft_reduction": round(off / on, 2), "target_reduction": 5.0,
           "mean_cached_fraction_of_prompt": round(statistics.mean(cached), 3),
           "samples_s": {k: [round(v, 4) for v in vs] for k, vs in samples.items()}}
    print(f"TTFT, {len(system)}-token shared system prompt: cached {on * 1000:.0f} ms vs uncached "
          f"{off * 1000:.0f} ms median = {off / on:.1f}x lower (target 5x); "
          f"{row['mean_cached_fraction_of_prompt']:.0%} of each prompt served from cache", flush=True)
    return row


# ---------------------------------------------------------------------------------------------
# 2. Multi-turn chat across 4 replicas, by routing policy.

def chat_workload(stub, args) -> list:
    """Per conversation: its system prompt ids and its user turns' ids (fixed by the seed)."""
    rng = random.Random(7)
    conversations = []
    for c in range(args.conversations):
        system = system_prompt(stub, args.chat_system_tokens, variant=c)
        turns = []
        for t in range(args.turns):
            words = " ".join(rng.choice(PARAGRAPH.split()) for _ in range(rng.randint(12, 40)))
            turns.append(tokenize(stub, f"\nUser: {words}?\nAssistant:"))
        conversations.append((system, turns))
    return conversations


def chat_round(stub, conversations, args) -> dict:
    results = []
    errors = []
    lock = threading.Lock()

    def converse(system, turns):
        try:
            history = list(system)
            for turn in turns:
                history += turn
                result = call(stub, history, args.chat_max_tokens)
                history += result["tokens"]
                with lock:
                    results.append(result)
        except Exception as error:  # noqa: BLE001 (reported below)
            with lock:
                errors.append(repr(error))

    started = time.monotonic()
    threads = [threading.Thread(target=converse, args=conv) for conv in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    if errors:
        raise h.HarnessError(f"{len(errors)} conversations failed: {errors[:2]}")
    tokens = sum(len(r["tokens"]) for r in results)
    prompt = sum(r["prompt_tokens"] for r in results)
    cached = sum(r["cached_prompt_tokens"] for r in results)
    per_replica = {}
    for r in results:
        per_replica[r["replica_id"]] = per_replica.get(r["replica_id"], 0) + 1
    return {"output_tokens": tokens, "seconds": round(elapsed, 3), "tokens_per_s": tokens / elapsed,
            "hit_rate": cached / prompt, "prompt_tokens": prompt, "cached_prompt_tokens": cached,
            "median_ttft_s": statistics.median(r["ttft_s"] for r in results),
            "requests_per_replica": dict(sorted(per_replica.items()))}


def routing_bench(log_dir, args) -> dict:
    """Every (round, policy) on a fresh `loom up` (cold caches), the policies' order rotated per
    round so that a drift in the machine's background load does not favour one of them."""
    policies = ["prefix", "round-robin", "least-loaded"]
    rounds = {policy: [] for policy in policies}
    conversations = None
    for repeat in range(args.chat_repeats):
        order = policies[repeat % 3:] + policies[:repeat % 3]
        for policy in order:
            up = start_up(log_dir / f"chat_{policy}_{repeat}", 4, 1, routing=policy)
            try:
                if conversations is None:
                    conversations = chat_workload(up.stub, args)
                call(up.stub, tokenize(up.stub, "Warm up."), 2)
                result = chat_round(up.stub, conversations, args)
            finally:
                up.stop(timeout=30)
            rounds[policy].append(result)
            print(f"  round {repeat} --routing {policy:12s}: {result['tokens_per_s']:6.1f} output tokens/s, "
                  f"hit rate {result['hit_rate']:.1%}", flush=True)
    rows = {}
    for policy in policies:
        runs = rounds[policy]
        rate = statistics.median(r["tokens_per_s"] for r in runs)
        rows[policy] = {"tokens_per_s": round(rate, 2),
                        "hit_rate": round(statistics.median(r["hit_rate"] for r in runs), 3),
                        "median_ttft_s": round(statistics.median(r["median_ttft_s"] for r in runs), 4),
                        "output_tokens_per_round": runs[0]["output_tokens"],
                        "requests_per_replica": [r["requests_per_replica"] for r in runs],
                        "samples_tokens_per_s": [round(r["tokens_per_s"], 2) for r in runs],
                        "samples_hit_rate": [round(r["hit_rate"], 3) for r in runs]}
        row = rows[policy]
        print(f"chat, 4 replicas, --routing {policy:12s}: {row['tokens_per_s']:6.1f} output tokens/s, "
              f"hit rate {row['hit_rate']:.1%}, median TTFT {row['median_ttft_s'] * 1000:.0f} ms "
              f"(median of {len(runs)} rounds)", flush=True)
    base = rows["round-robin"]["tokens_per_s"]
    for policy, row in rows.items():
        row["vs_round_robin"] = round(row["tokens_per_s"] / base, 3)
    print(f"prefix routing: {rows['prefix']['vs_round_robin']:.2f}x round-robin throughput "
          f"(target 1.5x), {rows['prefix']['tokens_per_s'] / rows['least-loaded']['tokens_per_s']:.2f}x "
          f"least-loaded", flush=True)
    return {"conversations": args.conversations, "turns": args.turns,
            "system_prompt_tokens": args.chat_system_tokens, "max_tokens_per_turn": args.chat_max_tokens,
            "rounds": args.chat_repeats, "target_vs_round_robin": 1.5, "policies": rows}


# ---------------------------------------------------------------------------------------------
# 3. Overhead on unique prompts.

def overhead_bench(log_dir, args) -> dict:
    servers = {mode: start_up(log_dir / f"unique_{mode}", 1, args.threads, prefix_caching=mode)
               for mode in ("on", "off")}
    rng = random.Random(11)
    rates = {"on": [], "off": []}
    try:
        for server in servers.values():
            call(server.stub, tokenize(server.stub, "Warm up."), 2)
        for repeat in range(args.overhead_repeats):
            for mode in (("on", "off") if repeat % 2 == 0 else ("off", "on")):
                # Unique random prompts: nothing shareable (the first ids differ).
                prompts = [[rng.randrange(1000, 40000) for _ in range(args.unique_prompt_tokens)]
                           for _ in range(args.unique_requests)]
                results = [None] * len(prompts)
                started = time.monotonic()

                def run(i):
                    results[i] = call(servers[mode].stub, prompts[i], args.unique_max_tokens)

                threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                elapsed = time.monotonic() - started
                if any(r is None for r in results):
                    raise h.HarnessError("an overhead request failed")
                if any(r["cached_prompt_tokens"] for r in results):
                    raise h.HarnessError("a unique prompt reported cached tokens")
                rates[mode].append(sum(len(r["tokens"]) for r in results) / elapsed)
        # The coordinator's own cost per step (scheduling, block table, hashing), which is what
        # prefix caching adds to; unlike tokens/s it is not drowned by the machine's noise.
        schedule_ms = {}
        for mode, server in servers.items():
            replica = next(iter(server.replicas().values()))
            schedule_ms[mode] = 1000 * replica.schedule_seconds / max(1, replica.num_steps)
    finally:
        for server in servers.values():
            server.stop(timeout=30)
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(f"unique prompts: caching on {on:.1f} vs off {off:.1f} output tokens/s = {on / off:.3f} "
          f"(target 0.98); coordinator scheduling {schedule_ms['on']:.3f} vs {schedule_ms['off']:.3f} "
          f"ms per step", flush=True)
    return {"requests_per_round": args.unique_requests, "prompt_tokens": args.unique_prompt_tokens,
            "max_tokens": args.unique_max_tokens, "tokens_per_s_on": round(on, 2),
            "tokens_per_s_off": round(off, 2), "on_vs_off": round(on / off, 3), "target": 0.98,
            "schedule_ms_per_step_on": round(schedule_ms["on"], 4),
            "schedule_ms_per_step_off": round(schedule_ms["off"], 4),
            "samples_tokens_per_s": {k: [round(v, 2) for v in vs] for k, vs in rates.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="worker threads for the single-replica parts (1 and 3)")
    parser.add_argument("--ttft-repeats", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--chat-system-tokens", type=int, default=384)
    parser.add_argument("--chat-max-tokens", type=int, default=24)
    parser.add_argument("--chat-repeats", type=int, default=2)
    parser.add_argument("--overhead-repeats", type=int, default=6)
    parser.add_argument("--unique-requests", type=int, default=8)
    parser.add_argument("--unique-prompt-tokens", type=int, default=128)
    parser.add_argument("--unique-max-tokens", type=int, default=24)
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer requests")
    parser.add_argument("--out", default=str(SOURCE_DIR / "bench" / "results" / "prefix_cache.json"))
    args = parser.parse_args()
    if args.quick:
        args.ttft_repeats, args.conversations, args.turns, args.overhead_repeats = 1, 4, 2, 2
        args.chat_repeats = 1
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        sys.exit(missing)
    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="loom_prefix_bench_"))
    ttft = ttft_bench(log_dir, args)
    routing = routing_bench(log_dir, args)
    overhead = overhead_bench(log_dir, args)
    record = {
        "benchmark": "prefix_cache",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "provenance": provenance(),
        "host": platform.node(),
        "model": str(h.MODEL_PATH.relative_to(SOURCE_DIR)) if h.MODEL_PATH.is_relative_to(SOURCE_DIR)
        else str(h.MODEL_PATH),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "ttft_shared_system_prompt": ttft,
        "multi_turn_routing": routing,
        "unique_prompt_overhead": overhead,
    }
    write_record(args.out, record)


if __name__ == "__main__":
    main()
