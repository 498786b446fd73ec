#!/usr/bin/env python3
"""--activations bf16's attention on AMX-BF16 tiles against the float attention it replaced, end
to end, in one run (needs an AMX-BF16 CPU; exits with the reason elsewhere).

The model is the default one as a BF16 GGUF (`loom quantize --format bf16`, as
bf16_weights_bench.py makes it), so the matmuls read their tiles straight from the weights and
attention is the rest. Four configurations of bench/engine_bench, alternating over --passes
passes (each pass starting one configuration later), medians:
  f32              --activations f32 (the reference speed);
  bf16-float       --activations bf16 --bf16-attention float --kv-dtype f16 (the matmuls on
                   AMX, attention in float: what --activations bf16 did before);
  bf16-amx         --activations bf16 --kv-dtype f16 (attention on the AMX-BF16 tiles too, F16
                   KV converted per tile);
  bf16-amx-bf16kv  --activations bf16 --kv-dtype bf16 (the mode's default KV type now: the
                   tiles read K from the pool as it is).
Figures: 512-token prefill, single-stream decode and batched decode of 16 and 64 sequences
(engine_bench's own), and a --long-prefill-token prefill (engine_bench --only-prefill); each as
a ratio to bf16-float's and to f32's (BF16 KV's also to bf16-amx's), beside the FMA and
AMX-BF16 peaks engine_bench measured.

  .venv/bin/python bench/bf16_attention_bench.py [--passes 3] [--long-prefill 2048]
  -> bench/results/bf16_attention_cpu.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import tempfile

import activations_bench
import bf16_weights_bench
import cpu_vs_llamacpp
from provenance import provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = {"f32": ("f32", ()),
           "bf16-float": ("bf16", ("--bf16-attention", "float", "--kv-dtype", "f16")),
           "bf16-amx": ("bf16", ("--kv-dtype", "f16")),
           "bf16-amx-bf16kv": ("bf16", ("--kv-dtype", "bf16"))}
FIGURES = ("pp512", "tg", "batched_16", "batched_64", "long_prefill")


def long_prefill(model: str, activations: str, extra: tuple, tokens: int, threads: int) -> float:
    """Tokens/s of one `tokens`-token prefill (engine_bench --only-prefill: median of three, the
    default per-token attention line; under bf16-amx both lines run the AMX tiles)."""
    with tempfile.TemporaryDirectory(prefix="engine_bench_") as tmp:
        out = subprocess.run(
            [str(cpu_vs_llamacpp.BUILD_DIR / "bench" / "engine_bench"), "--model", model,
             "--threads", str(threads), "--activations", activations, "--only-prefill",
             str(tokens), *extra],
            env=dict(os.environ, LOOM_SOURCE_DIR=tmp), cwd=tmp, capture_output=True, text=True,
            check=True)
    match = re.search(r"per-token attention, CPU ISA \S+: ([0-9.]+) tokens/s", out.stdout)
    if match is None:
        raise SystemExit(f"no per-token prefill line in engine_bench's output:\n{out.stdout}")
    return float(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens per sequence")
    parser.add_argument("--long-prefill", type=int, default=2048)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bf16_attention_cpu.json"))
    args = parser.parse_args()
    ok, reason = activations_bench.bf16_runs()
    if not ok:
        raise SystemExit(f"bf16 skipped: {reason}")
    model = str(bf16_weights_bench.quantize(bf16_weights_bench.DEFAULT_MODEL,
                                            bf16_weights_bench.CACHE / "SmolLM2-135M-Instruct.BF16.gguf",
                                            "bf16").resolve())
    samples = {name: {f: [] for f in FIGURES} for name in CONFIGS}
    limits = {}
    names = list(CONFIGS)
    for p in range(args.passes):
        # Pass p starts at configuration p mod 4, so that each runs first, second... alike and a
        # drift in the machine's load does not fall on one configuration's slot every pass.
        for name in names[p % len(names):] + names[:p % len(names)]:
            activations, extra = CONFIGS[name]
            speed = activations_bench.engine_speed(model, activations, args, extra_args=extra)
            limits = speed["limits"]
            for f in FIGURES[:-1]:
                samples[name][f].append(speed[f])
            samples[name]["long_prefill"].append(
                long_prefill(model, activations, extra, args.long_prefill, args.threads))
            print(f"pass {p + 1}/{args.passes} {name}: " +
                  ", ".join(f"{f} {samples[name][f][-1]:.1f}" for f in FIGURES), flush=True)
    medians = {name: {f: statistics.median(v) for f, v in figs.items()} for name, figs in samples.items()}
    print(f"\nmedians of {args.passes} passes, tokens/s (long prefill: {args.long_prefill} tokens)")
    print(f"{'figure':<13} {'f32':>9} {'bf16-float':>11} {'bf16-amx':>9} {'+bf16 kv':>9} "
          f"{'amx/float':>10} {'amx/f32':>8} {'bf16kv/amx':>11} {'bf16kv/float':>13}")
    ratios = {}
    for f in FIGURES:
        m = {name: medians[name][f] for name in CONFIGS}
        ratios[f] = {"amx_vs_float_attention": m["bf16-amx"] / m["bf16-float"],
                     "amx_vs_f32": m["bf16-amx"] / m["f32"],
                     "float_attention_vs_f32": m["bf16-float"] / m["f32"],
                     "bf16kv_vs_amx_f16kv": m["bf16-amx-bf16kv"] / m["bf16-amx"],
                     "bf16kv_vs_float_attention": m["bf16-amx-bf16kv"] / m["bf16-float"],
                     "bf16kv_vs_f32": m["bf16-amx-bf16kv"] / m["f32"]}
        r = ratios[f]
        print(f"{f:<13} {m['f32']:>9.1f} {m['bf16-float']:>11.1f} {m['bf16-amx']:>9.1f} "
              f"{m['bf16-amx-bf16kv']:>9.1f} {r['amx_vs_float_attention']:>9.2f}x "
              f"{r['amx_vs_f32']:>7.2f}x {r['bf16kv_vs_amx_f16kv']:>10.2f}x "
              f"{r['bf16kv_vs_float_attention']:>12.2f}x")
    result = {
        "benchmark": "bf16_attention_cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": pathlib.Path(model).name, "threads": args.threads, "passes": args.passes,
        "decode_tokens": args.tokens, "long_prefill_tokens": args.long_prefill,
        "statistic": "median", "limits": limits, "tokens_per_s": medians, "ratios": ratios,
        "samples": samples, "load_average": os.getloadavg(), "provenance": provenance(),
    }
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
