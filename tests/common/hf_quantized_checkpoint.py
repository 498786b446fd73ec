"""AWQ and GPTQ checkpoints written the way AutoAWQ and AutoGPTQ lay them out, from a float32
Hugging Face directory (tests/common/hf_checkpoint.py), for tests/worker/hf_quantized_test.py.

Each linear layer W [out, in] of the decoder (q/k/v/o and gate/up/down projections) is quantized
group-wise along its input with round-to-nearest (the storage format is the point here, not the
search AWQ or GPTQ run to choose the values), and stored as:

* AWQ, GEMM layout (AutoAWQ's WQLinear_GEMM): qweight int32 [in, out / 8] with output column
  8c + (0, 2, 4, 6, 1, 3, 5, 7)[k] in nibble k of word c; qzeros int32 [in / group, out / 8]
  packed the same way; scales float16 [in / group, out]; W = (q - z) * s.
* GPTQ (AutoGPTQ's QuantLinear, checkpoint_format "gptq"): qweight int32 [in / p, out] with
  input row p i + k in bits [b k, b k + b) of row i (p = 32 / b values per word); qzeros int32
  [groups, out / p] holding z - 1 (the format's historical offset; "gptq_v2" stores z), packed
  the same way along the output; scales float16 [groups, out]; g_idx int32 [in], the group of
  each input column (act-order, desc_act: groups follow a permutation of the columns);
  W = (q - z[g_idx]) * s[g_idx].

* FP8 (E4M3) weights with float32 scales: `fp8` (quant_method "fp8" with weight_block_size:
  weight_scale_inv [ceil(out / 32), ceil(in / 32)], DeepSeek-V3's and Qwen3-FP8's layout) and
  compressed-tensors float-quantized ("channel": weight_scale [out, 1]; "tensor": weight_scale
  [1] beside an input_scale); W = e4m3(w / s) * s, rounded to nearest even over E4M3's values.

The "_dequantized" directory holds the float32 weights those tensors stand for, computed in
float64 from the stored integers and float16 scales: the model a faithful loader serves. The
"_as_stored" one holds them as Loom's encodings keep them (model/quantized_gguf.h): INT4 as
q s + float16(-z s), INT8 as (q - 128) s, and what neither holds (act-order groups, asymmetric
8 bits) as float16 values.
"""
from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import safetensors.numpy

from hf_checkpoint import write_safetensors

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# DeepSeek-V3's FP8 checkpoints quantize the latent attention's projections too (and every
# expert's): kv_a_proj_with_mqa's kv_lora_rank + rope rows are not a whole number of blocks.
DEEPSEEK_LINEAR = LINEAR + ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _groups_of(columns: int, group: int, act_order: bool, rng) -> np.ndarray:
    """Each input column's group: contiguous runs, or runs of a random permutation."""
    ids = np.arange(columns) // group
    if not act_order:
        return ids.astype(np.int32)
    g_idx = np.empty(columns, dtype=np.int32)
    g_idx[rng.permutation(columns)] = ids
    return g_idx


def _quantize(w: np.ndarray, g_idx: np.ndarray, groups: int, bits: int, symmetric: bool):
    """Round-to-nearest per (output row, group): integer q [out, in], zeros and float16 scales
    [groups, out]."""
    out, columns = w.shape
    top = (1 << bits) - 1
    q = np.zeros((out, columns), dtype=np.int64)
    zeros = np.zeros((groups, out), dtype=np.int64)
    scales = np.zeros((groups, out), dtype=np.float16)
    for g in range(groups):
        cols = np.nonzero(g_idx == g)[0]
        block = w[:, cols].astype(np.float64)
        if symmetric:
            half = 1 << (bits - 1)
            scale = (np.abs(block).max(axis=1) / (half - 1)).astype(np.float16)
            zero = np.full(out, half)
        else:
            low, high = np.minimum(block.min(axis=1), 0), np.maximum(block.max(axis=1), 0)
            scale = ((high - low) / top).astype(np.float16)
            zero = np.clip(np.round(-low / np.maximum(scale.astype(np.float64), 1e-8)), 0, top)
        s = np.maximum(scale.astype(np.float64), 1e-8)
        q[:, cols] = np.clip(np.round(block / s[:, None]) + zero[:, None], 0, top)
        zeros[g], scales[g] = zero, scale
    return q, zeros, scales


