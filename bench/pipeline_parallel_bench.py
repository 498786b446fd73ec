"""Pipeline parallelism on CPU, end to end (the default model): two stages against one process.

A replica of --pipeline-parallel-size 2 (two `loom-worker` processes, 15 layers each, `--threads`
/ 2 threads each, the residual stream between them over gloo on loopback) against one worker
process with `--threads` threads, the same coordinator flags, the same batch of concurrent
requests (--batch, default 32: random-text prompts of --prompt-words words, new ones every round
so none comes from the prefix cache, --max-tokens outputs each, EOS ignored). Rounds alternate
the configurations; medians. Beside the even split: --partition (default 18,12: the last stage
also runs the LM head, about 8 layers' weights per decode row) and the same with a third plan in
flight.

Reported per configuration: output tokens/s (and the ratio PP=2 / PP=1 in the same round), and for
each stage its bubble fraction over the round: 1 - busy / wall, busy being the stage's step time
(loom_worker_step_seconds_sum) less its time waiting on the other stage inside steps
(loom_worker_pipeline_wait_seconds_total), both read from the workers' metrics before and after.

What to expect on one machine: pipeline parallelism exists to split a model that does not fit one
machine, not to speed up one that does. Here both configurations share the same cores, the stages
run micro-batches of half the batch each (the coordinator keeps one plan in flight per stage, a
sequence in at most one), and every step crosses a socket twice; a ratio near 1 with small bubbles
says the split costs little.

Writes bench/results/pipeline_parallel.json.

usage: .venv/bin/python bench/pipeline_parallel_bench.py [--rounds 3] [--batch 32]
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


def prompt(i: int, words: int) -> str:
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def scrape(url: str) -> dict:
    """name -> value of the unlabelled-by-bucket series we read."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, value = line.rsplit(" ", 1)
        base = name.split("{", 1)[0]
        if base in ("loom_worker_step_seconds_sum", "loom_worker_pipeline_wait_seconds_total",
                    "loom_worker_steps_total"):
            out[base] = float(value)
    return out


class Replica:
    """A coordinator and the worker processes of one replica (stages x 1 rank)."""

    def __init__(self, log_dir: pathlib.Path, stages: int, threads: int, kv_cache_memory: str,
                 plans_in_flight: int = 2, **worker_flags):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.coordinator = h.Coordinator(log_dir, http_port=-1, max_plans_in_flight=plans_in_flight)
        self.workers = [None] * stages
        flags = {"threads": threads, "kv_cache_memory": kv_cache_memory, "metrics_port": 0,
                 **worker_flags}
        if stages > 1:
            flags.update(world_size=stages, pipeline_parallel_size=stages, rendezvous_id="bench")

        def start(rank):
            extra = {"rank": rank} if stages > 1 else {}
            self.workers[rank] = h.Worker(log_dir, self.coordinator.address, "replica-0",
                                          **flags, **extra)

        starters = [threading.Thread(target=start, args=(r,)) for r in range(stages)]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        if not all(self.workers):
            raise h.HarnessError("a worker did not start")
        self.metrics = [w.wait_for_line(r"metrics on (http://\S+)", 30).group(1) for w in self.workers]
        self.coordinator.wait_healthy(["replica-0"])

    def stop(self):
        for w in self.workers:
            if w is not None:
                w.stop(timeout=10)
        self.coordinator.stop(timeout=10)


