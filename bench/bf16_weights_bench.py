#!/usr/bin/env python3
"""BF16 checkpoints on the CPU backend: held as BF16 (WeightFormat::kBf16, two bytes a weight)
against the same values held as F32 (four bytes: how the backend held BF16 checkpoints before),
with the default f32 activations, on each CPU ISA (forced with LOOM_CPU_ISA), in one run.

The BF16 file is the default model converted by `loom quantize --format bf16`; its F32 twin is
that file converted by `loom quantize --format f32`, the same values bit for bit (BF16 widens to
F32 exactly), so the two runs compute the same logits and differ only in the bytes they read.
Per ISA the two files alternate over --passes bench/engine_bench runs (512-token prefill,
single-stream decode with its bytes per token and its ratio to the read bandwidth measured in
the same process, batched decode of 16 and 64 sequences); medians, BF16's ratio to F32.

  .venv/bin/python bench/bf16_weights_bench.py [--passes 3] [--isa avx2,avx512]
  -> bench/results/bf16_weights_cpu.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys

import activations_bench
import cpu_vs_llamacpp
from provenance import provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", ROOT / "build"))
CACHE = ROOT / "bench" / ".cache"
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
KEYS = ("pp512", "tg", "batched_16", "batched_64")


def quantize(source: pathlib.Path, out: pathlib.Path, fmt: str) -> pathlib.Path:
    if not out.exists():
        subprocess.run([str(BUILD / "coordinator" / "loom"), "quantize", "--model", str(source),
                        "--out", str(out), "--format", fmt], check=True, capture_output=True)
    return out


def speed(model: pathlib.Path, isa: str, args) -> dict:
    return activations_bench.engine_speed(str(model), "f32", args,
                                          env=dict(os.environ, LOOM_CPU_ISA=isa))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=3, help="engine_bench runs per file and ISA")
    parser.add_argument("--isa", default="avx2,avx512", help="LOOM_CPU_ISA values to force")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens per sequence")
    args = parser.parse_args()

    CACHE.mkdir(parents=True, exist_ok=True)
    bf16 = quantize(DEFAULT_MODEL, CACHE / "SmolLM2-135M-Instruct.BF16.gguf", "bf16")
    as_f32 = quantize(bf16, CACHE / "SmolLM2-135M-Instruct.BF16-as-F32.gguf", "f32")
    files = {"bf16": bf16, "f32": as_f32}

    per_isa = {}
    for isa in args.isa.split(","):
        if isa == "avx512" and not cpu_vs_llamacpp.has_avx512():
            print(f"{isa}: skipped (this CPU lacks it)")
            continue
        runs = {held: [] for held in files}
        for index in range(args.passes):
            for held, path in files.items():
                runs[held].append(speed(path, isa, args))
                r = runs[held][-1]
                print(f"{isa} pass {index + 1} held as {held}: pp512 {r['pp512']:.1f}, tg "
                      f"{r['tg']:.1f} ({r['decode_bytes_per_token'] / 1e6:.0f} MB/token, "
                      f"{r['decode_vs_read']:.2f} of read), batched 16 {r['batched_16']:.1f}, "
                      f"64 {r['batched_64']:.1f} tok/s", flush=True)
        median = {held: {k: statistics.median(r[k] for r in runs[held])
                         for k in KEYS + ("decode_bytes_per_token", "decode_vs_read")}
                  for held in files}
        ratio = {k: median["bf16"][k] / median["f32"][k] for k in KEYS}
        ratio["decode_bytes_per_token"] = (median["bf16"]["decode_bytes_per_token"] /
                                           median["f32"]["decode_bytes_per_token"])
        print(f"{isa}: BF16 held as BF16 / as F32: " +
              ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
        per_isa[isa] = {"matmul_isa": runs["bf16"][-1]["matmul_isa"],
                        "limits": runs["bf16"][-1]["limits"], "median": median,
                        "bf16_vs_f32": ratio, "runs": runs}

    result = {
        "benchmark": "bf16_weights_cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "provenance": provenance(),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "models": {held: path.name for held, path in files.items()},
        "note": "the same values: the F32 file is the BF16 one widened (loom quantize --format f32)",
        "threads": args.threads, "passes": args.passes, "decode_tokens": args.tokens,
        "activations": "f32",
        "isa": per_isa,
    }
    path = ROOT / "bench" / "results" / "bf16_weights_cpu.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
