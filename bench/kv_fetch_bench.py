"""Cross-replica prefix fetch against recompute (issue 35's benchmark), end to end on the default
model: two CPU replicas on this machine (`--threads` each), requests placed round-robin, each
worker with a host KV tier.

For each prefix length (default 2048 and 7936 tokens; the model's context is 8192): a first request
(prefix + question 1) runs on replica a; then the measured request (the same prefix + question 2)
lands on replica b. With fetching on (the default `--kv-fetch-min-blocks 4`) b's worker pulls the
prefix's blocks from a's host tier (mapped shared memory) and reloads them; pool to pool (the workers
with --kv-pool-shared-memory and no host tier) b's worker copies them straight out of a's pool into
its own; with fetching off (`0`) b recomputes the prefix. Each configuration is a fresh cluster;
rounds rotate them; medians (one round for prefixes of 4096 tokens or more by default: recomputing 8k
tokens takes about a minute on one thread). Reported: the measured request's TTFT in each, the ratios
(recompute / fetch, recompute / pool, tier fetch / pool), the blocks moved, and each transfer's
seconds against the copy limit measured in the same run: one memcpy of the prefix's KV bytes (the
pool-to-pool transfer moves each byte once; the tier path three times). One token is generated, so
TTFT is the request's time.

Writes bench/results/kv_fetch.json.

usage: .venv/bin/python bench/kv_fetch_bench.py [--rounds 3] [--long-rounds 1] [--lengths 2048,7936]
"""
import argparse
import datetime
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance  # noqa: E402

WORDS = ("the river runs past old stone walls where people sell bread fish and cloth while "
         "children chase birds across the square and the bell rings every hour").split()


