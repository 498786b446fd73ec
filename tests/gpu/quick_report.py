#!/usr/bin/env python3
"""Builds tests/gpu/quick.sh's report from what its steps left in the work folder.

quick.sh calls this after every step, so a run killed at any point still leaves a report:

  quick_report.py --work DIR --out DIR [--step NAME --status S --seconds T --limit L
                  [--detail TEXT]] [--meta KEY=VALUE ...] [--final]

The work folder holds steps.json (one record per finished step, appended here), meta.json
(facts from the preflight), xml/*.xml (GoogleTest results of each test step; its console
output xml/*.log stands in for a step killed before the XML was written) and
bench/*.json (the benchmarks' results). The report is report.json and report.txt in --out.

A test counts as failed when GoogleTest says so. A skipped test is reported with its reason;
it is a failure only when it skipped for want of a CUDA device on a machine that has one
(then the step verified nothing). With --final the exit status is 1 when a test or a step
failed, else 0.
"""
import argparse
import datetime
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

FAILED_STEP_STATUSES = ("failed", "timed out")


def load_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def summary(text):
    """The first line of a GoogleTest message after its "file:line" location line."""
    lines = (text or "").strip().splitlines()
    if len(lines) > 1 and re.match(r"^\S+:\d+$", lines[0]):
        lines = lines[1:]
    return lines[0][:300] if lines else ""


RESULT_LINE = re.compile(r"^\[\s*(RUN|OK|FAILED|SKIPPED)\s*\] ([^\s,]+)(.*?)(\((\d+) ms\))?\s*$")


def read_log(step, path):
    """The tests of a step killed before GoogleTest wrote its XML, from its console output:
    each finished test's result, and the one running when it was killed as failed."""
    tests, running, said = [], None, []
    with open(path, errors="replace") as f:
        for line in f:
            match = RESULT_LINE.match(line)
            if not match:
                # What a test printed: its failure or skip message follows a "file:line:
                # Failure" (or "Skipped") line.
                if running is not None and not re.match(r"^\S+:\d+: (Failure|Skipped)$", line.strip()):
                    said.append(line.strip())
                continue
            tag, name, _, timed, ms = match.groups()
            if tag == "RUN":
                running, said = name, []
            elif name == running and (timed or tag == "SKIPPED"):
                result = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}[tag]
                message = next((text for text in said if text), "") if result != "passed" else ""
                tests.append({"step": step, "name": name, "result": result,
                              "time": int(ms) / 1000 if ms else 0.0, "message": message[:300]})
                running = None
    if running is not None:
        tests.append({"step": step, "name": running, "result": "failed", "time": None,
                      "message": "still running when the step was killed (its time limit)"})
    return tests


def read_tests(work):
    tests = []
    logs = {os.path.splitext(os.path.basename(path))[0]: path
            for path in glob.glob(os.path.join(work, "xml", "*.log"))}
    for step, path in sorted(logs.items()):
        if not os.path.exists(os.path.join(work, "xml", f"{step}.xml")):
            tests.extend(read_log(step, path))
    for path in sorted(glob.glob(os.path.join(work, "xml", "*.xml"))):
        step = os.path.splitext(os.path.basename(path))[0]
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError) as error:
            tests.append({"step": step, "name": f"<{os.path.basename(path)}>", "result": "failed",
                          "time": None, "message": f"unreadable GoogleTest output: {error}"})
            if step in logs:
                tests.extend(read_log(step, logs[step]))
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname')}.{case.get('name')}"
            failure = case.find("failure")
            skipped = case.find("skipped")
            if failure is not None:
                result, message = "failed", failure.get("message") or failure.text
            elif skipped is not None or case.get("result") == "skipped":
                result = "skipped"
                message = skipped.get("message") if skipped is not None else ""
            elif case.get("status") == "notrun" or case.get("result") == "suppressed":
                continue
            else:
                result, message = "passed", ""
            tests.append({"step": step, "name": name, "result": result,
                          "time": float(case.get("time") or 0), "message": summary(message)})
    return tests


