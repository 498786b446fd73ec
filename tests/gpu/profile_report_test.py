"""tests/gpu/profile_report.py on Nsight Compute raw pages written here in ncu's layout (a header,
a units row, one row per kernel): kernels named by the range their marker closes, units read
from the units row, stalls ranked, a range cut off before its marker kept apart, and a
benchmark that profiled nothing reported with ncu's own error lines."""
import csv
import io
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import profile_report  # noqa: E402

REPORT = pathlib.Path(__file__).resolve().parent / "profile_report.py"
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
COLUMNS = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
           "Block Size", "Grid Size", "Device", "CC", "gpu__time_duration.sum",
           "dram__bytes_read.sum", "dram__bytes_write.sum",
           "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size",
           "launch__block_size", "launch__registers_per_thread",
           "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
           "sm__warps_active.avg.pct_of_peak_sustained_active",
           "sm__maximum_warps_per_active_cycle_pct",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           STALL.format("long_scoreboard"), STALL.format("barrier"), STALL.format("wait"),
           "smsp__average_warps_issue_stalled_long_scoreboard_not_issued"]
UNITS = {"gpu__time_duration.sum": "nsecond", "dram__bytes_read.sum": "byte",
         "dram__bytes_write.sum": "byte"}
DECODE = ("void loom::kernels::cuda::(anonymous namespace)::PagedDecodeKernel<128, 4>"
          "(loom::kernels::cuda::PagedDecodeParams)")
REDUCE = "void loom::kernels::cuda::(anonymous namespace)::MergeSplits(float const*, int)"
MARKER = "loom::bench::(anonymous namespace)::loom_profile_marker()"


def kernel(kid, name, grid, ns="1,000", read="0", stalls=("0", "0", "0")):
    return {"ID": str(kid), "Process ID": "77", "Process Name": "cuda_attention_bench",
            "Kernel Name": name, "Grid Size": f"({grid}, 1, 1)", "Block Size": "(256, 1, 1)",
            "gpu__time_duration.sum": ns, "dram__bytes_read.sum": read,
            "dram__bytes_write.sum": "1,048,576", "launch__grid_size": str(grid),
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "41.2",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": "22.5",
            "launch__block_size": "256", "launch__registers_per_thread": "64",
            "launch__shared_mem_per_block_static": "1,024",
            "launch__shared_mem_per_block_dynamic": "32,768",
            "sm__warps_active.avg.pct_of_peak_sustained_active": "24.1",
            "sm__maximum_warps_per_active_cycle_pct": "50",
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "0",
            STALL.format("long_scoreboard"): stalls[0], STALL.format("barrier"): stalls[1],
            STALL.format("wait"): stalls[2],
            "smsp__average_warps_issue_stalled_long_scoreboard_not_issued": "99"}


def raw_page(rows, units=UNITS):
    out = io.StringIO()
    out.write("==PROF== Connected to process 77\n")  # ncu's own lines come first
    writer = csv.DictWriter(out, COLUMNS, quoting=csv.QUOTE_ALL, restval="")
    writer.writeheader()
    writer.writerow(units)
    for row in rows:
        writer.writerow(row)
    return out.getvalue()


def write_bench(work, name, rows, labels, status="0 12", log_extra=""):
    (work / f"{name}.status").write_text(status + "\n")
    (work / f"{name}.log").write_text(
        "".join(f"loom-profile-range {i} {label}\n" for i, label in labels.items()) + log_extra)
    if rows is not None:
        (work / f"{name}.csv").write_text(raw_page(rows))