def _pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] small integers -> int32 [rows / p, cols], row p i + k in bits b k."""
    per = 32 // bits
    rows, cols = values.shape
    packed = np.zeros((rows // per, cols), dtype=np.uint32)
    for k in range(per):
        packed |= (values[k::per].astype(np.uint32) & ((1 << bits) - 1)) << (bits * k)
    return packed.view(np.int32)


def _pack_columns(values: np.ndarray, bits: int, order=None) -> np.ndarray:
    """[rows, cols] -> int32 [rows, cols / p], column p c + order[k] in bits b k."""
    per = 32 // bits
    order = order or tuple(range(per))
    rows, cols = values.shape
    packed = np.zeros((rows, cols // per), dtype=np.uint32)
    for k in range(per):
        packed |= (values[:, order[k]::per].astype(np.uint32) & ((1 << bits) - 1)) << (bits * k)
    return packed.view(np.int32)


def _e4m3_table() -> np.ndarray:
    """The value of every E4M3 code (NaN for 0x7f and 0xff)."""
    codes = np.arange(256)
    exponent, mantissa = (codes >> 3) & 15, codes & 7
    magnitude = np.where(exponent == 0, mantissa * 2.0 ** -9, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    values = np.where(codes & 0x80, -magnitude, magnitude)
    values[(exponent == 15) & (mantissa == 7)] = np.nan
    return values


def _to_e4m3(x: np.ndarray) -> np.ndarray:
    """Codes of the E4M3 values nearest x (ties to the even code), saturating at +-448."""
    table = _e4m3_table()
    finite = np.nonzero(~np.isnan(table))[0]
    order = finite[np.argsort(table[finite], kind="stable")]
    values = table[order]
    x = np.clip(x, values[0], values[-1])
    hi = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lo = hi - 1
    pick_hi = (values[hi] - x < x - values[lo]) | ((values[hi] - x == x - values[lo]) & (order[hi] % 2 == 0))
    return np.where(pick_hi, order[hi], order[lo]).astype(np.uint8)


def _fp8_layer(w: np.ndarray, scheme: str):
    """(codes, float32 scale tensor, scale per element) of w in `scheme`."""
    out, columns = w.shape
    if scheme == "tensor":
        scale = np.array([np.abs(w).max() / 448.0], dtype=np.float32)
        per = np.full(w.shape, scale[0], dtype=np.float64)
    elif scheme == "channel":
        scale = (np.abs(w).max(axis=1, keepdims=True) / 448.0).astype(np.float32)
        per = np.broadcast_to(scale.astype(np.float64), w.shape)
    else:  # 32 x 32 blocks
        rows, cols = -(-out // 32), -(-columns // 32)
        scale = np.zeros((rows, cols), dtype=np.float32)
        for r in range(rows):
            for c in range(cols):
                scale[r, c] = np.abs(w[32 * r:32 * r + 32, 32 * c:32 * c + 32]).max() / 448.0
        per = np.repeat(np.repeat(scale.astype(np.float64), 32, 0), 32, 1)[:out, :columns]
    codes = _to_e4m3(w / per)
    return codes, scale, per


def write_quantized_directory(source: pathlib.Path, out: pathlib.Path, method: str, bits: int = 4,
                              group_size: int = 32, symmetric: bool = False, act_order: bool = False,
                              v2: bool = False, awq_order=AWQ_ORDER, seed: int = 0,
                              fp8_scheme: str = "block", linear=LINEAR):
    """Writes `source` (a float32 HF directory) quantized with `method` ("awq" or "gptq") into
    `out`, the float32 weights it stands for into `out`.parent / (out.name + "_dequantized") and
    the weights as Loom stores them into (out.name + "_as_stored"). Returns (quantized,
    dequantized, as-stored directories). `awq_order` other than AutoAWQ's
    writes a wrong layout (for checking that the test can fail). `linear`: the layer names
    (the last part of each weight's name) that are quantized."""
    rng = np.random.default_rng(seed)
    dequantized_dir = out.parent / (out.name + "_dequantized")
    stored_dir = out.parent / (out.name + "_as_stored")
    for directory in (out, dequantized_dir, stored_dir):
        shutil.copytree(source, directory)
        for file in directory.glob("*.safetensors"):
            file.unlink()
    tensors = {}
    for file in sorted(source.glob("*.safetensors")):
        tensors.update(safetensors.numpy.load_file(str(file)))
    quantized, plain, as_stored = {}, {}, {}
    for name, values in tensors.items():
        layer = name.removesuffix(".weight")
        if not (name.endswith(".weight") and layer.rsplit(".", 1)[-1] in linear):
            quantized[name] = plain[name] = as_stored[name] = values
            continue
        out_features, in_features = values.shape
        if method == "fp8":
            codes, scale, per = _fp8_layer(values, fp8_scheme)
            exact = _e4m3_table()[codes] * per
            plain[name] = exact.astype(np.float32)
            as_stored[name] = (_e4m3_table()[codes].astype(np.float32) * per.astype(np.float32)
                               ).astype(np.float16).astype(np.float32)
            quantized[name] = codes
            quantized[layer + (".weight_scale_inv" if fp8_scheme == "block" else ".weight_scale")] = scale
            if fp8_scheme == "tensor":
                quantized[layer + ".input_scale"] = np.array([0.05], dtype=np.float32)
            continue
        group = in_features if group_size == -1 else group_size
        groups = in_features // group
        g_idx = _groups_of(in_features, group, act_order, rng)
        q, zeros, scales = _quantize(values, g_idx, groups, bits, symmetric)
        stored = zeros if method == "awq" or v2 else (zeros - 1) & ((1 << bits) - 1)
        if method == "gptq" and not v2:
            zeros = stored + 1  # what the v1 format means (a zero point of 0 reads back as 2^b)
        plain[name] = ((q - zeros[g_idx].T) * scales[g_idx].T.astype(np.float64)).astype(np.float32)
        contiguous = not act_order and group % 32 == 0
        s32 = scales[g_idx].T.astype(np.float32)
        if contiguous and bits == 4:
            low = (-zeros[g_idx].T.astype(np.float32) * s32).astype(np.float16).astype(np.float32)
            as_stored[name] = q.astype(np.float32) * s32 + low
        elif contiguous and bits == 8 and (zeros == 128).all():
            as_stored[name] = (q - 128).astype(np.float32) * s32
        else:
            as_stored[name] = plain[name].astype(np.float16).astype(np.float32)
        if method == "awq":
            quantized[layer + ".qweight"] = _pack_columns(q.T, 4, awq_order)
            quantized[layer + ".qzeros"] = _pack_columns(zeros, 4, awq_order)
        else:
            quantized[layer + ".qweight"] = _pack_rows(q.T, bits)
            quantized[layer + ".qzeros"] = _pack_columns(stored, bits)
            quantized[layer + ".g_idx"] = g_idx
        quantized[layer + ".scales"] = scales
    write_safetensors(out / "model.safetensors", quantized)
    write_safetensors(dequantized_dir / "model.safetensors", plain)
    write_safetensors(stored_dir / "model.safetensors", as_stored)
    config = json.loads((out / "config.json").read_text())
    if method == "fp8" and fp8_scheme == "block":
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                         "fmt": "e4m3", "weight_block_size": [32, 32]}
    elif method == "fp8":
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": fp8_scheme, "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                      "dynamic": fp8_scheme != "tensor"}}},
            "ignore": ["lm_head"]}
    elif method == "awq":
        config["quantization_config"] = {"quant_method": "awq", "bits": bits, "group_size": group_size,
                                         "zero_point": True, "version": "gemm"}
    else:
        config["quantization_config"] = {"quant_method": "gptq", "bits": bits, "group_size": group_size,
                                         "desc_act": act_order, "sym": symmetric,
                                         "checkpoint_format": "gptq_v2" if v2 else "gptq"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out, dequantized_dir, stored_dir
