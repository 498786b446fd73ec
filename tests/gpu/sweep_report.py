#!/usr/bin/env python3
"""Ranks what tests/gpu/sweep.sh measured, so a window's decision takes a glance.

* quantized_gemm_sweep.json: per range of m (the ranges kQuantGemmRanges can hold), every
  member against the dispatch table's, as the geometric mean over the range's rows (formats
  and shapes) of table time / member time, with its worst row; a member counts only where it
  ran in every row of the range ("/1": the member forced to one split).
* cuda_attention_sweep.json: per KV dtype, every decode member against the dispatched one
  (index 0), the same way, overall and per batch size; and, from its "splits" rows, per
  (batch, context) the split count that ran fastest, its partition length and its gain over
  the heuristic's choice (what kPagedDecodeMinPartition should be); and, from its "prefill"
  rows, every prefill tiling against the dispatched one (index 0) over the rows, with the
  dispatched tiling's and the best member's share of the BF16 GEMM rate.

    tests/gpu/sweep_report.py DIR    # the folder holding the JSON files (sweep.sh's $OUT)
"""
import argparse
import json
import math
import pathlib
import sys
from collections import defaultdict

GEMM_RANGES = ((1, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 256))


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _ranked(ratios_by_member, rows, top):
    """[(geomean, worst, member)] of the members present in all `rows`, best first."""
    ranked = [(_geomean(r), min(r), member) for member, r in ratios_by_member.items()
              if len(r) == rows]
    return sorted(ranked, reverse=True)[:top]


def gemm_report(data, top=3):
    """Lines ranking the GEMM members per range of m."""
    lines = []
    for low, high in GEMM_RANGES:
        rows = [r for r in data["rows"] if low <= r["m"] <= high]
        if not rows:
            continue
        ratios = defaultdict(list)
        for row in rows:
            table = row["timings"][0]["us"]
            seen = set()
            for timing in row["timings"][1:]:
                label = timing["config"] + ("/1" if timing["config"] in seen else "")
                seen.add(timing["config"])
                ratios[label].append(table / timing["us"])
        best = _ranked(ratios, len(rows), top)
        tables = sorted({r["table"] for r in rows})
        lines.append(f"m {low}-{high} (table: {', '.join(tables)}; {len(rows)} rows): " + (
            "; ".join(f"{m} {g:.2f}x (worst {w:.2f}x)" for g, w, m in best) or "no member in every row"))
    return lines


def attention_report(data, top=3):
    """Lines ranking the decode members per KV dtype, overall and per batch."""
    lines = []
    for kv in sorted({r["kv"] for r in data["rows"]}):
        rows = [r for r in data["rows"] if r["kv"] == kv]
        for label, subset in [("all", rows)] + [
                (f"batch {b}", [r for r in rows if r["batch"] == b])
                for b in sorted({r["batch"] for r in rows})]:
            ratios = defaultdict(list)
            for row in subset:
                names = list(row["us"])
                dispatched = row["us"][names[0]]
                for name in names[1:]:
                    if row["us"][name] is not None:
                        ratios[name].append(dispatched / row["us"][name])
            best = _ranked(ratios, len(subset), top)
            lines.append(f"{kv} {label} ({len(subset)} rows): " + (
                "; ".join(f"{m} {g:.2f}x (worst {w:.2f}x)" for g, w, m in best)
                or "no member in every row"))
    prefill = data.get("prefill", [])
    if prefill:
        ratios = defaultdict(list)
        for row in prefill:
            names = list(row["us"])
            for name in names[1:]:
                ratios[name].append(row["us"][names[0]] / row["us"][name])
        best = _ranked(ratios, len(prefill), top)
        lines.append(f"prefill ({len(prefill)} rows, dispatched {list(prefill[0]['us'])[0]}): " + (
            "; ".join(f"{m} {g:.2f}x (worst {w:.2f}x)" for g, w, m in best)
            or "no member in every row"))
        gemm = data.get("gemm_bf16_tflops")
        for row in prefill if gemm else []:
            name, us = min(row["us"].items(), key=lambda kv: kv[1])
            dispatched = list(row["us"].values())[0]
            lines.append(f"prefill {row['query']} over {row['context']}: dispatched "
                         f"{row['tflop'] / dispatched * 1e6 / gemm:.3f} of the GEMM rate, "
                         f"best {name} {row['tflop'] / us * 1e6 / gemm:.3f}")
    for row in data.get("splits", []):
        timed = {int(s): us for s, us in row["us"].items()}
        splits = min(timed, key=timed.get)
        lines.append(f"splits batch {row['batch']} x {row['context']}: best {splits} "
                     f"({-(-row['context'] // splits)}-token partitions) "
                     f"{row['heuristic_us'] / timed[splits]:.2f}x the heuristic")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=pathlib.Path)
    args = parser.parse_args(argv)
    found = False
    for name, report in (("quantized_gemm_sweep.json", gemm_report),
                         ("cuda_attention_sweep.json", attention_report)):
        path = args.folder / name
        if not path.is_file():
            continue
        found = True
        print(f"{name}: members against what is dispatched, geometric mean of time ratios")
        for line in report(json.loads(path.read_text())):
            print("  " + line)
    if not found:
        print(f"sweep_report: no sweep JSON in {args.folder}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
