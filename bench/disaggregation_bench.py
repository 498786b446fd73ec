"""Disaggregated prefill and decode against two mixed replicas (issue 36's benchmark), end to end
on the default model: two CPU worker processes on this machine (`--threads` each), either two
mixed replicas (`loom up --replicas 2`, prefix-aware routing) or one prefill and one decode
replica (`--prefill-replicas 1 --decode-replicas 1`, the default --max-local-prefill-length: the
decode replica's own measure, a prompt past it of at most --max-num-batched-tokens staying on
the decode replica when the prefill replica's queue would give its first token later), the
latter with the KV pulled after the first token (`--no-kv-push`) instead of pushed while the
prefill worker computes it, with a fixed --max-local-prefill-length of 512 (every prompt
past it to the prefill replica, none shorter: no first-token comparison), and pushed over TCP
(`--no-kv-shared-memory`: no tier mapped, as between machines). --modes picks some. The same
open-loop workload drives all five, at the same request rate:
Poisson arrivals, 10% of requests carrying a 2k-token prompt (16 output tokens) among short chats
(a ~30-token prompt, 128 output tokens), every prompt new. The rate is relative to the machine: a
calibration on one replica times a 2k-token prefill, and the rate puts the long prompts' prefill
work at --utilization (0.7) of one worker's time (at a fixed rate a fast machine sat nearly idle,
where P/D has nothing to win, and a slow one was driven past saturation).

Reported per configuration (medians over rounds, the configurations alternated):
  * decode ITL p50/p99/p99.9/max: the gaps between a request's consecutive streamed tokens after its first,
    over every request (a hand-off's gap from the prefill replica's token to the decode replica's
    next one included); that first gap's p50/p99 and the later gaps' p99 apart, and each round's
    five longest gaps (which request, after which message, when);
  * TTFT p50/p99 of the long prompts, and of the short ones;
  * P/D: the hand-off (transfer phase: the prefill replica's first token to the decode replica's
    admission with the KV, from loom_disagg_phase_seconds) of a 2k-token prompt, against the
    shared-memory copy limit: one memcpy of that prompt's KV bytes on this machine, measured in
    the same run. Pushed (the default): the prefill worker copied each layer into the decode
    tier while computing, so the hand-off only commits the slots; pulled (--no-kv-push, the
    third configuration): pool to host tier, tier to tier, tier to pool after the first token.
Ratios: ITL p99 mixed / P/D (the target: >= 2), long-prompt TTFT p50 P/D / mixed (<= 1.2), copy
limit / hand-off; as ratios of the medians, and as the median of each round's ratios (the
configurations of a round run back to back, so a neighbour's load shared by them cancels).

Writes bench/results/disaggregation.json.

usage: .venv/bin/python bench/disaggregation_bench.py [--rounds 2] [--seconds 60] [--utilization 0.7]
"""
import argparse
import datetime
import json
import os
import pathlib
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance  # noqa: E402

WORDS = ("the river runs past old stone walls where people sell bread fish and cloth while "
         "children chase birds across the square and the bell rings every hour").split()
LONG_TOKENS = 2048
# The default model's KV per token: 30 layers x K and V x 3 heads x 64 x 2 bytes (f16).
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2
# Two mixed replicas; one prefill and one decode replica (KV pushed; pulled); the same with a
# fixed threshold; pushed over TCP (--no-kv-shared-memory: as between machines).
MODES = ["mixed", "disaggregated", "disaggregated_pulled", "disaggregated_fixed", "disaggregated_tcp"]
# disaggregated_fixed: --max-local-prefill-length FIXED_LOCAL_LIMIT, the operator's threshold:
# every prompt past it goes to the prefill replica (no first-token comparison), the other end
# of the ITL / TTFT trade-off from the measured default.
FIXED_LOCAL_LIMIT = 512
# A short chat's output tokens: enough that decodes overlap the long prompts' prefills (with 48
# a fast machine finished most chats between two long prompts).
SHORT_OUTPUT = 128


