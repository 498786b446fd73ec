"""The host KV tier on multi-turn chat (issue 35's benchmark), end to end on the default model.

64 sessions x 6 turns over one shared system prompt: each session's turn is its whole history
(system prompt, earlier questions and answers) plus a new question, sent as soon as its previous
turn ended, all sessions at once (one `loom up` replica, gRPC). Answers are --max-tokens long (EOS
ignored), so every configuration computes the same tokens. Questions of --question-words (120:
~130 tokens) make each session's own history, not the shared system prompt (200 words), most of
the working set: about 30% of all prompt tokens are the system prompt's, which is what a pool
without a tier keeps (with 30-word questions, as the first run of 2026-11-29 used, that share
was 50% and the tier-less hit rate with it; `--question-words 30` repeats that run).

Two pools, each served with and without the host tier (`--kv-offload-memory`), the tier-less one
first, a fresh server each:
  * small: the device pool holds --pool-fraction (default 0.25) of the working set (the blocks of
    the system prompt and of every session's final history). Between two turns of a session the
    other sessions evict its blocks: without the tier its history is recomputed, with it reloaded.
  * fits: the pool holds everything (4x the working set); the tier is never needed, and must cost
    nothing.

Reported per configuration: token hit rate (prompt tokens served from cache / prompt tokens, from
each request's own counts), TTFT p50/p90 over every turn after the first, output tokens/s over the
run, and the ratios in the same run: hit rate with/without the tier, TTFT p50 without/with (small
pool), throughput with/without (fits); --rounds (3) rounds of the four configurations one after
another, each figure the median over the rounds (every round's kept, and its ratios). The tier's
own counts come from the coordinator's metrics.

Writes bench/results/kv_offload.json.

usage: .venv/bin/python bench/kv_offload_bench.py [--sessions 64] [--turns 6] [--rounds 3]
"""
import argparse
import datetime
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance  # noqa: E402

WORDS = ("the river runs past old stone walls where people sell bread fish and cloth while "
         "children chase birds across the square and the bell rings every hour").split()
BLOCK_SIZE = 16
F16_BLOCK_BYTES = 30 * 2 * BLOCK_SIZE * 3 * 64 * 2  # SmolLM2-135M: layers x K,V x slots x heads x dim


def words(seed: int, count: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(count))


def scrape(url: str) -> dict:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("loom_kv_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{", 1)[0]] = float(value)
    return out


def tokens_of(url: str, text: str) -> int:
    body = json.dumps({"prompt": text}).encode()
    request = urllib.request.Request(url + "/tokenize", body, {"Content-Type": "application/json"})
    return len(json.loads(urllib.request.urlopen(request, timeout=30).read())["tokens"])


class Workload:
    def __init__(self, sessions: int, turns: int, system_words: int, question_words: int):
        self.system = "System: " + words(1, system_words) + "\n"
        self.questions = [[f"User: {words(1000 * s + t, question_words)}\nAssistant:"
                           for t in range(turns)] for s in range(sessions)]


