"""tests/gpu/sweep_report.py on synthetic sweeps: the ranking per range of m and per KV dtype,
members missing from a row left out, nulls (a member that does not take the cache) skipped,
and a folder without JSON an error."""
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import sweep_report  # noqa: E402

REPORT = pathlib.Path(__file__).resolve().parent / "sweep_report.py"


def gemm_row(m, table_us, timings, fmt="w4a16"):
    return {"format": fmt, "n": 4096, "k": 4096, "m": m, "table": "tile_m64",
            "timings": [{"config": "table", "splits": 0, "us": table_us}] + [
                {"config": c, "splits": s, "us": us} for c, s, us in timings]}


def test_gemm_members_ranked_per_range_by_geometric_mean():
    data = {"rows": [
        gemm_row(24, 40.0, [("fast", 3, 20.0), ("fast", 1, 40.0), ("slow", 1, 80.0)]),
        gemm_row(32, 40.0, [("fast", 3, 10.0), ("slow", 1, 40.0), ("once", 1, 1.0)], "w8a16"),
    ]}
    lines = sweep_report.gemm_report(data)
    assert len(lines) == 1 and lines[0].startswith("m 17-32 (table: tile_m64; 2 rows)")
    # fast: ratios 2 and 4, geometric mean 2.83, worst 2; its forced single split ran once.
    assert "fast 2.83x (worst 2.00x)" in lines[0]
    assert lines[0].index("fast 2.83x") < lines[0].index("slow 0.71x")
    assert "once" not in lines[0] and "fast/1" not in lines[0]


def test_attention_members_ranked_per_kv_and_batch_nulls_skipped():
    data = {"rows": [
        {"kv": "f16", "batch": 1, "context": 1024, "us": {"t0": 10.0, "t1": 5.0, "mma": 2.0}},
        {"kv": "f16", "batch": 8, "context": 1024, "us": {"t0": 10.0, "t1": 20.0, "mma": 5.0}},
        {"kv": "int8", "batch": 1, "context": 1024, "us": {"t0": 10.0, "t1": 10.0, "mma": None}},
    ]}
    lines = sweep_report.attention_report(data)
    assert lines[0].startswith("f16 all (2 rows): mma 3.16x (worst 2.00x); t1 1.00x")
    assert any(line.startswith("f16 batch 8 (1 rows): mma 2.00x") for line in lines)
    int8 = [line for line in lines if line.startswith("int8 all")][0]
    assert "t1 1.00x" in int8 and "mma" not in int8


def test_attention_split_rows_name_the_fastest_split_and_its_gain():
    data = {"rows": [], "splits": [
        {"batch": 1, "context": 1000, "heuristic_us": 30.0,
         "us": {"1": 60.0, "2": 40.0, "16": 10.0, "32": 12.0}},
        {"batch": 16, "context": 4096, "heuristic_us": 20.0, "us": {"1": 20.0, "2": 25.0}},
    ]}
    lines = sweep_report.attention_report(data)
    assert "splits batch 1 x 1000: best 16 (63-token partitions) 3.00x the heuristic" in lines
    assert "splits batch 16 x 4096: best 1 (4096-token partitions) 1.00x the heuristic" in lines


def test_prefill_members_ranked_with_their_share_of_the_gemm_rate():
    data = {"rows": [], "gemm_bf16_tflops": 800.0, "prefill": [
        {"query": 4096, "context": 4096, "tflop": 0.2, "us": {"w4_m2_n32": 1000.0,
                                                             "w4_m2_n64": 500.0,
                                                             "w8_m1_n32": 2000.0}},
        {"query": 2048, "context": 8192, "tflop": 0.4, "us": {"w4_m2_n32": 1000.0,
                                                             "w4_m2_n64": 800.0,
                                                             "w8_m1_n32": 1000.0}},
    ]}
    lines = sweep_report.attention_report(data)
    assert lines[0] == ("prefill (2 rows, dispatched w4_m2_n32): w4_m2_n64 1.58x (worst 1.25x); "
                        "w8_m1_n32 0.71x (worst 0.50x)")
    # 0.2 TFLOP in 1 ms is 200 TFLOP/s, a quarter of 800; w4_m2_n64 ran it in half the time.
    assert "prefill 4096 over 4096: dispatched 0.250 of the GEMM rate, best w4_m2_n64 0.500" in lines
    assert "prefill 2048 over 8192: dispatched 0.500 of the GEMM rate, best w4_m2_n64 0.625" in lines


def test_the_script_reads_a_folder_and_refuses_an_empty_one(tmp_path):
    (tmp_path / "quantized_gemm_sweep.json").write_text(json.dumps(
        {"rows": [gemm_row(1, 10.0, [("a", 2, 5.0)])]}))
    run = subprocess.run([sys.executable, str(REPORT), str(tmp_path)], capture_output=True,
                         text=True, check=True)
    assert "m 1-8" in run.stdout and "a 2.00x" in run.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = subprocess.run([sys.executable, str(REPORT), str(empty)], capture_output=True,
                             text=True)
    assert missing.returncode == 1 and "no sweep JSON" in missing.stderr
