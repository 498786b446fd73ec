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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loom", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--concurrency", default="1,32,128")
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--start-timeout", type=float, default=120)
    parser.add_argument("--log", default="serve_bench.log")
    parser.add_argument("--out", default="serve_bench.json")
    parser.add_argument("--pgid-file", help="where to write the process group of `loom up`")
    parser.add_argument("--bytes-per-token", type=int,
                        help="weight bytes a decode step reads (default: the model file's size; "
                             "test_model_tool prints it for an untied model, whose embedding "
                             "table is read one row per token)")
    parser.add_argument("--speculative-tokens", type=int, default=0,
                        help="then batch 1 with K n-gram drafts per step against none (0: not run)")
    parser.add_argument("extra", nargs="*", help="more `loom up` flags (after --)")
    args = parser.parse_args()
    exit_on_sigterm()

    bandwidth = copy_bandwidth_gbs(args.device)
    model_bytes = os.path.getsize(args.model)
    bytes_per_token = args.bytes_per_token or model_bytes
    command = [args.loom, "up", args.model, "--device", args.device, "--host", "127.0.0.1",
               "--port", "-1", "--grpc-port", "0", "--metrics-port", "0", *args.extra]
    summary = {"model": os.path.basename(args.model), "model_bytes": model_bytes,
               "bytes_per_token": bytes_per_token, "device": args.device, "copy_bandwidth_gbs": bandwidth, "command": command}
    server = Server(command, args.log, args.pgid_file)
    try:
        deadline = time.monotonic() + args.start_timeout
        address = server.wait_for(r"coordinator listening on (\S+)", args.start_timeout).group(1)
        metrics_url = server.wait_for(r"loom-worker: metrics on (\S+)",
                                      deadline - time.monotonic()).group(1)
        server.wait_for(r"loom: ready", deadline - time.monotonic())

        def step_counters():
            return {key: metric_total(metrics_url, name, 10) or 0.0
                    for key, name in STEP_METRICS.items()}
        results = pathlib.Path(args.out).with_suffix(".levels.json")

        def level(concurrency, num_requests, *flags):
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

        # One `loom bench` per level, so that the worker's step timings split by level: the
        # mean step, forward pass and sampling beside the inter-token latency clients see
        # (the rest of an ITL is the coordinator's and the step's round trip).
        for concurrency in args.concurrency.split(","):
            before = step_counters()
            found = level(concurrency, args.num_requests)
            after = step_counters()
            steps = after["steps"] - before["steps"]
            run = found["runs"][0]
            if steps > 0:
                for key in ("step_s", "execute_s", "sample_s"):
                    run[f"worker_{key[:-2]}_ms"] = 1000.0 * (after[key] - before[key]) / steps
            run["worker_steps"] = steps
            if "levels" not in summary:
                summary["levels"] = found
            else:
                summary["levels"]["runs"].append(run)
        if args.speculative_tokens > 0:
            runs = {name: level("1", 8, "--num-speculative-tokens", str(drafts))["runs"][0]
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
    summary["levels_brief"] = [
        {"concurrency": run["concurrency"], "output_tokens_per_s": round(run["output_throughput"], 1),
         "ttft_ms_p50": round(run["ttft_ms"]["p50"], 2), "ttft_ms_p99": round(run["ttft_ms"]["p99"], 2),
         "itl_ms_p50": round(run["itl_ms"]["p50"], 3), "itl_ms_p99": round(run["itl_ms"]["p99"], 3),
         **{key: round(run[key], 3) for key in ("worker_step_ms", "worker_execute_ms",
                                                "worker_sample_ms") if key in run}}
        for run in summary.get("levels", {}).get("runs", [])]
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