def run(up, workload: Workload, max_tokens: int) -> dict:
    """Every session's turns; per turn (ttft, prompt tokens, cached tokens); the wall time."""
    results = [[] for _ in workload.questions]
    errors = []

    def session(s):
        history = workload.system
        try:
            for question in workload.questions[s]:
                history += question
                request = h.make_request(history, max_tokens=max_tokens, ignore_eos=True)
                started = time.monotonic()
                first = None
                answer = []
                last = None
                for message in up.stub.Generate(request, timeout=3600):
                    if first is None and len(message.token_ids) > 0:
                        first = time.monotonic() - started
                    answer.append(message.text)
                    last = message
                history += "".join(answer) + "\n"
                results[s].append((first, last.prompt_tokens, last.cached_prompt_tokens))
        except Exception as error:  # noqa: BLE001: reported below
            errors.append(repr(error))

    started = time.monotonic()
    threads = [threading.Thread(target=session, args=(s,)) for s in range(len(workload.questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    if errors:
        raise h.HarnessError(f"{len(errors)} sessions failed: {errors[:3]}")
    return {"turns": results, "seconds": wall}


def summarize(name: str, outcome: dict, max_tokens: int, tier: dict) -> dict:
    turns = [turn for session in outcome["turns"] for turn in session]
    later = [turn for session in outcome["turns"] for turn in session[1:]]
    prompt = sum(t[1] for t in turns)
    cached = sum(t[2] for t in turns)
    ttfts = sorted(t[0] for t in later)
    summary = {
        "requests": len(turns), "prompt_tokens": prompt, "cached_prompt_tokens": cached,
        "token_hit_rate": cached / prompt,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))],
        "seconds": outcome["seconds"],
        "output_tokens_per_s": len(turns) * max_tokens / outcome["seconds"],
        "host_tier": tier,
    }
    print(name, json.dumps({k: v for k, v in summary.items() if k != "host_tier"}), tier, flush=True)
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-words", type=int, default=200)
    parser.add_argument("--question-words", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--pool-fraction", type=float, default=0.25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four configurations (medians)")
    parser.add_argument("--output", default=str(SOURCE_DIR / "bench" / "results" / "kv_offload.json"))
    args = parser.parse_args()
    workload = Workload(args.sessions, args.turns, args.system_words, args.question_words)

    report = {"benchmark": "kv_offload", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "provenance": provenance(), "sessions": args.sessions, "turns": args.turns,
              "max_tokens": args.max_tokens, "pool_fraction": args.pool_fraction,
              "system_words": args.system_words, "question_words": args.question_words,
              "rounds": args.rounds, "configs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        working_set_blocks = None

        def serve(name, pool_bytes, tier_bytes):
            flags = {"threads": args.threads, "kv_cache_memory": str(pool_bytes)}
            if tier_bytes:
                flags["kv_offload_memory"] = str(tier_bytes)
            up = h.Up(tmp / name, **flags)
            try:
                up.wait_healthy(["replica-0"])
                nonlocal working_set_blocks
                if working_set_blocks is None:
                    # The system prompt once, and each session's final history (+ its last answer).
                    system = tokens_of(up.http_url, workload.system)
                    final = [tokens_of(up.http_url, workload.system + "".join(q)) +
                             args.turns * (args.max_tokens + 1) for q in workload.questions]
                    working_set_blocks = (system + sum(f - system for f in final)) // BLOCK_SIZE
                    report["working_set_blocks"] = working_set_blocks
                outcome = run(up, workload, args.max_tokens)
                tier = scrape(up.http_url)
                blocks = up.replicas()["replica-0"].num_kv_blocks
            finally:
                up.stop()
            summary = summarize(name, outcome, args.max_tokens, tier)
            summary["pool_blocks"] = blocks
            report["configs"].setdefault(name, {"rounds": []})["rounds"].append(summary)

        # Sizing needs a server: the first configuration's pool is the large one.
        probe_pool = 4 * 4096 * F16_BLOCK_BYTES
        serve("fits_no_tier", probe_pool, 0)
        fits = 4 * working_set_blocks * F16_BLOCK_BYTES
        small = int(args.pool_fraction * working_set_blocks) * F16_BLOCK_BYTES
        tier = 2 * working_set_blocks * F16_BLOCK_BYTES
        report["configs"].pop("fits_no_tier")
        # Rounds of the four, one after another: a change in the machine's load falls on
        # every configuration alike; medians over the rounds.
        for _ in range(args.rounds):
            serve("fits_no_tier", fits, 0)
            serve("fits_tier", fits, tier)
            serve("small_no_tier", small, 0)
            serve("small_tier", small, tier)

    c = report["configs"]
    for config in c.values():
        for key in ("token_hit_rate", "ttft_p50_s", "ttft_p90_s", "output_tokens_per_s"):
            config[key] = statistics.median(r[key] for r in config["rounds"])

    def per_round(a, b, key):
        return [x[key] / y[key] for x, y in zip(c[a]["rounds"], c[b]["rounds"])]

    report["ratios"] = {
        "small_hit_rate_tier": c["small_tier"]["token_hit_rate"],
        "small_hit_rate_no_tier": c["small_no_tier"]["token_hit_rate"],
        "small_ttft_p50_no_tier_over_tier": c["small_no_tier"]["ttft_p50_s"] / c["small_tier"]["ttft_p50_s"],
        "fits_throughput_tier_over_no_tier":
            c["fits_tier"]["output_tokens_per_s"] / c["fits_no_tier"]["output_tokens_per_s"],
        "rounds": {
            "small_ttft_p50_no_tier_over_tier": per_round("small_no_tier", "small_tier", "ttft_p50_s"),
            "fits_throughput_tier_over_no_tier": per_round("fits_tier", "fits_no_tier",
                                                           "output_tokens_per_s"),
        },
    }
    print(json.dumps(report["ratios"], indent=1))
    pathlib.Path(args.output).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
