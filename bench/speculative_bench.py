"""Speculative decoding on CPU, end to end (the default model).

Output tokens/s with speculation against the same requests without it (num_speculative_tokens=0
on the same server), measured in the same run, rounds alternated, medians:

1. n-gram prompt lookup (`loom up`), batch 1, a repetitive workload (the model rewrites a given
   text: its continuation copies the prompt) and a chat workload (questions in the chat
   template): speedup and acceptance length (tokens per speculative step). Target: >= 2x on the
   repetitive workload.
2. n-gram, batch 1, 8, 32, 64 on a mix of both workloads: adaptive speculation (the server picks
   each step's drafts; target: never below 0.95x) and fixed k = 2, 4, 8 (where it turns into a
   slowdown).
3. Draft model (`loom serve` + `loom-worker --draft-model`), batch 1, both workloads, fixed
   k = 2 and 4: INT8 and INT4 copies of the model made by `loom quantize` as drafts. No smaller
   model shares SmolLM2's vocabulary here, so the draft costs about as much as the target per
   token: this row measures the mechanism's acceptance and overhead, not a useful speedup.

Writes bench/results/speculative.json; --sections runs a subset and keeps the other sections of
an existing file.

usage: .venv/bin/python bench/speculative_bench.py [--quick] [--sections batch1,adaptive,fixed,draft]
"""
import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance  # noqa: E402

TEXTS = (
    "The coordinator schedules continuous batches across replicas and owns the block table of "
    "every replica's paged key-value cache. Workers run the transformer on the blocks they are "
    "told to use, and report the tokens they sample.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "def factorial(n):\n    if n < 2:\n        return 1\n    return n * factorial(n - 1)\n",
    "Monday is for planning, Tuesday is for writing, Wednesday is for testing, Thursday is for "
    "reviewing, and Friday is for shipping. Every week starts again on Monday.",
    "Rain fell on the old town all night. In the morning the streets were clean, the river was "
    "high, and the bakery on the corner opened an hour late.",
)
QUESTIONS = ("What is the capital of France?", "Give me three tips for better sleep.",
             "Explain what a hash table is.", "Write a haiku about autumn.",
             "Why is the sky blue?", "How do I boil an egg?")


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def repetitive_prompt(i: int) -> str:
    text = TEXTS[i % len(TEXTS)]
    return chat(f"Repeat this text word for word:\n\n{text}") + text.split(" ")[0]


def chat_prompt(i: int) -> str:
    return chat(QUESTIONS[i % len(QUESTIONS)])


def start_up(log_dir: pathlib.Path, threads: int, **flags) -> h.Up:
    up = h.Up(log_dir, replicas=1, threads=threads, http_port=-1, **flags)
    up.wait_for_line(r"loom: ready \(1 replicas?\)", h.REGISTER_TIMEOUT_S)
    return up


def run_batch(stub, prompts: list, max_tokens: int, k) -> dict:
    """Every prompt as its own concurrent call; output tokens/s over the wall time."""
    results = [None] * len(prompts)

    def one(i):
        request = h.make_request(prompts[i], max_tokens=max_tokens, ignore_eos=True,
                                 num_speculative_tokens=k)
        tokens, last = 0, None
        for message in stub.Generate(request, timeout=1800):
            tokens += len(message.token_ids)
            last = message
        results[i] = (tokens, last.num_draft_tokens, last.num_accepted_tokens)

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    if any(r is None for r in results):
        raise h.HarnessError("a request failed")
    tokens = sum(r[0] for r in results)
    drafted = sum(r[1] for r in results)
    accepted = sum(r[2] for r in results)
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "drafted": drafted, "accepted": accepted}


