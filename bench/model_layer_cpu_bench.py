"""CPU cost of the model/ layer: the same forward pass before and after, old binary vs new.

Runs two builds of tests/tools/forward_pass_tool side by side on the default model (the
`--baseline` one built from a commit before the model/ layer, e.g. f279c61; the `--candidate`
one from this checkout) and times, alternating between them so both see the same machine
state, (a) single-stream decode: one request for greedy generation of --decode-tokens tokens
after a short prompt (per-token time = (that request - a 1-token request) / (tokens - 1)), and
(b) a 512-token prefill (one `logits` request). Each figure is the median over --rounds rounds.
Prints each as candidate/baseline next to the limit (1.03: the refactor must not cost more
than 3%), and the ratio of the fastest samples (less sensitive to other load on the machine),
and writes bench/results/model_layer_cpu.json with every sample and the load average.

  git worktree add /tmp/old f279c61 && cmake -S /tmp/old -B /tmp/old/build -G Ninja \\
      && cmake --build /tmp/old/build --target forward_pass_tool
  python bench/model_layer_cpu_bench.py --baseline /tmp/old/build/tests/tools/forward_pass_tool
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import time

from provenance import provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIMIT = 1.03


class Tool:
    def __init__(self, path, model, threads):
        self.process = subprocess.Popen(
            [str(path), "--model", str(model), "--threads", str(threads), "--kv-dtype", "f16",
             "--num-blocks", "128"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def timed(self, **request) -> float:
        start = time.perf_counter()
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        elapsed = time.perf_counter() - start
        assert "error" not in answer, answer
        return elapsed

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="forward_pass_tool built before model/")
    parser.add_argument("--candidate", default=str(ROOT / "build/tests/tools/forward_pass_tool"))
    parser.add_argument("--model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "bench/results/model_layer_cpu.json"))
    args = parser.parse_args()

    tools = {"baseline": Tool(args.baseline, args.model, args.threads),
             "candidate": Tool(args.candidate, args.model, args.threads)}
    prompt = [1, 504, 3575, 282, 4649, 314]  # a short prompt of real ids
    long_prompt = [(i * 7919) % 49000 + 100 for i in range(512)]
    samples = {name: {"decode_ms_per_token": [], "prefill_512_ms": []} for name in tools}
    try:
        for name, tool in tools.items():  # warm-up: page in the weights, grow the scratch
            tool.timed(op="logits", prompts=[long_prompt])
            tool.timed(op="greedy", prompts=[prompt], max_tokens=8)
        for _ in range(args.rounds):
            for name, tool in tools.items():
                one = tool.timed(op="greedy", prompts=[prompt], max_tokens=1)
                many = tool.timed(op="greedy", prompts=[prompt], max_tokens=args.decode_tokens)
                samples[name]["decode_ms_per_token"].append(
                    (many - one) * 1000 / (args.decode_tokens - 1))
                samples[name]["prefill_512_ms"].append(
                    tool.timed(op="logits", prompts=[long_prompt]) * 1000)
    finally:
        for tool in tools.values():
            tool.close()

    result = {"model": pathlib.Path(args.model).name, "threads": args.threads,
              "rounds": args.rounds, "limit_ratio": LIMIT, "figures": {}}
    ok = True
    for figure in ("decode_ms_per_token", "prefill_512_ms"):
        base = statistics.median(samples["baseline"][figure])
        cand = statistics.median(samples["candidate"][figure])
        ratio = cand / base
        ok &= ratio <= LIMIT
        best = min(samples["candidate"][figure]) / min(samples["baseline"][figure])
        result["figures"][figure] = {"baseline": round(base, 3), "candidate": round(cand, 3),
                                     "ratio": round(ratio, 4), "ratio_of_minima": round(best, 4),
                                     "samples": {k: [round(x, 3) for x in v[figure]]
                                                 for k, v in samples.items()}}
        print(f"{figure:22s} baseline {base:9.3f}  model/ {cand:9.3f}  ratio {ratio:.4f} "
              f"(minima {best:.4f}; limit {LIMIT}) {'ok' if ratio <= LIMIT else 'SLOWER'}")
    result["within_limit"] = ok
    result["provenance"] = provenance()
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