def build(work, out, final):
    meta = load_json(os.path.join(work, "meta.json"), {})
    steps = load_json(os.path.join(work, "steps.json"), [])
    tests = read_tests(work)
    has_gpu = bool(meta.get("device"))
    for t in tests:
        if t["result"] == "skipped":
            blind = "no CUDA device" in t["message"]
            t["skip"] = "unexpected: no device seen" if (blind and has_gpu) else "by design"
    counts = {k: sum(1 for t in tests if t["result"] == k) for k in ("passed", "failed", "skipped")}
    unexpected = [t["name"] for t in tests if t.get("skip", "").startswith("unexpected")]
    failed_steps = [s["name"] for s in steps if s["status"] in FAILED_STEP_STATUSES]
    benches = {}
    for path in sorted(glob.glob(os.path.join(work, "bench", "*.json"))):
        benches[os.path.splitext(os.path.basename(path))[0]] = load_json(path, None)
    verdict = "failed" if (counts["failed"] or unexpected or failed_steps) else "passed"
    if not final:
        verdict = f"running ({verdict} so far)"
    report = {
        "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "verdict": verdict,
        "meta": meta,
        "steps": steps,
        "test_counts": counts,
        "unexpected_skips": unexpected,
        "failed_tests": [t for t in tests if t["result"] == "failed"],
        "skipped_tests": [t for t in tests if t["result"] == "skipped"],
        "tests": tests,
        "benchmarks": benches,
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.json.tmp"), "w") as f:
        json.dump(report, f, indent=1)
    os.replace(os.path.join(out, "report.json.tmp"), os.path.join(out, "report.json"))

    lines = [f"Loom GPU quick check: {verdict}  ({report['updated']})"]
    for key in ("device", "driver", "kernel", "sandbox", "commit", "cuda_architectures",
                "cublas", "nccl", "compute_sanitizer"):
        if key in meta:
            lines.append(f"  {key:<18} {meta[key]}")
    lines.append("")
    lines.append(f"{'step':<11} {'status':<22} {'seconds':>8} {'limit':>6}  detail")
    for s in steps:
        lines.append(f"{s['name']:<11} {s['status']:<22} {s['seconds']:>8.1f} {s['limit']:>6}"
                     f"  {s.get('detail', '')}")
    lines.append("")
    lines.append(f"tests: {counts['passed']} passed, {counts['failed']} failed, "
                 f"{counts['skipped']} skipped")
    for t in report["failed_tests"]:
        lines.append(f"  FAILED  [{t['step']}] {t['name']}: {t['message']}")
    for t in report["skipped_tests"]:
        lines.append(f"  skipped ({t['skip']}) [{t['step']}] {t['name']}: {t['message']}")
    for name, data in benches.items():
        if isinstance(data, dict):
            ratios = {k: v for k, v in data.items() if isinstance(v, (int, float))}
            lines.append(f"bench {name}: {json.dumps(ratios)[:400]}")
            if data.get("reason"):
                lines.append(f"  {data['reason']}")
            for row in data.get("levels_brief", []):
                lines.append(f"  {row['concurrency']:>4} streams: {row['output_tokens_per_s']:.1f} "
                             f"output tokens/s, TTFT p50 {row['ttft_ms_p50']:.1f} ms p99 "
                             f"{row['ttft_ms_p99']:.1f} ms, ITL p50 {row['itl_ms_p50']:.2f} ms "
                             f"p99 {row['itl_ms_p99']:.2f} ms"
                             + (f"; worker step {row['worker_step_ms']:.2f} ms (forward "
                                f"{row['worker_execute_ms']:.2f}, sampling "
                                f"{row['worker_sample_ms']:.2f})" if "worker_step_ms" in row else ""))
            # serve_bench.py --kv-dtypes: one line per KV dtype at the same KV byte budget.
            for row in data.get("kv_dtypes", []):
                lines.append(f"  {row['kv_dtype']} KV, {row['pool_blocks']} blocks = "
                             f"{row['pool_tokens']} tokens ({row['pool_mib']:.1f} MiB): "
                             f"{row['output_tokens_per_s']:.1f} output tokens/s"
                             + (f", {row['ratio_to_f16']:.2f}x F16 (target {data['target']})"
                                if "ratio_to_f16" in row else "")
                             + f"; TTFT p50 {row['ttft_ms_p50']:.1f} ms p99 "
                             f"{row['ttft_ms_p99']:.1f} ms, ITL p50 {row['itl_ms_p50']:.2f} ms "
                             f"p99 {row['itl_ms_p99']:.2f} ms; "
                             f"{row['worker_mean_batch']:.1f} sequences a step, "
                             f"{row['preemptions']} preemptions")
            # fp8_perplexity.py: each perplexity of the trained model, FP8 over BF16.
            if isinstance(data.get("perplexity"), dict):
                training = data.get("training", {})
                lines.append("  perplexity " + ", ".join(
                    f"{k} {v:.3f}" for k, v in data["perplexity"].items())
                    + (f"; FP8 / BF16 {data['fp8_over_bf16']:.4f} (target {data['target']})"
                       if "fp8_over_bf16" in data else "")
                    + (f"; trained {training.get('steps')} steps, "
                       f"{training.get('seconds')} s, last loss {training.get('last_loss')}"
                       if training else ""))
            if data.get("error"):
                lines.append(f"  error: {str(data['error'])[:600]}")
            for row in data.get("comparisons", []):
                lines.append(f"  {row['kernel']} {row.get('dtype', '')} {row['shape']}: "
                             f"Loom / PyTorch {row['loom_over_torch']:.3f}"
                             + (f" (target {row['target']})" if "target" in row else ""))
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 1 if verdict == "failed" else 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--step")
    parser.add_argument("--status")
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--detail", default="")
    parser.add_argument("--meta", action="append", default=[])
    parser.add_argument("--final", action="store_true")
    args = parser.parse_args()
    if args.meta:
        path = os.path.join(args.work, "meta.json")
        meta = load_json(path, {})
        for item in args.meta:
            key, _, value = item.partition("=")
            meta[key] = value
        with open(path, "w") as f:
            json.dump(meta, f, indent=1)
    if args.step:
        path = os.path.join(args.work, "steps.json")
        steps = load_json(path, [])
        steps.append({"name": args.step, "status": args.status, "seconds": args.seconds,
                      "limit": args.limit, "detail": args.detail})
        with open(path, "w") as f:
            json.dump(steps, f, indent=1)
    status = build(args.work, args.out, args.final)
    return status if args.final else 0


if __name__ == "__main__":
    sys.exit(main())
