"""Draws latency against load from a `loom bench` JSON report (PNG next to it, or --out).

    .venv/bin/python bench/plot_serving.py bench/results/serving_loom_bench.json

Three panels over the load levels of the report (concurrency or request rate): output
tokens/s, TTFT p50/p90/p99, and TPOT/ITL p50/p99.
"""
import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("report", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    runs = report["runs"]
    key = "concurrency" if "concurrency" in runs[0] else "request_rate"
    levels = [float(r[key]) if r[key] != "inf" else float("nan") for r in runs]
    labels = [str(r[key]) for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].plot(levels, [r["output_throughput"] for r in runs], "o-")
    axes[0].set_ylabel("output tokens/s")
    for q in ("p50", "p90", "p99"):
        axes[1].plot(levels, [r["ttft_ms"][q] for r in runs], "o-", label=f"TTFT {q}")
    axes[1].set_ylabel("ms")
    axes[1].legend()
    for name, q in (("tpot_ms", "p50"), ("tpot_ms", "p99"), ("itl_ms", "p50"), ("itl_ms", "p99")):
        axes[2].plot(levels, [r[name][q] for r in runs], "o-", label=f"{name.split('_')[0].upper()} {q}")
    axes[2].set_ylabel("ms")
    axes[2].legend()
    for axis in axes:
        axis.set_xlabel(key.replace("_", " "))
        axis.set_xticks(levels, labels)
        axis.grid(alpha=0.3)
    workload = report.get("workload", {})
    fig.suptitle(f"loom bench: {report.get('model', '')}, {workload.get('dataset', '')} "
                 f"(input {workload.get('input_len')}, output {workload.get('output_len')} tokens)")
    fig.tight_layout()
    out = args.out or args.report.with_suffix(".png")
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
