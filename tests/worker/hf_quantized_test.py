"""AWQ, GPTQ and FP8 checkpoints (Hugging Face directories with a quantization_config) served
through Loom's INT4/INT8 weights, or F16 where those cannot hold them
(common/formats/hf_quantization.cc).

The checkpoints are written by tests/common/hf_quantized_checkpoint.py in AutoAWQ's GEMM layout
and AutoGPTQ's layout from the llama3_rope random model (hidden 128, FFN 256: every input width
splits into groups of 32 and over 2 ranks). Loom's logits on each are compared with its logits on
float32 directories of
  * the weights as Loom's encodings keep them (q and the scale unchanged; INT4's min, -z s, in
    float16; act-order and asymmetric 8-bit layers as float16 values): TOL_AS_STORED = 1e-3,
    float rounding of the kernels only (measured 0: the packed INT4/INT8 GEMM dequantizes to the
    same floats the F32 path multiplies);
  * the weights the checkpoint stands for (float64 dequantization): TOL_FORMAT = 0.1, the effect
    of those float16 roundings (measured 0.044 for asymmetric INT4, 0.021 for float16 act-order,
    0.020-0.023 for FP8 (block `weight_scale_inv`, compressed-tensors per channel and per
    tensor) dequantized to float16, 0 for symmetric 4 and 8 bits, whose min -8 s is exact).
A layout read wrong (AWQ's nibble order taken as sequential) moves the logits by whole units:
checked.
"""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))

from conftest import BUILD_DIR  # noqa: E402
import forward_pass_test as mrt  # noqa: E402
import hf_checkpoint  # noqa: E402
import hf_quantized_checkpoint as hq  # noqa: E402
import random_model  # noqa: E402

TOL_AS_STORED = 1e-3
TOL_FORMAT = 0.1
SPEC = random_model.SPECS["llama3_rope"]
ROPE = SPEC.llama3_rope
ROPE_SCALING = {"rope_type": "llama3", "factor": ROPE["factor"], "low_freq_factor": ROPE["low_freq_factor"],
                "high_freq_factor": ROPE["high_freq_factor"],
                "original_max_position_embeddings": ROPE["original_context_length"]}
VARIANTS = {
    "awq4": dict(method="awq"),
    "gptq4": dict(method="gptq", symmetric=True),
    "gptq4_asym_v2": dict(method="gptq", v2=True),
    "gptq4_act_order": dict(method="gptq", act_order=True, seed=5),
    "gptq8_per_channel": dict(method="gptq", bits=8, group_size=-1, symmetric=True),
    "fp8_block": dict(method="fp8", fp8_scheme="block"),
    "fp8_ct_channel": dict(method="fp8", fp8_scheme="channel"),
    "fp8_ct_tensor": dict(method="fp8", fp8_scheme="tensor"),
}
# What each variant loads as (the load log's conversion lines).
EXPECTED_FORMAT = {"awq4": "INT4 g32", "gptq4": "INT4 g32", "gptq4_asym_v2": "INT4 g32",
                   "gptq4_act_order": "F16", "gptq8_per_channel": "INT8", "fp8_block": "F16",
                   "fp8_ct_channel": "F16", "fp8_ct_tensor": "F16"}
LOOM_BIN = BUILD_DIR / "coordinator" / "loom"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_quantized")
    gguf_path = random_model.write_model(SPEC, base / "llama3.gguf")
    return hf_checkpoint.write_hf_directory(gguf_path, base / "f32", dtype="float32",
                                            rope_scaling=ROPE_SCALING)


def prompts():
    rng = np.random.default_rng(3)
    return [rng.integers(0, random_model.VOCAB_SIZE, n).tolist() for n in (6, 40, 120)]


def logits(directory):
    tool = mrt.ForwardPassTool(directory)
    try:
        return tool.logits(prompts())
    finally:
        tool.close()