def compare(stub, prompts, max_tokens, modes: dict, rounds: int) -> dict:
    """modes: name -> num_speculative_tokens (None: the server's default). Rounds alternate the
    modes' order; per mode the median tokens/s and the median ratio to mode 'none' of the same
    round."""
    per_mode = {name: [] for name in modes}
    for r in range(rounds):
        order = list(modes.items())
        if r % 2:
            order.reverse()
        for name, k in order:
            per_mode[name].append(run_batch(stub, prompts, max_tokens, k))
    out = {}
    for name, runs in per_mode.items():
        ratios = [run["tokens_per_s"] / base["tokens_per_s"] for run, base in zip(runs, per_mode["none"])]
        drafted = sum(run["drafted"] for run in runs)
        accepted = sum(run["accepted"] for run in runs)
        out[name] = {"tokens_per_s": statistics.median(run["tokens_per_s"] for run in runs),
                     "speedup_vs_none": statistics.median(ratios),
                     "acceptance_rate": accepted / drafted if drafted else None,
                     "drafted": drafted, "accepted": accepted, "runs": runs}
    return out


def batch1_rows(stub, max_tokens: int, rounds: int, modes: dict) -> dict:
    """Batch 1 per workload: modes (name -> num_speculative_tokens) against "none" (k = 0), the
    same prompt per round, the order alternated."""
    out = {}
    for workload, make in (("repetitive", repetitive_prompt), ("chat", chat_prompt)):
        runs = {"none": [], **{name: [] for name in modes}}
        for i in range(rounds):
            order = [("none", 0), *modes.items()]
            if i % 2:
                order.reverse()
            for name, k in order:
                runs[name].append(run_batch(stub, [make(i)], max_tokens, k))
        row = {"none_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs["none"])}
        for name in modes:
            ratios = [a["tokens_per_s"] / n["tokens_per_s"] for a, n in zip(runs[name], runs["none"])]
            drafted = sum(r["drafted"] for r in runs[name])
            accepted = sum(r["accepted"] for r in runs[name])
            row[name] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[name]),
                         "speedup": statistics.median(ratios),
                         "acceptance_rate": accepted / drafted if drafted else None,
                         "drafted": drafted, "accepted": accepted}
        out[workload] = row
    return out


