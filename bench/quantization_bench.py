#!/usr/bin/env python3
"""Quantization quality and CPU decode speed of the default model (issue 8), in one run.

Writes the default model (SmolLM2-135M-Instruct, Q4_1 weights) as F32 (the reference: its
Q4_1 values dequantized), F16, INT8 per channel, and INT4 at group 128/64/32 with
round-to-nearest and AWQ, then measures with the same binaries:

* perplexity (`loom perplexity`, windows of --context tokens every --stride) on held-out
  text: the Python tutorial from Debian's python3-doc; AWQ calibrates on the library
  reference of the same package (disjoint files);
* decode tokens/s (`loom generate`, greedy, median of --repeats runs) for INT4, INT8, F16
  and F32 weights.

Each figure is printed with the limit it is held against (the issue's targets) as a ratio,
and everything goes to bench/results/quantization.json.

  python3 bench/quantization_bench.py --build-dir build --out bench/results/quantization.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

from provenance import provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = pathlib.Path("/usr/share/doc/python3.11/html/_sources")
# A chat request that makes every variant write past --decode-tokens (no early EOS).
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def run(args, timeout=3600) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def corpus(directory: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    files = sorted(directory.glob("*.rst.txt"))
    if not files:
        sys.exit(f"no text under {directory}: install python3-doc (scripts/install-deps.sh)")
    out.write_text("".join(f.read_text(errors="replace") for f in files))
    return out


def package_version(name: str) -> str:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def measure_decode(loom: pathlib.Path, work: pathlib.Path, args) -> dict:
    """Median decode tokens/s per weight format. Repeats go round-robin over the formats, so
    a burst of load from other jobs on the machine hits all of them alike."""
    models = {"int4_g128_rtn": work / "int4_g128_rtn.gguf", "int4_q4_1_source": args.model,
              "int8": work / "int8.gguf", "f16": work / "f16.gguf", "f32": work / "f32.gguf"}
    rates: dict = {name: [] for name in models}
    for _ in range(args.repeats):
        for name, path in models.items():
            done = run([loom, "generate", "--chat", "--model", path, "--prompt", PROMPT,
                        "--max-tokens", args.decode_tokens, "--threads", args.threads])
            match = re.search(r"decode: (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\)", done.stderr)
            if match is None or int(match.group(1)) < args.decode_tokens - 1:
                sys.exit(f"{name}: decode stopped early or was not reported:\n{done.stderr[-2000:]}")
            rates[name].append(float(match.group(3)))
    results = {name: {"tokens_per_second": statistics.median(runs), "runs": runs}
               for name, runs in rates.items()}
    for name, entry in results.items():
        entry["ratio_to_f32"] = entry["tokens_per_second"] / results["f32"]["tokens_per_second"]
        print(f"decode {name:18s} {entry['tokens_per_second']:7.1f} tokens/s "
              f"({entry['ratio_to_f32']:.2f}x F32; runs {entry['runs']})", flush=True)
    return {"prompt": PROMPT, "chat": True, "max_tokens": args.decode_tokens,
            "repeats": args.repeats, "threads": args.threads, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", type=pathlib.Path, default=ROOT / "build")
    parser.add_argument("--model", type=pathlib.Path, default=ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "quantization.json")
    parser.add_argument("--ppl-tokens", type=int, default=8192)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--stride", type=int, default=256)
    parser.add_argument("--calibration-samples", type=int, default=128)
    parser.add_argument("--calibration-length", type=int, default=256)
    parser.add_argument("--awq-samples", type=int, default=1024)
    parser.add_argument("--awq-groups", default="128,64", help="INT4 group sizes also quantized with AWQ")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decode-only", action="store_true",
                        help="re-measure decode only, with the models left in --work-dir by a full "
                             "run, and update --out's decode section")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=pathlib.Path, default=None)
    args = parser.parse_args()

    loom = args.build_dir / "coordinator" / "loom"
    if not loom.exists():
        sys.exit(f"{loom} is missing: build the project first")
    work = args.work_dir or pathlib.Path(tempfile.mkdtemp(prefix="loom-quant-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.decode_only:
        report = json.loads(args.out.read_text())
        report["decode"] = measure_decode(loom, work, args)
        report["decode_measured"] = time.strftime("%Y-%m-%d %H:%M")
        report["decode_provenance"] = provenance()
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"updated {args.out}")
        return
    held_out = corpus(DOCS / "tutorial", work / "held_out.txt")
    calibration = corpus(DOCS / "library", work / "calibration.txt")
    threads = ("--threads", str(args.threads))

    variants = {
        "f32": ("--format", "f32"),
        "f16": ("--format", "f16"),
        "int8": ("--format", "int8"),
    }
    for group in (128, 64, 32):
        variants[f"int4_g{group}_rtn"] = ("--format", "int4", "--group-size", str(group))
    awq_flags = ("--method", "awq", "--calibration", calibration,
                 "--calibration-samples", str(args.calibration_samples),
                 "--calibration-length", str(args.calibration_length),
                 "--awq-samples", str(args.awq_samples))
    for group in (int(g) for g in args.awq_groups.split(",") if g):
        variants[f"int4_g{group}_awq"] = ("--format", "int4", "--group-size", str(group), *awq_flags)
    # Scales alone (no clipping search), to show what each half of AWQ contributes.
    variants["int4_g128_awq_scales_only"] = ("--format", "int4", "--group-size", "128", *awq_flags,
                                             "--awq-clip", "off")

    results: dict = {}
    for name, flags in variants.items():
        path = work / f"{name}.gguf"
        start = time.monotonic()
        done = run([loom, "quantize", "--model", args.model, "--out", path, *flags, *threads])
        seconds = time.monotonic() - start
        entry = {"file_bytes": path.stat().st_size, "quantize_seconds": round(seconds, 1)}
        summary = re.search(r"awq: summed output MSE (\S+) vs (\S+) for rtn", done.stderr)
        if summary:
            entry["awq_scaled_output_mse_sum"] = float(summary.group(1))
            entry["rtn_output_mse_sum"] = float(summary.group(2))
        clip = re.search(r"awq clip: summed group output error (\S+) vs (\S+) unclipped", done.stderr)
        if clip:
            entry["clip_error_ratio"] = float(clip.group(1)) / float(clip.group(2))
        ppl = json.loads(run([loom, "perplexity", "--model", path, "--text", held_out, "--json",
                              "--context", args.context, "--stride", args.stride,
                              "--max-tokens", args.ppl_tokens, *threads]).stdout)
        entry.update({"perplexity": ppl["perplexity"], "nll": ppl["nll"], "scored_tokens": ppl["scored"]})
        results[name] = entry
        print(f"{name:16s} ppl {ppl['perplexity']:8.4f}  file {entry['file_bytes'] / 1e6:6.1f} MB  "
              f"quantize {seconds:6.1f} s", flush=True)

    original = json.loads(run([loom, "perplexity", "--model", args.model, "--text", held_out, "--json",
                               "--context", args.context, "--stride", args.stride,
                               "--max-tokens", args.ppl_tokens, *threads]).stdout)
    reference = results["f32"]["perplexity"]
    for entry in results.values():
        entry["ppl_ratio_to_f32"] = entry["perplexity"] / reference

    decode = measure_decode(loom, work, args)
    int8_ratio = results["int8"]["ppl_ratio_to_f32"]
    rtn_gap = results["int4_g128_rtn"]["perplexity"] - reference
    targets = {
        "int8_within_0.5pct_of_f32": {"ratio": int8_ratio, "limit": 1.005, "met": int8_ratio <= 1.005},
    }
    if "int4_g128_awq" in results:
        awq_gap = results["int4_g128_awq"]["perplexity"] - reference
        targets["awq_g128_closer_than_rtn_g128"] = {
            "awq_gap": awq_gap, "rtn_gap": rtn_gap, "ratio": awq_gap / rtn_gap, "limit": 1.0,
            "met": awq_gap < rtn_gap}
    for name, target in targets.items():
        print(f"target {name}: ratio {target['ratio']:.4f} vs limit {target['limit']} -> "
              f"{'met' if target['met'] else 'NOT met'}")

    report = {
        "bench": "quantization",
        "date": time.strftime("%Y-%m-%d"),
        "provenance": provenance(),
        "threads_used": args.threads,
        "model": args.model.name,
        "reference": "f32: the Q4_1 source weights dequantized, written by `loom quantize --format f32`",
        "original_q4_1_perplexity": original["perplexity"],
        "corpus": {
            "package": f"python3-doc ({package_version('python3.11-doc')}, Debian)",
            "held_out": str(DOCS / "tutorial" / "*.rst.txt"),
            "calibration": str(DOCS / "library" / "*.rst.txt"),
        },
        "perplexity_settings": {"tokens": args.ppl_tokens, "context": args.context, "stride": args.stride,
                                "kv_dtype": "f16"},
        "awq_settings": {"calibration_samples": args.calibration_samples,
                         "calibration_length": args.calibration_length,
                         "awq_samples": args.awq_samples, "grid": 20, "clip": "on (max shrink 0.5) "
                         "unless the variant says scales_only"},
        "group_size_note": "SmolLM2's 576-wide matrices (Q/K/V/O, gate/up) take g64 when g128 is asked "
                           "(576 = 4.5 x 128); ffn_down (1536 wide) takes g128",
        "perplexity": results,
        "decode": decode,
        "targets": targets,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