def calibrate(tmp: pathlib.Path, threads: int) -> dict:
    """The machine's speed, on one mixed replica: the first token of a 2k-token prompt (the
    median of 3) and the gaps of a short chat's decode. The request rate derives from it, so
    every machine serves the same load relative to its speed (a fixed rate left a fast
    machine nearly idle and drove a slow one past saturation)."""
    up = h.Up(tmp / "calibrate", threads=threads, kv_cache_memory="512MiB", stream_interval_ms=0, replicas=1)
    try:
        up.wait_healthy(["replica-0"])
        rng = random.Random(99)
        firsts = []
        for i in range(3):
            words = " ".join(rng.choice(WORDS) for _ in range(LONG_TOKENS))
            ids = h.tokenize(f"Calibration {i}: {words}")[:LONG_TOKENS]
            record = {}
            run_one(up.stub, ids, 1, record)
            firsts.append(record["times"][0][0] - record["start"])
        record = {}
        run_one(up.stub, h.tokenize("Calibration chat: " + " ".join(WORDS[:24])), 64, record)
        gaps = [b[0] - a[0] for a, b in zip(record["times"], record["times"][1:])]
        return {"long_prefill_s": statistics.median(firsts), "decode_itl_s": statistics.median(gaps)}
    finally:
        up.stop()


def workload(seconds: float, rate: float, seed: int, tokenize) -> list:
    """(arrival offset, prompt token ids, max_tokens, is_long), Poisson arrivals."""
    rng = random.Random(seed)
    requests, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > seconds:
            return requests
        long = rng.random() < 0.1
        words = [rng.choice(WORDS) for _ in range(LONG_TOKENS if long else 24)]
        ids = tokenize(f"Request {len(requests)} ({rng.random():.6f}): " + " ".join(words))
        if long:
            ids = ids[:LONG_TOKENS]
        requests.append((t, ids, 16 if long else SHORT_OUTPUT, long))


def run_one(stub, ids, max_tokens, record):
    """Streams one request, recording each message's time and token count."""
    request = h.make_request(token_ids=ids, max_tokens=max_tokens, ignore_eos=True)
    start = time.monotonic()
    times = []
    try:
        for message in stub.Generate(request, timeout=600):
            if message.token_ids:
                if not times:
                    record["first_replica"] = message.replica_id
                times.append((time.monotonic(), len(message.token_ids)))
    except Exception as error:  # noqa: BLE001 - counted as a failed request
        record["error"] = repr(error)
    record["start"], record["times"] = start, times


def drive(stub, requests) -> list:
    records = [dict() for _ in requests]
    threads = []
    origin = time.monotonic()
    for (offset, ids, max_tokens, _), record in zip(requests, records):
        delay = origin + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=run_one, args=(stub, ids, max_tokens, record))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return records