def run_round(replica: Replica, prompts: list, max_tokens: int) -> dict:
    before = [scrape(url) for url in replica.metrics]
    tokens = [0] * len(prompts)

    def one(i):
        request = h.make_request(prompts[i], max_tokens=max_tokens, ignore_eos=True)
        for message in replica.coordinator.stub.Generate(request, timeout=1800):
            tokens[i] += len(message.token_ids)

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    after = [scrape(url) for url in replica.metrics]
    if sum(tokens) != max_tokens * len(prompts):
        raise h.HarnessError(f"{sum(tokens)} tokens, expected {max_tokens * len(prompts)}")
    stages = []
    for b, a in zip(before, after):
        step = a["loom_worker_step_seconds_sum"] - b["loom_worker_step_seconds_sum"]
        wait = a.get("loom_worker_pipeline_wait_seconds_total", 0) - b.get(
            "loom_worker_pipeline_wait_seconds_total", 0)
        steps = a["loom_worker_steps_total"] - b["loom_worker_steps_total"]
        stages.append({"steps": steps, "step_seconds": step, "wait_seconds": wait,
                       "bubble_fraction": 1 - (step - wait) / wall})
    return {"tokens": sum(tokens), "seconds": wall, "tokens_per_s": sum(tokens) / wall, "stages": stages}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="threads in all (split over the stages)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partition", default="18,12", help="the uneven configuration's layers per stage")
    parser.add_argument("--output", default=str(SOURCE_DIR / "bench" / "results" / "pipeline_parallel.json"))
    args = parser.parse_args()
    # Fresh prompts every round and configuration: nothing is served from the prefix cache.
    def prompts(seed):
        return [prompt(seed * 10007 + i, args.prompt_words) for i in range(args.batch)]

    configs = {
        "pp1": dict(stages=1, threads=args.threads, kv_cache_memory="256MiB"),
        "pp2": dict(stages=2, threads=max(1, args.threads // 2), kv_cache_memory="128MiB"),
        # The last stage also runs the LM head (49152 x 576: about 8 layers' weights per decode
        # row), so fewer layers there balance decode.
        f"pp2_{args.partition.replace(',', '_')}": dict(
            stages=2, threads=max(1, args.threads // 2), kv_cache_memory="128MiB",
            pipeline_layer_partition=args.partition),
        # A third plan in flight: a stage has the next micro-batch's plan before it finishes
        # the current one (smaller micro-batches).
        f"pp2_{args.partition.replace(',', '_')}_3plans": dict(
            stages=2, threads=max(1, args.threads // 2), kv_cache_memory="128MiB",
            pipeline_layer_partition=args.partition, plans_in_flight=3),
    }
    runs = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        replicas = {}
        try:
            for name, config in configs.items():
                replicas[name] = Replica(tmp / name, **config)
            # One warm-up round each (first steps, page faults), not counted.
            for k, replica in enumerate(replicas.values()):
                run_round(replica, prompts(1000 + k)[:4], 8)
            for r in range(args.rounds):
                order = list(configs) if r % 2 == 0 else list(reversed(configs))
                for name in order:
                    seed = r * len(configs) + list(configs).index(name)
                    runs[name].append(run_round(replicas[name], prompts(seed), args.max_tokens))
                    print(name, f"{runs[name][-1]['tokens_per_s']:.1f} tok/s",
                          [round(s["bubble_fraction"], 3) for s in runs[name][-1]["stages"]], flush=True)
        finally:
            for replica in replicas.values():
                replica.stop()
    def ratio(name):
        return statistics.median(b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(runs["pp1"], runs[name]))

    report = {
        "benchmark": "pipeline_parallel",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "provenance": provenance(),
        "threads_total": args.threads, "batch": args.batch, "prompt_words": args.prompt_words,
        "max_tokens": args.max_tokens, "rounds": args.rounds,
        "configs": {name: {
            "stages": config["stages"], "threads_per_stage": config["threads"],
            "layer_partition": config.get("pipeline_layer_partition", "even"),
            "plans_in_flight": config.get("plans_in_flight", 2),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[name]),
            "ratio_to_pp1": ratio(name),
            "bubble_fraction_per_stage": [
                statistics.median(r["stages"][s]["bubble_fraction"] for r in runs[name])
                for s in range(config["stages"])],
        } for name, config in configs.items()},
        "runs": runs,
    }
    output = pathlib.Path(args.output)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
