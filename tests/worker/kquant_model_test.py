"""A Q4_K_M file of the default model loads with no tensor changed and serves.

The test makes the file from the bundled SmolLM2 (Q4_1) with llama.cpp's Q4_K_M type rules
(llama_tensor_get_type): Q4_K everywhere, Q6_K for attn_v and ffn_down on the layers
use_more_bits picks and for the (tied) output, and for rows that are not a multiple of 256
(SmolLM2's 576) the fallbacks llama.cpp writes: Q5_0 for Q4_K, Q8_0 for Q6_K. The blocks
come from tests/worker/kquant_writer.py (gguf cannot quantize K-quants; llama.cpp's own
quantizer serves in bench/kquant_bench.py). Then:
* every matrix as the CPU backend packs it (gguf_dequant_tool --packed) equals gguf's
  dequantization of the file bit for bit, and the load log names the lossless packings;
* `loom generate` answers a factual prompt the way the original model does.
"""
import pathlib
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))

from conftest import BUILD_DIR, tool_path  # noqa: E402
import ggml_type_test  # noqa: E402
import kquant_writer  # noqa: E402

LOOM_BIN = BUILD_DIR / "coordinator" / "loom"
FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}


def use_more_bits(layer: int, n_layer: int) -> bool:
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def q4_k_m_type(name: str, cols: int, n_layer: int) -> T:
    if name in ("output.weight", "token_embd.weight"):
        wanted = T.Q6_K
    elif name.endswith(("attn_v.weight", "ffn_down.weight")):
        wanted = T.Q6_K if use_more_bits(int(name.split(".")[1]), n_layer) else T.Q4_K
    else:
        wanted = T.Q4_K
    return wanted if cols % kquant_writer.QK_K == 0 else FALLBACK[wanted]


def write_q4_k_m(source: pathlib.Path, path: pathlib.Path) -> dict[str, T]:
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    n_layer = int(reader.fields[f"{arch}.block_count"].contents())
    writer = gguf.GGUFWriter(str(path), arch)
    kquant_writer.copy_metadata(reader, writer, file_type=15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    types = {}
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        if len(tensor.shape) == 1:
            writer.add_tensor(tensor.name, values.astype(np.float32))
            continue
        qtype = q4_k_m_type(tensor.name, values.shape[-1], n_layer)
        if qtype in kquant_writer.K_QUANTS:
            data = kquant_writer.quantize(values, qtype)
        else:
            data = gguf.quants.quantize(values.astype(np.float32), qtype)
        writer.add_tensor(tensor.name, data, raw_dtype=qtype)
        types[tensor.name] = qtype
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types


@pytest.fixture(scope="module")
def q4_k_m(model_path, tmp_path_factory):
    path = tmp_path_factory.mktemp("q4_k_m") / "SmolLM2-135M-Instruct.Q4_K_M.gguf"
    types = write_q4_k_m(model_path, path)
    return path, types


def test_every_matrix_packs_without_changing_a_value(q4_k_m, tmp_path):
    path, types = q4_k_m
    assert {T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0} <= set(types.values()), types
    out = tmp_path / "packed.bin"
    result = subprocess.run([str(tool_path("gguf_dequant_tool")), "--packed", str(path), str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Q4_K -> INT4 g32, F32 scales (lossless)" in result.stderr
    assert "Q6_K -> INT8 g16, F32 scales (lossless)" in result.stderr
    assert "re-quantized" not in result.stderr and "-> F32" not in result.stderr, result.stderr
    packed = ggml_type_test.read_tool_output(out)
    reader = gguf.GGUFReader(str(path))
    for tensor in reader.tensors:
        if tensor.name not in types:
            continue
        expected = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        ggml_type_test.assert_bit_identical(f"{tensor.name} ({tensor.tensor_type.name})",
                                            packed[tensor.name], expected)


def test_serves_the_default_models_answer(q4_k_m, model_path):
    path, _ = q4_k_m
    prompt = "The capital of France is"

    def generate(model):
        result = subprocess.run([str(LOOM_BIN), "generate", "--model", str(model), "--prompt",
                                 prompt, "--max-tokens", "8", "--threads", "2"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return result.stdout, result.stderr

    text, log = generate(path)
    assert "Q6_K -> INT8 g16, F32 scales (lossless)" in log, log
    original, _ = generate(model_path)
    assert "Paris" in original, original
    assert "Paris" in text, (text, original)