def percentile(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(requests, records) -> dict:
    gaps, ttft_long, ttft_short, failed, worst = [], [], [], 0, []
    second_gaps, later_gaps = [], []  # the gap after the first token (a hand-off's), the rest
    for index, ((_, _, max_tokens, long), record) in enumerate(zip(requests, records)):
        times = record.get("times", [])
        if "error" in record or sum(n for _, n in times) != max_tokens:
            failed += 1
            continue
        (ttft_long if long else ttft_short).append(times[0][0] - record["start"])
        for position, ((previous, _), (now, n)) in enumerate(zip(times, times[1:]), start=1):
            gaps.extend([(now - previous) / n] * n)  # a message of n tokens: n gaps
            (second_gaps if position == 1 else later_gaps).extend([(now - previous) / n] * n)
            worst.append((now - previous, index, long, position, previous - record["start"]))
    # Where the tail comes from: the longest gaps, with their request (long or short), the
    # message after which each came (1: the first token's, where a hand-off sits) and when.
    worst = [{"gap_s": g, "request": i, "long": lg, "after_message": p, "at_s": t}
             for g, i, lg, p, t in sorted(worst, reverse=True)[:5]]
    return {"requests": len(records), "failed": failed, "itl_p50_s": percentile(gaps, 50),
            "itl_p99_s": percentile(gaps, 99), "itl_p999_s": percentile(gaps, 99.9),
            "itl_max_s": max(gaps) if gaps else float("nan"), "ttft_long_p50_s": percentile(ttft_long, 50),
            "ttft_long_p99_s": percentile(ttft_long, 99), "ttft_short_p50_s": percentile(ttft_short, 50),
            "ttft_short_p99_s": percentile(ttft_short, 99), "num_long": len(ttft_long),
            "first_gap_p50_s": percentile(second_gaps, 50), "first_gap_p99_s": percentile(second_gaps, 99),
            "later_itl_p99_s": percentile(later_gaps, 99), "worst_gaps": worst}


def transfer_phase(http_url: str) -> tuple:
    """(count, seconds summed) of loom_disagg_phase_seconds{phase="transfer"}."""
    text = urllib.request.urlopen(http_url + "/metrics", timeout=10).read().decode()
    values = {}
    for kind in ("count", "sum"):
        match = re.search(rf'loom_disagg_phase_seconds_{kind}\{{[^}}]*phase="transfer"[^}}]*\}} (\S+)', text)
        values[kind] = float(match.group(1)) if match else 0.0
    return int(values["count"]), values["sum"]


def sample_limit(up, replica_id: str, stop: threading.Event, samples: list):
    """Appends the replica's local prefill limit (ReplicaStatus) every 0.5 s until `stop`."""
    while not stop.wait(0.5):
        try:
            samples.append(up.replicas()[replica_id].local_prefill_limit)
        except Exception:  # noqa: BLE001 - a missed sample
            pass


def measure(tmp: pathlib.Path, name: str, requests, threads: int, mode: str) -> dict:
    flags = {"threads": threads, "kv_cache_memory": "512MiB", "stream_interval_ms": 0}
    disaggregated = mode != "mixed"
    if disaggregated:
        flags.update(prefill_replicas=1, decode_replicas=1)
        if mode == "disaggregated_pulled":
            flags["kv_push"] = "off"  # the decode replica pulls the KV after the first token
        if mode == "disaggregated_fixed":
            flags["max_local_prefill_length"] = FIXED_LOCAL_LIMIT
        if mode == "disaggregated_tcp":
            # Pushed over TCP as between machines: no worker's tier can be mapped.
            flags["kv_shared_memory"] = "off"
        replicas = ["prefill-0", "decode-0"]
    else:
        flags.update(replicas=2)
        replicas = ["replica-0", "replica-1"]
    up = h.Up(tmp / name, **flags)
    try:
        up.wait_healthy(replicas)
        stop, limits = threading.Event(), []
        sampler = threading.Thread(target=sample_limit, args=(up, replicas[-1], stop, limits))
        sampler.start()
        try:
            records = drive(up.stub, requests)
        finally:
            stop.set()
            sampler.join()
        result = summarize(requests, records)
        if disaggregated and limits:
            # The decode replica's threshold (and prefill chunk beside decodes) while it served.
            result["local_prefill_limit_min"] = min(limits)
            result["local_prefill_limit_p50"] = float(np.percentile(limits, 50))
            result["local_prefill_limit_max"] = max(limits)
        status = up.wait_idle(timeout=120)
        if disaggregated:
            result["handoffs"] = status["decode-0"].num_handoffs_in
            # Those whose KV the prefill worker pushed while computing (the rest were pulled).
            result["pushed"] = status["decode-0"].num_handoffs_pushed
            # Short prompts whose first token came from the prefill replica.
            result["short_handoffs"] = sum(1 for r, record in zip(requests, records)
                                           if not r[3] and record.get("first_replica") == "prefill-0")
            result["handoff_failures"] = status["decode-0"].num_handoff_failures
            # Long prompts the decode replica prefilled itself, and of those how many because
            # the prefill replica's expected first token was later (the measured threshold).
            result["long_local"] = sum(1 for r, record in zip(requests, records)
                                       if r[3] and record.get("first_replica") == "decode-0")
            result["kept_local"] = status["decode-0"].num_prefills_kept_local
            result["transfers"], seconds = transfer_phase(up.http_url)
            result["handoff_mean_s"] = seconds / max(result["transfers"], 1)
        return result
    finally:
        up.stop()


def copy_limit_seconds(nbytes: int) -> float:
    """One memcpy of `nbytes` (pages touched first), median of 7."""
    source = np.ones(nbytes, dtype=np.uint8)
    dest = np.zeros(nbytes, dtype=np.uint8)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        np.copyto(dest, source)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ratios(report: dict, copy_limit_s: float) -> dict:
    """The targets' ratios, of the medians and (median_of_rounds) the median of each round's."""
    def pair(mixed: dict, pd: dict) -> dict:
        return {"itl_p99_mixed_over_pd": mixed["itl_p99_s"] / pd["itl_p99_s"],
                "itl_p999_mixed_over_pd": mixed["itl_p999_s"] / pd["itl_p999_s"],
                "ttft_long_p50_pd_over_mixed": pd["ttft_long_p50_s"] / mixed["ttft_long_p50_s"],
                "ttft_short_p99_mixed_over_pd": mixed["ttft_short_p99_s"] / pd["ttft_short_p99_s"]}

    def per_round(mode: str) -> dict:
        rounds = [pair(m, p) for m, p in zip(report["mixed"]["rounds"], report[mode]["rounds"])]
        return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}

    def of(mode: str) -> dict:
        ratio = pair(report["mixed"], report[mode])
        ratio["median_of_rounds"] = per_round(mode)
        if report[mode].get("handoff_mean_s"):
            ratio["copy_limit_over_handoff"] = copy_limit_s / report[mode]["handoff_mean_s"]
        return ratio

    result = of("disaggregated") if "disaggregated" in report else {}
    for mode, key in (("disaggregated_pulled", "pulled"), ("disaggregated_fixed", "fixed_threshold"),
                      ("disaggregated_tcp", "tcp")):
        if mode in report:
            result[key] = of(mode)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0, help="arrivals per round")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="requests per second (0: from the calibration and --utilization)")
    parser.add_argument("--utilization", type=float, default=0.7,
                        help="the long prompts' prefill work as a fraction of one worker's time: "
                             "rate = utilization / (0.1 x the measured 2k-token prefill)")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated configurations to run (mixed always runs: the baseline)")
    parser.add_argument("--output", default=str(SOURCE_DIR / "bench" / "results" / "disaggregation.json"))
    args = parser.parse_args()
    modes = [mode for mode in MODES if mode == "mixed" or mode in args.modes.split(",")]
    runs = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        calibration = calibrate(tmp, args.threads)
        rate = args.rate or args.utilization / (0.1 * calibration["long_prefill_s"])
        print("calibration", json.dumps(calibration), "rate", rate, flush=True)
        report = {"benchmark": "disaggregation",
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  "threads_per_worker": args.threads, "rounds": args.rounds, "seconds": args.seconds,
                  "calibration": calibration, "utilization": args.utilization if not args.rate else None,
                  "rate_per_s": rate, "long_tokens": LONG_TOKENS, "long_fraction": 0.1,
                  "short_output_tokens": SHORT_OUTPUT}
        for r in range(args.rounds):
            requests = workload(args.seconds, rate, r, lambda text: h.tokenize(text))
            order = modes if r % 2 == 0 else modes[::-1]
            for mode in order:
                result = measure(tmp, f"{mode}-{r}", requests, args.threads, mode)
                runs[mode].append(result)
                print(mode, r, json.dumps(result), flush=True)
    for mode, results in runs.items():
        report[mode] = {key: statistics.median(x[key] for x in results)
                        for key in results[0] if isinstance(results[0][key], (int, float))}
        report[mode]["rounds"] = results
    limit = copy_limit_seconds(LONG_TOKENS * KV_BYTES_PER_TOKEN)
    report["copy_limit_s"] = limit
    report["kv_bytes_2k"] = LONG_TOKENS * KV_BYTES_PER_TOKEN
    report["ratios"] = ratios(report, limit)
    report["provenance"] = provenance()
    print(json.dumps({k: report[k] for k in ("ratios", "copy_limit_s")}, indent=1), flush=True)
    pathlib.Path(args.output).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
