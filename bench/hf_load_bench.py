#!/usr/bin/env python3
"""Load time and peak RSS of the default model from a Hugging Face directory vs its GGUF (issue 24).

Writes the default model (SmolLM2-135M-Instruct, Q4_1) as HF directories in float16 and bfloat16
(tests/common/hf_checkpoint.py), then loads each form with the same binary
(tests/tools/forward_pass_tool: open, tokenizer, every weight packed for the CPU forward pass, KV pool)
and exits; wall time and the child's peak RSS (ru_maxrss) are the median / max of --repeats runs.

Each figure is printed next to the GGUF's, measured in the same run, as a ratio, and next to the
bytes the CPU forward pass must hold after packing (a lower bound for the RSS): the HF files are
mmapped, never read into a second buffer, but the CPU backend packs F16 as F16 (a copy in its
own layout) and BF16 as BF16 (kernels/cpu/weights.h), so the RSS holds the packed weights plus the
pages of the mapping touched while packing.

  python3 bench/hf_load_bench.py --build-dir build --out bench/results/hf_load.json
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "common"))

import hf_checkpoint  # noqa: E402
from provenance import provenance  # noqa: E402


def load_once(tool: pathlib.Path, model: pathlib.Path) -> tuple[float, int]:
    """(seconds, peak RSS bytes) of one tool process that loads `model` and exits."""
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execv(str(tool), [str(tool), "--model", str(model), "--threads", "1", "--num-blocks", "16"])
    _, status, usage = os.wait4(pid, 0)
    seconds = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{tool} --model {model} failed (status {status})")
    return seconds, usage.ru_maxrss * 1024


def directory_bytes(path: pathlib.Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", type=pathlib.Path, default=ROOT / "build")
    parser.add_argument("--model", type=pathlib.Path,
                        default=ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "hf_load.json")
    args = parser.parse_args()
    tool = args.build_dir / "tests" / "tools" / "forward_pass_tool"
    if not tool.exists():
        print(f"{tool} is missing: build the forward_pass_tool target", file=sys.stderr)
        return 2

    results = {"provenance": provenance(), "machine": platform.machine(), "model": str(args.model),
               "repeats": args.repeats, "forms": {}}
    with tempfile.TemporaryDirectory(prefix="loom_hf_bench_") as tmp:
        forms = {"gguf": args.model}
        for dtype in ("float16", "bfloat16"):
            forms[f"hf_{dtype}"] = hf_checkpoint.write_hf_directory(args.model, pathlib.Path(tmp) / dtype,
                                                                    dtype=dtype)
        for name, path in forms.items():
            runs = [load_once(tool, path) for _ in range(args.repeats)]
            results["forms"][name] = {
                "load_s": statistics.median(r[0] for r in runs),
                "peak_rss_bytes": max(r[1] for r in runs),
                "weight_file_bytes": directory_bytes(path),
            }
    gguf = results["forms"]["gguf"]
    # Packed CPU weights: F16 and BF16 stay 2 bytes per value.
    values = results["forms"]["hf_float16"]["weight_file_bytes"] / 2
    packed = {"gguf": gguf["weight_file_bytes"], "hf_float16": 2 * values, "hf_bfloat16": 2 * values}
    print(f"{'form':<14} {'load s':>8} {'vs gguf':>8} {'peak RSS MiB':>13} {'vs gguf':>8} "
          f"{'packed MiB':>11} {'RSS/packed':>11}")
    for name, form in results["forms"].items():
        form["packed_weight_bytes"] = packed[name]
        form["load_vs_gguf"] = form["load_s"] / gguf["load_s"]
        form["rss_vs_gguf"] = form["peak_rss_bytes"] / gguf["peak_rss_bytes"]
        form["rss_vs_packed"] = form["peak_rss_bytes"] / packed[name]
        print(f"{name:<14} {form['load_s']:8.2f} {form['load_vs_gguf']:8.2f} "
              f"{form['peak_rss_bytes'] / 2**20:13.0f} {form['rss_vs_gguf']:8.2f} "
              f"{packed[name] / 2**20:11.0f} {form['rss_vs_packed']:11.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