def load_log(directory) -> str:
    result = subprocess.run([str(LOOM_BIN), "generate", "--model", str(directory), "--prompt", "hi",
                             "--max-tokens", "2", "--threads", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_checkpoint_logits_match_the_dequantized_model(source, tmp_path, variant):
    quantized, dequantized, as_stored = hq.write_quantized_directory(source, tmp_path / variant,
                                                                     **VARIANTS[variant])
    got = logits(quantized)
    stored_diff = np.abs(got - logits(as_stored)).max()
    format_diff = np.abs(got - logits(dequantized)).max()
    print(f"{variant}: max |Δ logit| {stored_diff:.2e} against the weights as stored, "
          f"{format_diff:.2e} against the checkpoint's")
    assert stored_diff <= TOL_AS_STORED, f"{variant}: max |Δ logit| {stored_diff}"
    assert format_diff <= TOL_FORMAT, f"{variant}: max |Δ logit| {format_diff}"
    assert np.abs(got - logits(source)).max() > 2 * TOL_FORMAT, "quantization changed nothing"
    log = load_log(quantized)
    assert EXPECTED_FORMAT[variant] in log, log


def test_deepseek_v3_fp8_blocks_over_a_partial_last_block(tmp_path):
    """DeepSeek-V3's FP8 layout (weight_block_size, weight_scale_inv) on the deepseek2_qlora random
    model as a DeepseekV3ForCausalLM directory: every attention projection and expert in FP8.
    Its kv_a_proj_with_mqa has 48 rows (latent 32 + rotary 16), a block and a half of 32, so its
    scale grid has 2 rows; reading the block size from the grid (48 / 2 = 24 rows) misplaced half
    the scales and moved the logits by 11."""
    gguf_path = random_model.write_model(random_model.SPECS["deepseek2_qlora"], tmp_path / "ds.gguf")
    source = hf_checkpoint.write_hf_directory(gguf_path, tmp_path / "f32", dtype="float32",
                                              architecture="deepseek3")
    quantized, dequantized, as_stored = hq.write_quantized_directory(
        source, tmp_path / "fp8", method="fp8", fp8_scheme="block", linear=hq.DEEPSEEK_LINEAR)
    got = logits(quantized)
    stored_diff = np.abs(got - logits(as_stored)).max()
    format_diff = np.abs(got - logits(dequantized)).max()
    print(f"deepseek3 fp8: max |Δ logit| {stored_diff:.2e} against the weights as stored, "
          f"{format_diff:.2e} against the checkpoint's")
    assert stored_diff <= TOL_AS_STORED
    assert format_diff <= TOL_FORMAT
    assert np.abs(got - logits(source)).max() > 2 * TOL_FORMAT, "quantization changed nothing"


def test_a_layout_read_wrong_would_be_seen(source, tmp_path):
    """AutoAWQ's interleaved nibble order written as a plain sequential one: Loom (reading it as
    AutoAWQ's) serves different weights, and the logits move far outside TOL_PACKED."""
    wrong, dequantized, _ = hq.write_quantized_directory(source, tmp_path / "wrong", method="awq",
                                                         awq_order=tuple(range(8)))
    assert np.abs(logits(wrong) - logits(dequantized)).max() > 10 * TOL_FORMAT


@pytest.mark.parametrize("changes, needle", [
    ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
    ({"version": "gemv"}, "AWQ version 'gemv'"),
    ({"bits": 3}, "3 bits"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "'pack-quantized'"),
])
def test_unsupported_quantization_configs_are_refused_by_name(source, tmp_path, changes, needle):
    import json

    quantized, _, _ = hq.write_quantized_directory(source, tmp_path / "refused", method="awq")
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"].update(changes)
    (quantized / "config.json").write_text(json.dumps(config))
    result = subprocess.run([str(LOOM_BIN), "generate", "--model", str(quantized), "--prompt", "hi",
                             "--max-tokens", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and needle in result.stderr, result.stderr


def test_tensor_parallel_ranks_serve_the_single_process_text(source, tmp_path):
    """An AWQ checkpoint over 2 ranks: each packs its rows / its columns' groups of the INT4 weights
    and the greedy text equals the single process's."""
    import cluster_harness as h

    quantized, _, _ = hq.write_quantized_directory(source, tmp_path / "tp", method="awq")
    up = h.Up(tmp_path, model=quantized, tensor_parallel=2, threads=1, kv_cache_memory="16MiB",
              http_port=-1, activations="f32")
    try:
        up.wait_healthy(["replica-0"])
        prompts_text = ["the quick brown fox", "once upon a time"]
        outcomes = h.generate_all(up.stub, [h.make_request(prompt=p, max_tokens=10) for p in prompts_text])
        for prompt, outcome in zip(prompts_text, outcomes):
            assert outcome.finished, outcome.describe()
            reference = h.loom_generate(prompt, 10, model=quantized, threads=1,
                                        extra=["--activations", "f32"])
            assert outcome.text == reference.text, (prompt, outcome.text, reference.text)
    finally:
        up.stop()
