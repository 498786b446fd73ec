#!/usr/bin/env python3
"""Summarizes the Nsight Compute profiles of tests/gpu/profile.sh: one line per kernel of each
benchmark's profiled ranges, named by the shape the benchmark printed for the range.

  tests/gpu/profile_report.py WORK_DIR [--json FILE]

WORK_DIR holds, per benchmark B, B.csv (`ncu --import B.ncu-rep --csv --page raw --print-units
base`), B.log (the benchmark's output under ncu, with its "loom-profile-range N LABEL" lines)
and B.status ("EXIT SECONDS"). A range's kernels are those listed before its marker kernel
(`loom_profile_marker`, N blocks: bench/profile_range.h). Prints the summary, and writes the
per-kernel figures as JSON to --json. Metrics a version of ncu names differently are left out
of a line rather than guessed.
"""
import argparse
import csv
import io
import json
import pathlib
import re
import sys

MARKER = "loom_profile_marker"
RANGE_LINE = re.compile(r"^loom-profile-range (\d+) (.*)$")
# Each figure and the raw-page columns it may come from (the first one present wins).
FIGURES = {
    "duration_us": ["gpu__time_duration.sum"],
    "dram_pct": ["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed"],
    "memory_pct": ["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"],
    "sm_pct": ["sm__throughput.avg.pct_of_peak_sustained_elapsed"],
    "dram_read_bytes": ["dram__bytes_read.sum"],
    "dram_write_bytes": ["dram__bytes_write.sum"],
    "l2_hit_pct": ["lts__t_sector_hit_rate.pct"],
    "achieved_occupancy_pct": ["sm__warps_active.avg.pct_of_peak_sustained_active"],
    "theoretical_occupancy_pct": ["sm__maximum_warps_per_active_cycle_pct"],
    "registers": ["launch__registers_per_thread"],
    "grid": ["launch__grid_size"],
    "block": ["launch__block_size"],
    "waves": ["launch__waves_per_multiprocessor"],
    "issue_active_pct": ["sm__issue_active.avg.pct_of_peak_sustained_active",
                         "sm__inst_issued.avg.pct_of_peak_sustained_active"],
}
TENSOR_PIPE = re.compile(r"^sm__pipe_tensor\w*cycles_active\.avg\.pct_of_peak_sustained_active$")
STALL = re.compile(r"^smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$")
# Base units (--print-units base) are nanoseconds and bytes; these read the others.
TIME_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
              "ms": 1e3, "second": 1e6, "s": 1e6}
BYTE_SCALE = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6,
              "GB": 1e9}


def number(text):
    """The cell as a float (thousands separators dropped), or None."""
    try:
        return float(str(text).replace(",", "").strip())
    except ValueError:
        return None


