"""Loom's GGUF dequantization (common/formats/ggml_type.cc) against the `gguf` package.

Random blocks of every supported type are written with gguf.GGUFWriter, dequantized by
tests/tools/gguf_dequant_tool, and compared bit for bit with gguf.quants.dequantize.
"""
import pathlib
import struct
import subprocess

import gguf
import numpy as np
import pytest

from conftest import tool_path

Q = gguf.GGMLQuantizationType

# Byte offsets of the float16 scales inside one block, per type; the rest is payload.
F16_SCALE_OFFSETS = {
    Q.Q8_0: [0],
    Q.Q4_0: [0],
    Q.Q4_1: [0, 2],
    Q.Q5_0: [0],
    Q.Q5_1: [0, 2],
    Q.IQ4_NL: [0],
    Q.Q4_K: [0, 2],
    Q.Q5_K: [0, 2],
    Q.Q6_K: [208],
    Q.Q3_K: [108],
    Q.Q2_K: [80, 82],
}
SUPPORTED = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.MXFP4,
             Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def random_finite_f16_bits(rng: np.random.Generator, count: int) -> np.ndarray:
    """float16 bit patterns with every exponent but all-ones: zeros, subnormals, normals."""
    sign = rng.integers(0, 2, count, dtype=np.uint16) << 15
    exponent = rng.integers(0, 31, count, dtype=np.uint16) << 10
    mantissa = rng.integers(0, 1024, count, dtype=np.uint16)
    return sign | exponent | mantissa


def random_rows(rng: np.random.Generator, qtype: Q, rows: int, blocks_per_row: int) -> np.ndarray:
    """uint8 [rows, bytes_per_row] of random blocks with finite float16 scales."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    num_blocks = rows * blocks_per_row
    if qtype == Q.F16:
        data = random_finite_f16_bits(rng, num_blocks).view(np.uint8)
    else:
        # F32 and BF16 take any bit pattern (NaN payloads included): both sides copy bits.
        data = rng.integers(0, 256, num_blocks * type_size, dtype=np.uint8)
        blocks = data.reshape(num_blocks, type_size)
        for offset in F16_SCALE_OFFSETS.get(qtype, []):
            blocks[:, offset:offset + 2] = random_finite_f16_bits(rng, num_blocks).view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, blocks_per_row * type_size)


def read_tool_output(path: pathlib.Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    tensors: dict[str, np.ndarray] = {}
    pos = 0
    while pos < len(raw):
        (name_length,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        name = raw[pos:pos + name_length].decode()
        pos += name_length
        (count,) = struct.unpack_from("<Q", raw, pos)
        pos += 8
        tensors[name] = np.frombuffer(raw, dtype=np.float32, count=count, offset=pos)
        pos += 4 * count
    return tensors


def run_tool(model: pathlib.Path, out: pathlib.Path, names: list[str] = ()) -> dict[str, np.ndarray]:
    result = subprocess.run([str(tool_path("gguf_dequant_tool")), str(model), str(out), *names],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return read_tool_output(out)


def assert_bit_identical(name: str, actual: np.ndarray, expected: np.ndarray) -> None:
    expected = np.ascontiguousarray(expected, dtype=np.float32).reshape(-1)
    assert actual.shape == expected.shape, name
    actual_bits = actual.view(np.uint32)
    expected_bits = expected.view(np.uint32)
    if not np.array_equal(actual_bits, expected_bits):
        bad = np.flatnonzero(actual_bits != expected_bits)
        i = bad[0]
        pytest.fail(f"{name}: {bad.size} of {actual.size} values differ; first at {i}: "
                    f"loom {actual[i]!r} (0x{actual_bits[i]:08x}) vs gguf {expected[i]!r} "
                    f"(0x{expected_bits[i]:08x})")


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_random_blocks_dequantize_bit_identical_to_gguf(qtype: Q, tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(1234 + int(qtype))
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    # Several shapes: one block, a multi-row matrix, a long row. Plain types get
    # wider rows so that every case has a few hundred values at least.
    per_row = 1 if block_size > 1 else 256
    shapes = {"single": (1, per_row), "matrix": (7, 3 * per_row), "long": (1, 64 * per_row)}
    writer = gguf.GGUFWriter(tmp_path / "random.gguf", "llama")
    expected = {}
    for label, (rows, blocks_per_row) in shapes.items():
        data = random_rows(rng, qtype, rows, blocks_per_row)
        name = f"{qtype.name}.{label}"
        writer.add_tensor(name, data, raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(data, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    actual = run_tool(tmp_path / "random.gguf", tmp_path / "out.bin")
    assert sorted(actual) == sorted(expected)
    for name, values in expected.items():
        assert_bit_identical(name, actual[name], values)


def test_model_tensors_dequantize_bit_identical_to_gguf(model_path: pathlib.Path,
                                                        tmp_path: pathlib.Path) -> None:
    reader = gguf.GGUFReader(model_path)
    by_name = {t.name: t for t in reader.tensors}
    # One tensor of every type the model holds, plus a few specific ones.
    chosen = {}
    for tensor in reader.tensors:
        chosen.setdefault(tensor.tensor_type, tensor.name)
    names = sorted(set(chosen.values()) | {"token_embd.weight", "blk.0.attn_q.weight",
                                           "blk.29.ffn_down.weight", "output_norm.weight"}
                   & set(by_name))
    assert len(names) >= 3
    actual = run_tool(model_path, tmp_path / "out.bin", names)
    for name in names:
        tensor = by_name[name]
        expected = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        assert_bit_identical(f"{name} ({tensor.tensor_type.name})", actual[name], expected)


def test_unsupported_type_is_reported_not_crashed(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(7)
    data = random_rows(rng, Q.IQ4_XS, 2, 1)
    writer = gguf.GGUFWriter(tmp_path / "iq4_xs.gguf", "llama")
    writer.add_tensor("iq4_xs", data, raw_dtype=Q.IQ4_XS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = subprocess.run([str(tool_path("gguf_dequant_tool")), str(tmp_path / "iq4_xs.gguf"),
                             str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "IQ4_XS" in result.stderr and "not implemented" in result.stderr


def test_kquant_writer_round_trips_through_gguf_dequantization() -> None:
    """The test models' K-quant blocks (tests/worker/kquant_writer.py) hold what they were
    given, to within each format's step: the blocks the forward-pass tests load are sane."""
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
    import kquant_writer

    rng = np.random.default_rng(3)
    values = rng.normal(0.0, 0.05, size=(8, 512)).astype(np.float32)
    # Worst case per format: half a step of the sub-block grid plus the 6-bit (4-bit for
    # Q2_K) rounding of the sub-block scale, relative to the sub-block's range.
    bound = {Q.Q2_K: 0.5, Q.Q3_K: 0.35, Q.Q4_K: 0.1, Q.Q5_K: 0.05, Q.Q6_K: 0.03}
    for qtype in kquant_writer.K_QUANTS:
        blocks = kquant_writer.quantize(values, qtype)
        back = gguf.quants.dequantize(blocks, qtype).reshape(values.shape)
        err = np.abs(back - values).max() / np.abs(values).max()
        assert err < bound[qtype], (qtype.name, err)
