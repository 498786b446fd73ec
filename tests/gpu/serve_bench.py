#!/usr/bin/env python3
"""Serving benchmark: `loom bench` against `loom up MODEL --device DEVICE`, at several
concurrency levels, beside the memory-bandwidth limit of the same run.

Batch-1 decode reads every weight once per token, so its tokens/s is at most
bandwidth / model bytes; the JSON gives that bound and the measured fraction of it. The
bandwidth is a device-to-device copy measured here (PyTorch on CUDA, NumPy on the CPU),
read + write bytes over time, the convention of bench/machine_limits.cc.

With --speculative-tokens K, batch 1 runs again twice on the same server, requests asking
for no drafts and for K n-gram drafts each: the output tokens/s of both, their ratio and
the drafts' acceptance (the random twin's greedy text repeats itself only by chance, so
this is mostly the cost of speculating where little is accepted).

With --kv-dtypes D1,D2,... (the KV dtype mode: the levels above are not run) each KV dtype
gets a server of its own, one after the other, with the same KV byte budget
(`loom up ... --kv-dtype D --kv-cache-memory BYTES`), and one `loom bench` level that needs
more KV than that budget holds: an 8-bit pool (1-byte codes and a BF16 scale per token and KV
head) holds ~1.94x F16's tokens, so more sequences run per step. Per dtype: the pool (blocks
and tokens, from the worker's "KV pool" line), output tokens/s, TTFT and ITL p50/p99, the
worker's mean step and sequences per step, the scheduler's preemptions (the coordinator's
metrics); per 8-bit dtype its tokens/s and pool tokens over F16's (`ratio_to_f16`,
`pool_tokens_ratio_to_f16`) beside the bar, --target (issue 37: 1.3). Its defaults are the GPU
window's, on the default model's random twin (SmolLM2-135M shapes: 30 layers, 3 KV heads of
64), with --kv-cache-memory 96MiB:

  F16 KV       30 layers x (K, V) x 3 heads x 64 x 2 B = 23,040 B a token, 368,640 B a block
               of 16: 96 MiB = 100,663,296 B -> 273 blocks, 4,368 tokens;
  int8 / fp8   30 x 2 x 3 x (64 + 2) B = 11,880 B a token, 190,080 B a block -> 529 blocks,
               8,464 tokens (1.94x);
  the load     128 streams of 64 prompt + 64 output tokens = 8 blocks each: 16,384 tokens in
               flight, 3.75x F16's pool and 1.94x the 8-bit one, so F16 holds ~34 whole
               sequences at once and 8-bit ~66 (the rest wait, or are preempted and recomputed);
               512 requests (4 per stream), 32,768 output tokens a dtype.

At the H200's ~2.1 ms decode step (2026-12-04, 128 streams on the same model) that is ~2 s of
F16 and ~1 s of 8-bit KV besides three starts of ~5 s: well within the window's 45 s.
The summary is rewritten after every dtype, so a run cut off keeps what it measured.

Run by tests/gpu/quick.sh on the GPU machine (the default model's random twin, INT4) and
on the CPU in CI (tests/gpu/serve_smoke_test.py) so that it never runs first on a GPU.
Standard library only, plus PyTorch or NumPy for the bandwidth when present.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from serve_smoke import (CheckFailed, Server, child_environment, exit_on_sigterm,  # noqa: E402
                         metric_total)

# The worker's step timings, cumulative: each level's share is what moved during it.
STEP_METRICS = {"steps": "loom_worker_step_seconds_count",
                "step_s": "loom_worker_step_seconds_sum",
                "execute_s": "loom_worker_execute_seconds_total",
                "sample_s": "loom_worker_sample_seconds_total"}
# ... and, in the KV dtype mode, the sequences the steps computed (their mean per step).
KV_DTYPE_METRICS = {**STEP_METRICS, "batch": "loom_worker_batch_size_sum"}
PREEMPTIONS = "loom_num_preemptions_total"
# The worker's pool: "KV pool 273 blocks x 16 tokens (f16, 96.0 MiB)" (CPU and CUDA alike).
POOL_LINE = r"loom-worker: backend .*KV pool (\d+) blocks x (\d+) tokens \(([^,]+), ([\d.]+) MiB"
# Each mode's workload where its flags leave it unset (the KV dtype mode's: its docstring).
MODE_DEFAULTS = {"levels": {"concurrency": "1,32,128", "num_requests": 128, "input_len": 128,
                            "output_len": 64},
                 "kv_dtypes": {"concurrency": "128", "num_requests": 512, "input_len": 64,
                               "output_len": 64}}


def copy_bandwidth_gbs(device):
    """Median of 5 copies of 256 MiB, (read + write) bytes per second, in GB/s; None when
    neither PyTorch (cuda) nor NumPy (cpu) is importable."""
    size = 256 << 20
    times = []
    if device == "cuda":
        try:
            import torch
        except ImportError:
            return None
        src = torch.empty(size, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        dst.copy_(src)
        torch.cuda.synchronize()
        for _ in range(5):
            start = time.perf_counter()
            dst.copy_(src)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    else:
        try:
            import numpy
        except ImportError:
            return None
        src = numpy.ones(size, dtype=numpy.uint8)
        dst = numpy.empty_like(src)
        numpy.copyto(dst, src)
        for _ in range(5):
            start = time.perf_counter()
            numpy.copyto(dst, src)
            times.append(time.perf_counter() - start)
    times.sort()
    return 2 * size / times[len(times) // 2] / 1e9


def wait_ready(server, timeout):
    """The gRPC address of `server` and its worker's metrics URL, once it is ready (one
    deadline for the whole start, not one per line awaited)."""
    deadline = time.monotonic() + timeout
    address = server.wait_for(r"coordinator listening on (\S+)", timeout).group(1)
    metrics_url = server.wait_for(r"loom-worker: metrics on (\S+)",
                                  deadline - time.monotonic()).group(1)
    server.wait_for(r"loom: ready", deadline - time.monotonic())
    return address, metrics_url


def bench_level(args, address, concurrency, num_requests, *flags):
    """One `loom bench` level against `address`: its JSON."""
    results = pathlib.Path(args.out).with_suffix(".levels.json")
    bench = subprocess.run(
        [args.loom, "bench", "--address", address, "--concurrency", concurrency,
         "--num-requests", str(num_requests), "--input-len", str(args.input_len),
         "--output-len", str(args.output_len), "--output", str(results), *flags],
        capture_output=True, text=True, timeout=600, env=child_environment())
    if bench.returncode != 0:
        raise CheckFailed(f"loom bench exited {bench.returncode}: {bench.stderr[-2000:]}")
    found = json.loads(results.read_text())
    results.unlink()
    return found


def measured_level(args, address, metrics_url, concurrency, metrics=STEP_METRICS):
    """bench_level of --num-requests with the worker's share of it: the mean step, forward
    pass and sampling (and with "batch" among `metrics`, the sequences per step) from what
    its cumulative metrics moved during the level."""
    def counters():
        return {key: metric_total(metrics_url, name, 10) or 0.0 for key, name in metrics.items()}
    before = counters()
    found = bench_level(args, address, concurrency, args.num_requests)
    after = counters()
    moved = {key: after[key] - before[key] for key in metrics}
    run = found["runs"][0]
    if moved["steps"] > 0:
        for key in ("step_s", "execute_s", "sample_s"):
            run[f"worker_{key[:-2]}_ms"] = 1000.0 * moved[key] / moved["steps"]
        if "batch" in moved:
            run["worker_mean_batch"] = moved["batch"] / moved["steps"]
    run["worker_steps"] = moved["steps"]
    return found


def brief(run):
    """A level's line for the report: output tokens/s, TTFT and ITL p50 / p99, the worker's
    mean step."""
    return {"concurrency": run["concurrency"],
            "output_tokens_per_s": round(run["output_throughput"], 1),
            "ttft_ms_p50": round(run["ttft_ms"]["p50"], 2),
            "ttft_ms_p99": round(run["ttft_ms"]["p99"], 2),
            "itl_ms_p50": round(run["itl_ms"]["p50"], 3), "itl_ms_p99": round(run["itl_ms"]["p99"], 3),
            **{key: round(run[key], 3) for key in ("worker_step_ms", "worker_execute_ms",
                                                   "worker_sample_ms") if key in run}}


def kv_dtype_ratios(summary):
    """Each 8-bit dtype's output tokens/s and pool tokens over F16's, beside the target."""
    rows = {row["kv_dtype"]: row for row in summary["kv_dtypes"]}
    if "f16" not in rows:
        return
    f16 = rows["f16"]
    for row in rows.values():
        if row is not f16:
            row["ratio_to_f16"] = round(row["output_tokens_per_s"] /
                                        max(f16["output_tokens_per_s"], 1e-9), 3)
            row["pool_tokens_ratio_to_f16"] = round(row["pool_tokens"] / f16["pool_tokens"], 3)
            row["meets_target"] = row["ratio_to_f16"] >= summary["target"]


def kv_dtype_bench(args, command):
    """The KV dtype mode (the module's docstring): one server and one level per dtype."""
    log = pathlib.Path(args.log)
    working_set = int(args.concurrency) * (args.input_len + args.output_len)
    summary = {"model": os.path.basename(args.model), "device": args.device, "command": command,
               "kv_cache_memory": args.kv_cache_memory, "target": args.target,
               "workload": {"concurrency": int(args.concurrency), "num_requests": args.num_requests,
                            "input_len": args.input_len, "output_len": args.output_len,
                            "working_set_tokens": working_set},
               "kv_dtypes": [], "runs": {}}

    def save():
        kv_dtype_ratios(summary)
        with open(args.out, "w") as out:
            json.dump(summary, out, indent=2)

    summary["passed"] = False  # until every dtype ran (killed by a limit, it stays so)
    try:
        for dtype in args.kv_dtypes.split(","):
            server = Server([*command, "--kv-dtype", dtype, "--kv-cache-memory",
                             args.kv_cache_memory],
                            log.with_name(f"{log.stem}_{dtype}{log.suffix}"), args.pgid_file)
            try:
                address, metrics_url = wait_ready(server, args.start_timeout)
                blocks, block_size, pool_dtype, mib = server.wait_for(POOL_LINE, 1).groups()
                # The scheduler's preemptions, cumulative, in the coordinator's metrics.
                coordinator = server.wait_for(r"OpenAI-compatible HTTP API on (\S+)",
                                              1).group(1).rstrip("/") + "/metrics"
                before = metric_total(coordinator, PREEMPTIONS, 10) or 0.0
                run = measured_level(args, address, metrics_url, args.concurrency,
                                     KV_DTYPE_METRICS)["runs"][0]
                run["preemptions"] = (metric_total(coordinator, PREEMPTIONS, 10) or 0.0) - before
            finally:
                server.stop()
            if run["completed"] != args.num_requests or run["failed"]:
                raise CheckFailed(f"{dtype}: {run['completed']} of {args.num_requests} requests "
                                  f"completed, {run['failed']} failed: {run.get('errors', [])[:3]}")
            pool_tokens = int(blocks) * int(block_size)
            summary["runs"][dtype] = run
            summary["kv_dtypes"].append({
                "kv_dtype": dtype, "pool_dtype": pool_dtype, "pool_blocks": int(blocks),
                "block_size": int(block_size), "pool_tokens": pool_tokens, "pool_mib": float(mib),
                "working_set_over_pool": round(working_set / pool_tokens, 2), **brief(run),
                "worker_mean_batch": round(run.get("worker_mean_batch", 0.0), 2),
                "preemptions": int(run["preemptions"])})
            save()
        summary["passed"] = True
    except (CheckFailed, subprocess.TimeoutExpired, ValueError, OSError) as error:
        summary["error"] = f"{type(error).__name__}: {error}"
    finally:
        save()
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    return 0 if summary["passed"] else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loom", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--concurrency",
                        help="streams of each level, comma-separated (default 1,32,128; with "
                             "--kv-dtypes one level, default 128)")
    parser.add_argument("--num-requests", type=int,
                        help="requests per level (default 128; with --kv-dtypes 512)")
    parser.add_argument("--input-len", type=int,
                        help="prompt tokens (default 128; with --kv-dtypes 64)")
    parser.add_argument("--output-len", type=int, help="output tokens (default 64)")
    parser.add_argument("--start-timeout", type=float, default=120)
    parser.add_argument("--log", default="serve_bench.log",
                        help="the server's log (with --kv-dtypes one per dtype: STEM_DTYPE.log)")
    parser.add_argument("--out", default="serve_bench.json")
    parser.add_argument("--pgid-file", help="where to write the process group of `loom up`")
    parser.add_argument("--bytes-per-token", type=int,
                        help="weight bytes a decode step reads (default: the model file's size; "
                             "test_model_tool prints it for an untied model, whose embedding "
                             "table is read one row per token)")
    parser.add_argument("--speculative-tokens", type=int, default=0,
                        help="then batch 1 with K n-gram drafts per step against none (0: not run)")
    parser.add_argument("--kv-dtypes",
                        help="the KV dtype mode instead of the levels: these KV dtypes, f16 "
                             "among them, one server each with --kv-cache-memory "
                             "(e.g. f16,int8,fp8_e4m3)")
    parser.add_argument("--kv-cache-memory", default="96MiB",
                        help="with --kv-dtypes: every dtype's KV pool budget (default 96MiB)")
    parser.add_argument("--target", type=float, default=1.3,
                        help="with --kv-dtypes: the 8-bit dtypes' tokens/s over F16's asked for")
    parser.add_argument("extra", nargs="*", help="more `loom up` flags (after --)")
    args = parser.parse_args()
    mode = "kv_dtypes" if args.kv_dtypes else "levels"
    for key, value in MODE_DEFAULTS[mode].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if mode == "kv_dtypes" and ("f16" not in args.kv_dtypes.split(",") or "," in args.concurrency
                                or args.speculative_tokens):
        parser.error("--kv-dtypes needs f16 among its dtypes, one --concurrency level and no "
                     "--speculative-tokens")
    exit_on_sigterm()

    # The KV dtype mode opens the coordinator's HTTP port too: its /metrics counts preemptions.
    command = [args.loom, "up", args.model, "--device", args.device, "--host", "127.0.0.1",
               "--port", "0" if mode == "kv_dtypes" else "-1", "--grpc-port", "0",
               "--metrics-port", "0", *args.extra]
    if mode == "kv_dtypes":
        return kv_dtype_bench(args, command)
    bandwidth = copy_bandwidth_gbs(args.device)
    model_bytes = os.path.getsize(args.model)
    bytes_per_token = args.bytes_per_token or model_bytes
    summary = {"model": os.path.basename(args.model), "model_bytes": model_bytes,
               "bytes_per_token": bytes_per_token, "device": args.device, "copy_bandwidth_gbs": bandwidth, "command": command}
    server = Server(command, args.log, args.pgid_file)
    try:
        address, metrics_url = wait_ready(server, args.start_timeout)
        # One `loom bench` per level, so that the worker's step timings split by level: the
        # mean step, forward pass and sampling beside the inter-token latency clients see
        # (the rest of an ITL is the coordinator's and the step's round trip).
        for concurrency in args.concurrency.split(","):
            found = measured_level(args, address, metrics_url, concurrency)
            if "levels" not in summary:
                summary["levels"] = found
            else:
                summary["levels"]["runs"].append(found["runs"][0])
        if args.speculative_tokens > 0:
            runs = {name: bench_level(args, address, "1", 8, "--num-speculative-tokens",
                                      str(drafts))["runs"][0]
                    for name, drafts in (("without", 0), ("with", args.speculative_tokens))}
            summary["speculative_batch1"] = {
                "num_speculative_tokens": args.speculative_tokens,
                "without_tokens_per_s": runs["without"]["output_throughput"],
                "with_tokens_per_s": runs["with"]["output_throughput"],
                "speedup": (runs["with"]["output_throughput"] /
                            max(runs["without"]["output_throughput"], 1e-9)),
                "draft_tokens": runs["with"]["draft_tokens"],
                "acceptance_rate": runs["with"]["acceptance_rate"],
            }
        summary["passed"] = True
    except (CheckFailed, subprocess.TimeoutExpired, ValueError, OSError) as error:
        summary["passed"] = False
        summary["error"] = f"{type(error).__name__}: {error}"
    finally:
        server.stop()
    # Batch-1 decode's bound: every weight byte read once per token.
    if bandwidth:
        summary["batch1_tokens_per_s_limit"] = bandwidth * 1e9 / bytes_per_token
    # One line per load level for the report: output tokens/s, TTFT and ITL p50 / p99.
    summary["levels_brief"] = [brief(run) for run in summary.get("levels", {}).get("runs", [])]
    single = [run for run in summary.get("levels", {}).get("runs", []) if run["concurrency"] == 1]
    if single and single[0]["tpot_ms"]["p50"] > 0:
        summary["batch1_decode_tokens_per_s"] = 1000.0 / single[0]["tpot_ms"]["p50"]
        if bandwidth:
            summary["batch1_fraction_of_limit"] = (summary["batch1_decode_tokens_per_s"] /
                                                   summary["batch1_tokens_per_s_limit"])
    with open(args.out, "w") as out:
        json.dump(summary, out, indent=2)
    print(json.dumps({k: v for k, v in summary.items() if k != "levels"}))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