def read_rows(text):
    """The raw page's kernel rows as dicts, and its units row (the row without an ID)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line), None)
    if start is None:
        return [], {}
    rows, units = [], {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if (row.get("ID") or "").strip():
            rows.append(row)
        elif not units:
            units = row
    return rows, units


def short_name(name):
    """A demangled kernel name without its return type, parameters and namespaces."""
    name = re.sub(r"^void ", "", name.strip())
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"\(anonymous namespace\)::|\b[A-Za-z_]\w*::", "", name)
    return name if len(name) <= 90 else name[:87] + "..."


def figures(row, units):
    out = {"kernel": short_name(row.get("Kernel Name", ""))}
    for key, columns in FIGURES.items():
        column = next((c for c in columns if c in row and number(row[c]) is not None), None)
        if column is not None:
            value = number(row[column])
            unit = (units.get(column) or "").strip()
            if key == "duration_us":
                value *= TIME_SCALE.get(unit or "ns", 1e-3)
            elif key.endswith("_bytes"):
                value *= BYTE_SCALE.get(unit or "byte", 1.0)
            out[key] = value
    shared = [number(row.get(f"launch__shared_mem_per_block_{kind}")) for kind in
              ("static", "dynamic")]
    if any(v is not None for v in shared):
        out["shared_bytes"] = sum(v for v in shared if v is not None)
    tensor = [number(v) for c, v in row.items() if c and TENSOR_PIPE.match(c)]
    tensor = [v for v in tensor if v is not None]
    if tensor:
        out["tensor_pipe_pct"] = max(tensor)
    stalls = {}
    for column, value in row.items():
        match = STALL.match(column or "")
        if match and "not_issued" not in column and number(value) is not None:
            stalls[match.group(1)] = number(value)
    if stalls:
        out["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:4])
    if out.get("duration_us") and "dram_read_bytes" in out:
        moved = out["dram_read_bytes"] + out.get("dram_write_bytes", 0.0)
        out["dram_gbs"] = moved / (out["duration_us"] * 1e3)
    return out


def ranges_of(rows, units, labels):
    """The kernels between markers, as [{range, label, kernels}] in launch order."""
    ranges, pending = [], []
    for row in sorted(rows, key=lambda r: number(r.get("ID")) or 0):
        if MARKER in row.get("Kernel Name", ""):
            grid = number(row.get("launch__grid_size"))
            if grid is None:  # "(N, 1, 1)"
                grid = number((re.findall(r"\d+", row.get("Grid Size", "")) or ["0"])[0])
            index = int(grid or 0)
            ranges.append({"range": index, "label": labels.get(index, f"range {index}"),
                           "kernels": [figures(r, units) for r in pending]})
            pending = []
        else:
            pending.append(row)
    if pending:  # kernels after the last marker: a range cut off, or ranges not in use
        ranges.append({"range": None, "label": "kernels outside a closed range",
                       "kernels": [figures(r, units) for r in pending]})
    return ranges


# The throughput part of a kernel's line, in this order, for the figures it has.
THROUGHPUT_PARTS = (("dram_gbs", "DRAM {:.0f} GB/s"), ("dram_pct", "{:.0f}% of DRAM peak"),
                    ("memory_pct", "memory {:.0f}%"), ("sm_pct", "SM {:.0f}%"),
                    ("tensor_pipe_pct", "tensor pipe {:.0f}%"), ("issue_active_pct", "issue {:.0f}%"))


def kernel_line(k):
    parts = []
    if "grid" in k:
        launch = f"grid {k['grid']:.0f} x {k.get('block', 0):.0f}"
        if "registers" in k:
            launch += f", {k['registers']:.0f} regs"
        if "shared_bytes" in k:
            launch += f", {k['shared_bytes'] / 1024:.0f} KiB smem"
        if "waves" in k:
            launch += f", {k['waves']:.2f} waves"
        parts.append(launch)
    if "duration_us" in k:
        parts.append(f"{k['duration_us']:.1f} us")
    memory = [template.format(k[key]) for key, template in THROUGHPUT_PARTS if key in k]
    if memory:
        parts.append(", ".join(memory))
    if "achieved_occupancy_pct" in k:
        parts.append(f"occupancy {k['achieved_occupancy_pct']:.0f}% of "
                     f"{k.get('theoretical_occupancy_pct', 0):.0f}% possible")
    if "l2_hit_pct" in k:
        parts.append(f"L2 hit {k['l2_hit_pct']:.0f}%")
    if k.get("stalls"):
        parts.append("stalls/issue " + ", ".join(f"{n} {v:.1f}" for n, v in k["stalls"].items()))
    return f"      {k['kernel']}: " + "; ".join(parts)


def summarize(work):
    """{bench: {exit, seconds, ranges}} for each B.status in `work`, and the text lines."""
    report, lines = {}, []
    for status in sorted(work.glob("*.status")):
        bench = status.stem
        fields = status.read_text().split()
        entry = {"exit": int(fields[0]) if fields else None,
                 "seconds": int(fields[1]) if len(fields) > 1 else None, "ranges": []}
        log = work / f"{bench}.log"
        labels = {}
        log_text = log.read_text(errors="replace") if log.is_file() else ""
        for line in log_text.splitlines():
            match = RANGE_LINE.match(line.strip())
            if match:
                labels[int(match.group(1))] = match.group(2)
        csv_path = work / f"{bench}.csv"
        rows, units = read_rows(csv_path.read_text(errors="replace")) if csv_path.is_file() \
            else ([], {})
        entry["ranges"] = ranges_of(rows, units, labels)
        entry["ranges_printed"] = len(labels)
        lines.append(f"{bench}: exit {entry['exit']}, {entry['seconds']} s under ncu, "
                     f"{len(rows)} kernels profiled in {len(entry['ranges'])} ranges "
                     f"({len(labels)} opened)")
        if not rows:
            tail = [l for l in log_text.splitlines() if "==PROF==" in l or "==ERROR==" in l
                    or "==WARNING==" in l or "rror" in l][-6:]
            lines.extend(f"    {l.strip()}" for l in tail)
        for r in entry["ranges"]:
            total = sum(k.get("duration_us", 0.0) for k in r["kernels"])
            lines.append(f"  [{r['range']}] {r['label']}: {len(r['kernels'])} kernels, "
                         f"{total:.1f} us")
            lines.extend(kernel_line(k) for k in r["kernels"])
        report[bench] = entry
    return report, lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    report, lines = summarize(args.work)
    if not report:
        print(f"profile_report: no <bench>.status in {args.work}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