def test_kernels_are_named_by_the_range_their_marker_closes(tmp_path):
    write_bench(tmp_path, "cuda_attention_bench", [
        kernel(0, DECODE, 512, ns="212,345", read="402,653,184", stalls=("2.0", "8.1", "1.2")),
        kernel(1, REDUCE, 32, ns="5,000"),
        kernel(2, MARKER, 1),
        kernel(3, DECODE, 64, ns="90,000"),
        kernel(4, MARKER, 2),
    ], {1: "decode bf16 batch 32 context 4096", 2: "decode bf16 batch 1 context 32768"})
    report, lines = profile_report.summarize(tmp_path)
    ranges = report["cuda_attention_bench"]["ranges"]
    assert [(r["range"], r["label"], len(r["kernels"])) for r in ranges] == [
        (1, "decode bf16 batch 32 context 4096", 2), (2, "decode bf16 batch 1 context 32768", 1)]
    decode = ranges[0]["kernels"][0]
    assert decode["kernel"] == "PagedDecodeKernel<128, 4>"
    assert ranges[0]["kernels"][1]["kernel"] == "MergeSplits"
    assert abs(decode["duration_us"] - 212.345) < 1e-9
    # (402,653,184 + 1,048,576) bytes in 212.345 us.
    assert abs(decode["dram_gbs"] - 403701760 / 212345) < 1e-6
    assert decode["shared_bytes"] == 33792 and decode["registers"] == 64
    assert list(decode["stalls"]) == ["barrier", "long_scoreboard", "wait"]  # not_issued left out
    assert decode["tensor_pipe_pct"] == 0
    text = "\n".join(lines)
    assert "cuda_attention_bench: exit 0, 12 s under ncu, 5 kernels profiled in 2 ranges" in text
    assert "[1] decode bf16 batch 32 context 4096: 2 kernels, 217.3 us" in text
    assert ("PagedDecodeKernel<128, 4>: grid 512 x 256, 64 regs, 33 KiB smem; 212.3 us; "
            "DRAM 1901 GB/s, 41% of DRAM peak, SM 22%, tensor pipe 0%; occupancy 24% of 50% "
            "possible; stalls/issue barrier 8.1, long_scoreboard 2.0, wait 1.2") in text


def test_other_units_and_a_range_without_its_marker(tmp_path):
    units = dict(UNITS, **{"gpu__time_duration.sum": "usecond",
                           "dram__bytes_read.sum": "Mbyte", "dram__bytes_write.sum": "Mbyte"})
    (tmp_path / "quantized_gemm_bench.status").write_text("124 22\n")
    (tmp_path / "quantized_gemm_bench.log").write_text("loom-profile-range 1 w4a16 m 1\n")
    row = kernel(0, "QuantGemm<64>(Params)", 132, ns="30.5", read="58.7")
    row["dram__bytes_write.sum"] = "0.5"
    (tmp_path / "quantized_gemm_bench.csv").write_text(raw_page([row], units))
    report, lines = profile_report.summarize(tmp_path)
    entry = report["quantized_gemm_bench"]
    assert entry["exit"] == 124 and entry["ranges_printed"] == 1
    [cut] = entry["ranges"]
    assert cut["range"] is None and cut["label"] == "kernels outside a closed range"
    k = cut["kernels"][0]
    assert k["duration_us"] == 30.5 and abs(k["dram_gbs"] - 59.2e6 / 30.5e3) < 1e-9


def test_a_benchmark_that_profiled_nothing_shows_ncus_errors(tmp_path):
    write_bench(tmp_path, "cuda_forward_pass_bench", None, {1: "decode step batch 1"},
                status="1 3", log_extra="==PROF== Connected to process 9\n"
                "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n")
    report, lines = profile_report.summarize(tmp_path)
    assert report["cuda_forward_pass_bench"]["ranges"] == []
    assert any("ERR_NVGPUCTRPERM" in line for line in lines)
    assert lines[0].startswith("cuda_forward_pass_bench: exit 1, 3 s under ncu, 0 kernels")


def test_command_line_writes_json_and_fails_on_an_empty_folder(tmp_path):
    write_bench(tmp_path, "cuda_attention_bench", [kernel(0, DECODE, 8), kernel(1, MARKER, 1)],
                {1: "prefill bf16 4096 tokens"})
    run = subprocess.run([sys.executable, REPORT, tmp_path, "--json", tmp_path / "p.json"],
                         capture_output=True, text=True, check=True)
    assert "[1] prefill bf16 4096 tokens: 1 kernels" in run.stdout
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["cuda_attention_bench"]["ranges"][0]["kernels"][0]["grid"] == 8
    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run([sys.executable, REPORT, empty], capture_output=True, text=True)
    assert run.returncode == 1 and "no <bench>.status" in run.stderr
