#!/usr/bin/env python3
"""Mixture-of-experts decode on the CPU against the dense model with the same active parameters,
in one run (issue 38).

Writes two random GGUF models with tests/worker/random_model.py (Q8_0 weights, so the INT8
kernels run, as a served 8-bit checkpoint would):

* moe:   Qwen3-MoE-shaped, hidden 512, 8 layers, 8 query / 2 KV heads of 64, 32 experts of
         256 channels, 4 per token (active FFN width 1,024);
* dense: the same attention and a dense FFN of 1,024 channels (the same active parameters).

and measures decode tokens/s of each through the serving engine (`engine_bench --model M
--only-batch B`: B sequences decoding --decode-tokens tokens each; three passes, median), round
robin over the models so load bursts hit both alike. The figure is the MoE/dense ratio per batch:
at batch 1 a token reads its 4 experts only (the same bytes as the dense FFN), so the ratio
shows the routing's own cost; at larger batches the tokens choose different experts and the
step reads more of the 32 (a decode step's weights grow with the batch, as on every MoE
server), which is what the batch-16 ratio shows.

  python3 bench/moe_bench.py --build-dir build --out bench/results/moe_cpu.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

from provenance import provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "worker"))

import random_model  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

Q8 = {role: (T.Q8_0,) for role in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output",
                                   "ffn_gate", "ffn_up", "ffn_down")}
MOE = random_model.ModelSpec(
    name="bench_moe", arch="qwen3moe", n_embd=512, n_layer=8, n_head=8, n_head_kv=2, head_dim=64,
    n_ff=256, dense_ff=1024, n_expert=32, n_expert_used=4, n_ctx=2048, rope_base=1000000.0,
    seed=5, types=Q8)
DENSE = dataclasses.replace(MOE, name="bench_dense", arch="qwen3", n_ff=1024, dense_ff=0,
                            n_expert=0, n_expert_used=0)


def decode_rate(engine_bench: pathlib.Path, model: pathlib.Path, batch: int, tokens: int,
                threads: int) -> float:
    """Median of engine_bench's three decode passes (tokens/s)."""
    done = subprocess.run([str(engine_bench), "--model", str(model), "--only-batch", str(batch),
                           "--decode-tokens", str(tokens), "--threads", str(threads)],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"engine_bench on {model} failed:\n{done.stderr[-3000:]}")
    rates = [float(m) for m in re.findall(r"sequences: ([\d.]+) tokens/s", done.stdout)]
    if len(rates) != 3:
        sys.exit(f"engine_bench printed no decode rates:\n{done.stdout[-2000:]}")
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", type=pathlib.Path, default=ROOT / "build")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="default bench/results/moe_cpu.json (moe_cpu_<isa>.json with LOOM_CPU_ISA)")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    isa = os.environ.get("LOOM_CPU_ISA", "")
    out = args.out or ROOT / "bench" / "results" / (f"moe_cpu_{isa}.json" if isa else "moe_cpu.json")
    engine_bench = args.build_dir / "bench" / "engine_bench"
    if not engine_bench.exists():
        sys.exit(f"{engine_bench} is missing: build the project first")

    work = pathlib.Path(tempfile.mkdtemp(prefix="loom-moe-bench-"))
    models = {spec.name: random_model.write_model(spec, work / f"{spec.name}.gguf") for spec in (MOE, DENSE)}
    batches = [int(b) for b in args.batches.split(",")]
    runs: dict = {(name, b): [] for name in models for b in batches}
    for _ in range(args.repeats):
        for batch in batches:
            for name, path in models.items():
                runs[(name, batch)].append(decode_rate(engine_bench, pathlib.Path(path), batch,
                                                       args.decode_tokens, args.threads))
    results = []
    for batch in batches:
        moe = statistics.median(runs[(MOE.name, batch)])
        dense = statistics.median(runs[(DENSE.name, batch)])
        results.append({"batch": batch, "moe_tokens_per_second": moe, "dense_tokens_per_second": dense,
                        "ratio_moe_to_dense": moe / dense, "moe_runs": runs[(MOE.name, batch)],
                        "dense_runs": runs[(DENSE.name, batch)]})
        print(f"batch {batch:3d}: MoE {moe:8.1f} tokens/s, dense (same active parameters) "
              f"{dense:8.1f} tokens/s = {moe / dense:.2f}x", flush=True)
    shapes = {name: {k: v for k, v in dataclasses.asdict(spec).items() if k != "types"}
              for name, spec in (("moe", MOE), ("dense", DENSE))}
    report = {"what": "decode tokens/s, mixture of experts vs dense with the same active parameters",
              "measured": time.strftime("%Y-%m-%d %H:%M"), "weights": "Q8_0",
              "decode_tokens": args.decode_tokens, "repeats": args.repeats, "threads": args.threads,
              "models": shapes, "results": results, "provenance": provenance()}
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