def draft_model_rows(tmp: pathlib.Path, threads: int, max_tokens: int, rounds: int) -> dict:
    """Section 3: a worker with --draft-model per quantized copy of the default model."""
    out = {}
    for fmt in ("int8", "int4"):
        draft = tmp / f"smollm2-{fmt}.gguf"
        subprocess.run([str(h.LOOM_BIN), "quantize", "--model", str(h.MODEL_PATH), "--out", str(draft),
                        "--format", fmt, "--threads", str(threads)], check=True, capture_output=True)
        with h.running_cluster(tmp / f"draft-{fmt}", {"replica-0": {"threads": threads, "draft_model": draft}},
                               print_logs=False, http_port=-1, speculative_tokens=4,
                               speculative_adaptive="off") as rig:
            stub = rig.coordinator.stub
            run_batch(stub, [chat_prompt(0)], 8, 4)  # warm-up
            rows = batch1_rows(stub, max_tokens, rounds, {"k2": 2, "k4": 4})
        for workload, row in rows.items():
            print(f"draft {fmt} batch 1 {workload:10s}: {row['none_tokens_per_s']:7.1f} tok/s without; " + ", ".join(
                f"{name} {row[name]['tokens_per_s']:.1f} tok/s {row[name]['speedup']:.2f}x "
                f"(acceptance {row[name]['acceptance_rate']:.2f})" for name in ("k2", "k4")), flush=True)
        out[fmt] = {"draft": f"loom quantize --format {fmt} of the default model", **rows}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and batch sizes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=str(SOURCE_DIR / "bench" / "results" / "speculative.json"))
    parser.add_argument("--sections", default="batch1,adaptive,fixed,draft",
                        help="comma-separated subset of batch1, adaptive, fixed, draft")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    unknown = sections - {"batch1", "adaptive", "fixed", "draft"}
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")
    rounds = 1 if args.quick else args.rounds
    batches = (1, 8) if args.quick else (1, 8, 32, 64)
    report = {"benchmark": "speculative", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "provenance": provenance(), "threads": args.threads,
              "max_tokens": args.max_tokens, "rounds": rounds}
    output = pathlib.Path(args.output)
    if sections != {"batch1", "adaptive", "fixed", "draft"} and output.exists():
        # A partial run keeps the other sections of the existing results, and their date and
        # provenance; the sections it measures say when and where they were measured.
        report = {**json.loads(output.read_text()), "sections_run": sorted(sections),
                  "sections_date": report["date"], "sections_provenance": report["provenance"]}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        if "draft" in sections:
            report["draft_model"] = draft_model_rows(tmp, args.threads, args.max_tokens,
                                                     4 if not args.quick else 2)
        if not sections & {"batch1", "adaptive", "fixed"}:
            return write(report, output)
        # 1. Batch 1 per workload, adaptive server (k <= 8).
        up = start_up(tmp / "adaptive", args.threads, speculative_tokens=8)
        try:
            stub = up.stub
            run_batch(stub, [chat_prompt(0)], 8, 0)  # warm-up
            batch1 = {}
            if "batch1" not in sections:
                batch1 = report.get("batch1", {})
            for workload, make in (("repetitive", repetitive_prompt), ("chat", chat_prompt)):
                if "batch1" not in sections:
                    break
                runs = {"none": [], "adaptive": []}
                for i in range(4 if not args.quick else 2):
                    for name, k in (("none", 0), ("adaptive", None)) if i % 2 == 0 else (("adaptive", None), ("none", 0)):
                        runs[name].append(run_batch(stub, [make(i)], args.max_tokens, k))
                ratios = [a["tokens_per_s"] / n["tokens_per_s"] for a, n in zip(runs["adaptive"], runs["none"])]
                drafted = sum(r["drafted"] for r in runs["adaptive"])
                accepted = sum(r["accepted"] for r in runs["adaptive"])
                batch1[workload] = {
                    "none_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs["none"]),
                    "speculative_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs["adaptive"]),
                    "speedup": statistics.median(ratios),
                    "acceptance_rate": accepted / drafted if drafted else None,
                    "drafted": drafted, "accepted": accepted}
                print(f"batch 1 {workload:10s}: {batch1[workload]['none_tokens_per_s']:7.1f} tok/s without, "
                      f"{batch1[workload]['speculative_tokens_per_s']:7.1f} with adaptive speculation: "
                      f"{batch1[workload]['speedup']:.2f}x (acceptance {batch1[workload]['acceptance_rate']})",
                      flush=True)
            report["batch1"] = batch1
            adaptive = {}
            for batch in batches if "adaptive" in sections else ():
                prompts = [(repetitive_prompt if i % 2 == 0 else chat_prompt)(i) for i in range(batch)]
                adaptive[batch] = compare(stub, prompts, args.max_tokens, {"none": 0, "adaptive": None}, rounds)
                print(f"batch {batch:3d} adaptive: {adaptive[batch]['adaptive']['speedup_vs_none']:.2f}x "
                      f"({adaptive[batch]['none']['tokens_per_s']:.1f} tok/s without)", flush=True)
            if "adaptive" in sections:
                report["adaptive"] = adaptive
        finally:
            up.stop()
        if "fixed" not in sections:
            return write(report, output)
        # 2. Fixed k on a server that does not adapt.
        up = start_up(tmp / "fixed", args.threads, speculative_tokens=8, speculative_adaptive="off")
        try:
            stub = up.stub
            run_batch(stub, [chat_prompt(0)], 8, 0)
            fixed = {}
            for batch in batches:
                prompts = [(repetitive_prompt if i % 2 == 0 else chat_prompt)(i) for i in range(batch)]
                fixed[batch] = compare(stub, prompts, args.max_tokens,
                                       {"none": 0, "k2": 2, "k4": 4, "k8": 8}, rounds)
                print(f"batch {batch:3d} fixed k: " + ", ".join(
                    f"{name} {fixed[batch][name]['speedup_vs_none']:.2f}x" for name in ("k2", "k4", "k8")),
                    flush=True)
            report["fixed"] = fixed
        finally:
            up.stop()
    write(report, output)


def write(report: dict, output: pathlib.Path):
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
