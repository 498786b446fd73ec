#!/usr/bin/env python3
"""PyTorch as the peer of Loom's CUDA kernels, in the same window (issue 34 item 1).

Times, on the shapes bench/cuda_attention_bench.cu and bench/quantized_gemm_bench.cu use:
  - torch.nn.functional.scaled_dot_product_attention with the flash backend: causal
    prefill of 4,096 tokens (32 query heads over 8 KV heads, head dim 128, BF16; F16 too
    unless --quick), and decode (one query token per sequence) at batch 32 x 4,096 and
    batch 1 x 32,768 over contiguous K/V;
  - torch.matmul in F16 and BF16 at 8192^3 (the GEMM limit) and, in F16, at the quantized
    GEMM bench's shapes (Llama-3-8B's 14336 x 4096 at m = 1, 16, 64);
  - a device-to-device copy (read + write bytes per second, bench/machine_limits' rule).
Then it reads Loom's figures of the same run (cuda_attention.json, quantized_gemm.json in
--loom) and writes one JSON with both and their ratios: Loom's prefill over flash SDPA
(issue 34's target >= 1.0), Loom's decode over SDPA's, Loom's W4A16 over torch's F16
matmul. Without PyTorch or a CUDA device the JSON says so ("torch": null, "reason").

Timing: CUDA events around 10 back-to-back calls after a warm-up, median of 9. Run by
tests/gpu/quick.sh's bench step; tested on the CPU by tests/gpu/torch_peer_test.py.
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
REPEATS, ITERATIONS = 9, 10
GEMM_SHAPES = [(14336, 4096, m) for m in (1, 16, 64)]  # n, k, m as quantized_gemm_bench


def time_seconds(torch, call):
    """Median seconds of one `call()` on the current CUDA stream."""
    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERATIONS):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / ITERATIONS)
    return statistics.median(times)


def copy_gbs(torch):
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = time_seconds(torch, lambda: dst.copy_(src))
    return 2 * src.numel() / seconds / 1e9


def matmul_tflops(torch, dtype, m, n, k):
    a = torch.randn(m, k, dtype=dtype, device="cuda")
    b = torch.randn(k, n, dtype=dtype, device="cuda")
    seconds = time_seconds(torch, lambda: torch.matmul(a, b))
    return {"m": m, "n": n, "k": k, "us": seconds * 1e6, "tflops": 2.0 * m * n * k / seconds / 1e12}


def flash_only(torch):
    """A context in which SDPA may use the flash backend only (PyTorch >= 2.3, else the
    older torch.backends.cuda.sdp_kernel switch)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                              enable_mem_efficient=False)


def flash_sdpa(torch, q, k, v, causal):
    """A call of flash SDPA over q [B, H, L, D] and k, v [B, H_kv, S, D]: with enable_gqa,
    or, where PyTorch or its flash kernel lacks it (< 2.5), over K/V heads repeated once
    here for the query heads (the same FLOPs; more K/V bytes, so decode's GB/s counts the
    unrepeated bytes either way)."""
    functional = torch.nn.functional

    def grouped():
        with flash_only(torch):
            return functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                           enable_gqa=True)

    try:
        grouped()
        return grouped
    except (TypeError, RuntimeError):
        group = q.shape[1] // k.shape[1]
        k_full, v_full = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)

    def repeated():
        with flash_only(torch):
            return functional.scaled_dot_product_attention(q, k_full, v_full, is_causal=causal)

    return repeated