def prefix_of(tokens: int, seed: int, tokenize) -> list:
    """Token ids of random words, exactly `tokens` long."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(tokens))
    ids = tokenize(text)
    assert len(ids) >= tokens, (len(ids), tokens)
    return ids[:tokens]


def shared_bytes(rig, replica_id: str) -> int:
    """Bytes the replica's worker fetched by mapping the source's tier (not over TCP)."""
    import re
    import urllib.request
    worker = rig.workers[replica_id]
    url = worker.wait_for_line(r"metrics on (http://\S+)", 30).group(1)
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    match = re.search(r'loom_worker_kv_transfer_bytes_total\{[^}]*direction="from_peer_shared_memory"[^}]*\} (\S+)', text)
    return int(float(match.group(1))) if match else 0


# The default model's KV block: 30 layers x K and V x 16 tokens x 3 heads x 64 x 2 bytes (F16).
BLOCK_BYTES = 30 * 2 * 16 * 3 * 64 * 2


def copy_limit_seconds(nbytes: int, repeats: int = 7) -> float:
    """The median time of one memcpy of `nbytes` (numpy, pages touched first): the copy limit."""
    import numpy
    src = numpy.ones(nbytes, dtype=numpy.uint8)
    dst = numpy.zeros(nbytes, dtype=numpy.uint8)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        numpy.copyto(dst, src)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(tmp: pathlib.Path, name: str, prefix: list, threads: int, mode: str) -> dict:
    worker = {"threads": threads, "kv_cache_memory": "512MiB", "metrics_port": 0}
    if mode == "pool":
        worker["kv_pool_shared_memory"] = "on"
    else:
        worker["kv_offload_memory"] = "512MiB"
    flags = {"routing": "round-robin", "max_num_batched_tokens": 2048}
    if mode == "recompute":
        flags["kv_fetch_min_blocks"] = 0
    with h.running_cluster(tmp / name, {"replica-a": worker, "replica-b": worker}, print_logs=False,
                           **flags) as rig:
        stub = rig.coordinator.stub
        [first] = h.generate_all(stub, [h.make_request(token_ids=prefix + [28, 29, 30], max_tokens=1,
                                                        ignore_eos=True)], timeout=1800)
        assert first.finished, first.describe()
        started = time.monotonic()
        [second] = h.generate_all(stub, [h.make_request(token_ids=prefix + [31, 32, 33], max_tokens=1,
                                                         ignore_eos=True)], timeout=1800)
        ttft = time.monotonic() - started
        assert second.finished, second.describe()
        assert second.replica_id != first.replica_id, "round-robin placed both on one replica"
        status = rig.coordinator.replicas()[second.replica_id]
        return {"ttft_s": ttft, "fetches": status.num_kv_fetches, "pool_fetches": status.num_kv_pool_fetches,
                "fetched_blocks": status.num_kv_fetched_blocks,
                "fetch_seconds": status.kv_fetch_seconds, "host_hit_tokens": status.num_host_hit_tokens,
                "bytes_fetched_shared_memory": shared_bytes(rig, second.replica_id),
                "token_ids": list(second.token_ids)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="2048,7936")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long-rounds", type=int, default=1,
                        help="rounds for prefixes of 4096 tokens or more (a recompute takes ~1 min)")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--output", default=str(SOURCE_DIR / "bench" / "results" / "kv_fetch.json"))
    args = parser.parse_args()
    report = {"benchmark": "kv_fetch", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "provenance": provenance(), "threads_per_worker": args.threads, "rounds": args.rounds,
              "lengths": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for length in (int(x) for x in args.lengths.split(",")):
            prefix = prefix_of(length, length, lambda text: h.tokenize(text))
            modes = ["fetch", "pool", "recompute"]
            runs = {mode: [] for mode in modes}
            for r in range(args.rounds if length < 4096 else args.long_rounds):
                for mode in modes[r % 3:] + modes[:r % 3]:
                    runs[mode].append(measure(tmp, f"{length}-{mode}-{r}", prefix, args.threads, mode))
                    print(length, mode, round(runs[mode][-1]["ttft_s"], 3), runs[mode][-1]["fetched_blocks"], flush=True)
            for f, p, c in zip(runs["fetch"], runs["pool"], runs["recompute"]):
                assert f["token_ids"] == c["token_ids"] == p["token_ids"], "fetching changed the output"
                assert f["fetches"] == 1 and c["fetches"] == 0 and f["pool_fetches"] == 0, (f, c)
                assert p["fetches"] == p["pool_fetches"] == 1, p
            fetch = statistics.median(x["ttft_s"] for x in runs["fetch"])
            pool = statistics.median(x["ttft_s"] for x in runs["pool"])
            recompute = statistics.median(x["ttft_s"] for x in runs["recompute"])
            blocks = runs["pool"][0]["fetched_blocks"]
            limit = copy_limit_seconds(blocks * BLOCK_BYTES)
            fetch_seconds = statistics.median(x["fetch_seconds"] for x in runs["fetch"])
            pool_seconds = statistics.median(x["fetch_seconds"] for x in runs["pool"])
            report["lengths"][str(length)] = {
                "ttft_fetch_s": fetch, "ttft_pool_s": pool, "ttft_recompute_s": recompute,
                "ratio_recompute_over_fetch": recompute / fetch, "ratio_recompute_over_pool": recompute / pool,
                "ratio_fetch_over_pool": fetch / pool,
                "fetched_blocks": runs["fetch"][0]["fetched_blocks"], "pool_fetched_blocks": blocks,
                "fetch_seconds": fetch_seconds, "pool_fetch_seconds": pool_seconds,
                "kv_bytes": blocks * BLOCK_BYTES, "copy_limit_s": limit,
                "copy_limit_over_fetch": limit / fetch_seconds, "copy_limit_over_pool_fetch": limit / pool_seconds,
                "host_hit_tokens": runs["fetch"][0]["host_hit_tokens"],
                "bytes_fetched_shared_memory": runs["fetch"][0]["bytes_fetched_shared_memory"],
            }
            print(length, json.dumps(report["lengths"][str(length)]), flush=True)
    pathlib.Path(args.output).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
