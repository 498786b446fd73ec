"""tests/gpu/torch_peer.py on this machine: without a CUDA device it writes a report that
says why there are no peer figures, and its comparison matches Loom's rows with PyTorch's
by shape and dtype and divides the right way (Loom over PyTorch: above 1 means Loom is
faster)."""
import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR

SCRIPT = SOURCE_DIR / "tests" / "gpu" / "torch_peer.py"


def load_module():
    spec = importlib.util.spec_from_file_location("torch_peer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_present():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(cuda_present(), reason="a CUDA device is present: the script measures")
def test_without_a_gpu_the_report_says_why(tmp_path):
    (tmp_path / "cuda_attention.json").write_text(json.dumps({"prefill": [], "decode": []}))
    out = tmp_path / "peer.json"
    subprocess.run([sys.executable, SCRIPT, "--loom", tmp_path, "--out", out, "--quick"],
                   check=True)
    report = json.loads(out.read_text())
    assert report["torch"] is None
    assert "PyTorch" in report["reason"]
    assert report["loom_attention"] is True and report["loom_gemm"] is False
    assert report["comparisons"] == []


def test_comparisons_match_shapes_and_divide_loom_by_torch():
    peer_module = load_module()
    attention = {
        "prefill": [{"tokens": 4096, "dtype": "BF16", "tflops": 300.0},
                    {"tokens": 4096, "dtype": "F16", "tflops": 200.0}],
        "decode": [{"batch": 32, "context": 4096, "dtype": "BF16", "kv_gbs": 2400.0},
                   {"batch": 8, "context": 1024, "dtype": "BF16", "kv_gbs": 900.0}],
    }
    gemm = {"results": [{"m": 1, "n": 14336, "k": 4096, "w4a16_us": 10.0},
                        {"m": 64, "n": 14336, "k": 4096, "w4a16_us": 40.0}]}
    peer = {
        "sdpa_prefill": [{"dtype": "bfloat16", "tokens": 4096, "tflops": 400.0}],
        "sdpa_decode": [{"dtype": "bfloat16", "batch": 32, "context": 4096, "kv_gbs": 3000.0}],
        "matmul_f16_gemm_shapes": [{"m": 1, "n": 14336, "k": 4096, "us": 35.0},
                                   {"m": 64, "n": 14336, "k": 4096, "us": 30.0}],
    }
    rows = peer_module.compare(attention, gemm, peer)
    by_kernel = {(row["kernel"], row["shape"]): row for row in rows}
    # Only shapes and dtypes both sides measured: F16 prefill and batch 8 decode have no peer.
    assert len(rows) == 4
    prefill = by_kernel[("prefill attention", "causal 4096 tokens")]
    assert prefill["dtype"] == "BF16"
    assert prefill["loom_over_torch"] == pytest.approx(0.75)
    assert prefill["target"] == 1.0
    decode = by_kernel[("decode attention", "batch 32 x 4096")]
    assert decode["loom_over_torch"] == pytest.approx(0.8)
    m1 = by_kernel[("W4A16 GEMM vs torch F16 matmul", "m 1 n 14336 k 4096")]
    assert m1["loom_over_torch"] == pytest.approx(3.5) and m1["target"] == 3.0
    m64 = by_kernel[("W4A16 GEMM vs torch F16 matmul", "m 64 n 14336 k 4096")]
    assert m64["loom_over_torch"] == pytest.approx(0.75) and m64["target"] == 1.0
    assert peer_module.compare(attention, gemm, None) == []