def prefill_row(torch, dtype, tokens):
    q = torch.randn(1, NUM_HEADS, tokens, HEAD_DIM, dtype=dtype, device="cuda")
    k = torch.randn(1, NUM_KV_HEADS, tokens, HEAD_DIM, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    seconds = time_seconds(torch, flash_sdpa(torch, q, k, v, causal=True))
    attended = tokens * (tokens + 1) / 2  # the FLOP count cuda_attention_bench uses
    return {"dtype": str(dtype).removeprefix("torch."), "tokens": tokens, "us": seconds * 1e6,
            "tflops": 4.0 * HEAD_DIM * NUM_HEADS * attended / seconds / 1e12}


def decode_row(torch, dtype, batch, context):
    q = torch.randn(batch, NUM_HEADS, 1, HEAD_DIM, dtype=dtype, device="cuda")
    k = torch.randn(batch, NUM_KV_HEADS, context, HEAD_DIM, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    seconds = time_seconds(torch, flash_sdpa(torch, q, k, v, causal=False))
    kv_bytes = 2.0 * k.numel() * k.element_size()
    return {"dtype": str(dtype).removeprefix("torch."), "batch": batch, "context": context,
            "us": seconds * 1e6, "kv_gbs": kv_bytes / seconds / 1e9}


def measure(quick):
    """PyTorch's figures, or (None, reason)."""
    try:
        import torch
    except ImportError as error:
        return None, f"PyTorch is not importable: {error}"
    if not torch.cuda.is_available():
        return None, "PyTorch sees no CUDA device"
    started = time.monotonic()
    peer = {"version": torch.__version__, "device": torch.cuda.get_device_name(0), "errors": []}

    def attempt(key, make):
        # One failed measurement (an old PyTorch without flash on this GPU, memory) is
        # reported and the others still run.
        try:
            peer[key] = make()
        except Exception as error:  # noqa: BLE001 - any failure is a line of the report
            peer["errors"].append(f"{key}: {type(error).__name__}: {error}")

    attempt("copy_gbs", lambda: copy_gbs(torch))
    attempt("matmul_8192", lambda: [
        matmul_tflops(torch, dtype, 8192, 8192, 8192) | {"dtype": name}
        for dtype, name in ((torch.float16, "F16"), (torch.bfloat16, "BF16"))])
    attempt("matmul_f16_gemm_shapes", lambda: [
        matmul_tflops(torch, torch.float16, m, n, k) for n, k, m in GEMM_SHAPES])
    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float16]
    attempt("sdpa_prefill", lambda: [prefill_row(torch, dtype, 4096) for dtype in dtypes])
    attempt("sdpa_decode", lambda: [decode_row(torch, dtype, batch, context)
                                    for dtype in dtypes
                                    for batch, context in ((32, 4096), (1, 32768))])
    peer["seconds"] = time.monotonic() - started
    return peer, None


def load(path):
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return None


def dtype_key(name):
    return name.upper().replace("BFLOAT16", "BF16").replace("FLOAT16", "F16")


def compare(attention, gemm, peer):
    """Loom's rows beside PyTorch's, matched by shape and dtype, with Loom / PyTorch."""
    rows = []
    if peer is None:
        return rows
    if attention:
        for loom in attention.get("prefill", []):
            for torch_row in peer.get("sdpa_prefill", []):
                if (dtype_key(torch_row["dtype"]) == dtype_key(loom["dtype"])
                        and torch_row["tokens"] == loom["tokens"]):
                    rows.append({"kernel": "prefill attention", "dtype": loom["dtype"],
                                 "shape": f"causal {loom['tokens']} tokens",
                                 "loom_tflops": loom["tflops"], "torch_tflops": torch_row["tflops"],
                                 "loom_over_torch": loom["tflops"] / torch_row["tflops"],
                                 "target": 1.0})
        for loom in attention.get("decode", []):
            for torch_row in peer.get("sdpa_decode", []):
                if (dtype_key(torch_row["dtype"]) == dtype_key(loom["dtype"])
                        and (torch_row["batch"], torch_row["context"])
                        == (loom["batch"], loom["context"])):
                    rows.append({"kernel": "decode attention", "dtype": loom["dtype"],
                                 "shape": f"batch {loom['batch']} x {loom['context']}",
                                 "loom_gbs": loom["kv_gbs"], "torch_gbs": torch_row["kv_gbs"],
                                 "loom_over_torch": loom["kv_gbs"] / torch_row["kv_gbs"]})
    if gemm:
        for loom in gemm.get("results", []):
            for torch_row in peer.get("matmul_f16_gemm_shapes", []):
                if (torch_row["m"], torch_row["n"], torch_row["k"]) == (loom["m"], loom["n"],
                                                                        loom["k"]):
                    rows.append({"kernel": "W4A16 GEMM vs torch F16 matmul",
                                 "shape": f"m {loom['m']} n {loom['n']} k {loom['k']}",
                                 "loom_us": loom["w4a16_us"], "torch_us": torch_row["us"],
                                 "loom_over_torch": torch_row["us"] / loom["w4a16_us"],
                                 "target": 3.0 if loom["m"] <= 16 else 1.0})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loom", required=True,
                        help="folder holding this run's cuda_attention.json, quantized_gemm.json")
    parser.add_argument("--out", required=True, help="JSON to write")
    parser.add_argument("--quick", action="store_true", help="BF16 attention only")
    args = parser.parse_args(argv)
    peer, reason = measure(args.quick)
    loom_dir = pathlib.Path(args.loom)
    attention = load(loom_dir / "cuda_attention.json")
    gemm = load(loom_dir / "quantized_gemm.json")
    report = {"bench": "torch_peer", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "torch": peer, "loom_attention": attention is not None,
              "loom_gemm": gemm is not None, "comparisons": compare(attention, gemm, peer)}
    if reason:
        report["reason"] = reason
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if reason:
        print(f"torch_peer: {reason}; no peer figures")
    for row in report["comparisons"]:
        print(f"{row['kernel']:32} {row.get('dtype', ''):5} {row['shape']:28} "
              f"Loom / PyTorch {row['loom_over_torch']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
