"""GGUF K-quant blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) written from float rows, in NumPy.

The `gguf` package dequantizes every K-quant but quantizes none of them, so the random test
models (random_model.py) and the K-quant tests make their blocks here: a plain min/max
quantizer per sub-block (not llama.cpp's error-minimizing search; any valid block serves a
test, which compares Loom with gguf's dequantization of these very bytes). Layouts as
common/formats/kquant_block.cc reads them.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

QK_K = 256
BLOCK_BYTES = {T.Q2_K: 84, T.Q3_K: 110, T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}
K_QUANTS = tuple(BLOCK_BYTES)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _f16(values: np.ndarray) -> np.ndarray:
    """Values as stored: rounded through float16."""
    return values.astype(np.float16).astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b != 0)


def _asymmetric(x: np.ndarray, sub: int, levels: int, scale_bits: int):
    """Sub-blocks of `sub` with value = d * sc * q - dmin * m (q in 0..levels, sc and m
    unsigned `scale_bits`-bit). Returns (d, dmin, sc, m, q) per block."""
    n = x.shape[0]
    xs = x.reshape(n, QK_K // sub, sub)
    offset = np.maximum(0.0, -xs.min(axis=2))
    scale = (xs.max(axis=2) + offset) / levels
    top = (1 << scale_bits) - 1
    d = _f16(scale.max(axis=1) / top)
    dmin = _f16(offset.max(axis=1) / top)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, top).astype(np.uint8)
    m = np.clip(np.rint(_safe_div(offset, dmin[:, None])), 0, top).astype(np.uint8)
    step = d[:, None] * sc
    q = np.rint(_safe_div(xs + (dmin[:, None] * m)[:, :, None], step[:, :, None]))
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(n, QK_K)
    return d, dmin, sc, m, q


def _pack_scale_min(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and mins."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return out


def _nibbles_q4k(q: np.ndarray) -> np.ndarray:
    """Sub-block s in nibble s % 2 of bytes 32 (s / 2) .. + 31."""
    qs = q.reshape(-1, 4, 2, 32) & 0x0F
    return (qs[:, :, 0, :] | (qs[:, :, 1, :] << 4)).reshape(-1, 128).astype(np.uint8)


def _q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _asymmetric(x, 32, 15, 6)
    return np.hstack([_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min(sc, m), _nibbles_q4k(q)])


def _q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _asymmetric(x, 32, 31, 6)
    high = (q >> 4).reshape(-1, 8, 32)  # bit s of byte i: element i of sub-block s
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for s in range(8):
        qh |= (high[:, s, :] << s).astype(np.uint8)
    return np.hstack([_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min(sc, m), qh,
                      _nibbles_q4k(q & 0x0F)])


def _q2_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _asymmetric(x, 16, 3, 4)
    scales = (sc | (m << 4)).astype(np.uint8)
    # Element 128 h + 32 j + l: bits 2 j of qs[32 h + l].
    qr = q.reshape(-1, 2, 4, 32)
    qs = np.zeros((q.shape[0], 2, 32), np.uint8)
    for j in range(4):
        qs |= (qr[:, :, j, :] << (2 * j)).astype(np.uint8)
    return np.hstack([scales, qs.reshape(-1, 64), _f16_bytes(d), _f16_bytes(dmin)])


def _symmetric(x: np.ndarray, sub: int, q_lo: int, q_hi: int, sc_lo: int, sc_hi: int):
    """Sub-blocks of `sub` with value = d * sc * q (signed q and sc)."""
    n = x.shape[0]
    xs = x.reshape(n, QK_K // sub, sub)
    # The sub-block scale keeps the sign that puts its largest magnitude at q_lo's end.
    extreme = np.take_along_axis(xs, np.abs(xs).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    scale = extreme / q_lo
    d = _f16(np.abs(scale).max(axis=1) / max(-sc_lo, sc_hi))
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), sc_lo, sc_hi).astype(np.int32)
    step = d[:, None] * sc
    q = np.clip(np.rint(_safe_div(xs, step[:, :, None])), q_lo, q_hi).astype(np.int32)
    return d, sc, q.reshape(n, QK_K)


def _q6_k(x: np.ndarray) -> np.ndarray:
    d, sc, q = _symmetric(x, 16, -32, 31, -128, 127)
    u = (q + 32).astype(np.uint8).reshape(-1, 2, 128)  # per half h, element r
    ql = np.zeros((u.shape[0], 2, 64), np.uint8)
    qh = np.zeros((u.shape[0], 2, 32), np.uint8)
    for r in range(128):
        ql[:, :, r % 64] |= ((u[:, :, r] & 0x0F) << (4 * (r // 64))).astype(np.uint8)
        qh[:, :, r % 32] |= ((u[:, :, r] >> 4) << (2 * (r // 32))).astype(np.uint8)
    return np.hstack([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8),
                      _f16_bytes(d)])


def _q3_k(x: np.ndarray) -> np.ndarray:
    d, sc, q = _symmetric(x, 16, -4, 3, -32, 31)
    u = (q + 4).reshape(-1, 2, 4, 32)  # element 128 h + 32 j + l
    qs = np.zeros((u.shape[0], 2, 32), np.uint8)
    hmask = np.zeros((u.shape[0], 32), np.uint8)
    for h in range(2):
        for j in range(4):
            qs[:, h, :] |= ((u[:, h, j, :] & 3) << (2 * j)).astype(np.uint8)
            hmask |= ((u[:, h, j, :] >> 2) << (4 * h + j)).astype(np.uint8)
    v = (sc + 32).astype(np.uint8)  # 16 six-bit scales
    scales = np.zeros((v.shape[0], 12), np.uint8)
    for s in range(16):
        scales[:, s % 8] |= ((v[:, s] & 0x0F) << (4 * (s // 8))).astype(np.uint8)
        scales[:, 8 + s % 4] |= ((v[:, s] >> 4) << (2 * (s // 4))).astype(np.uint8)
    return np.hstack([hmask, qs.reshape(-1, 64), scales, _f16_bytes(d)])


_QUANTIZERS = {T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k}


def copy_metadata(reader, writer, file_type=None) -> None:
    """Every key of a GGUF (gguf.GGUFReader) into a new one (gguf.GGUFWriter, which writes the
    architecture itself), general.file_type replaced by `file_type` (None: left out)."""
    import gguf

    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), field.types[0])
    if file_type is not None:
        writer.add_file_type(file_type)


def quantize(values: np.ndarray, qtype: T) -> np.ndarray:
    """Float rows [rows, cols] (cols a multiple of 256) as uint8 [rows, cols / 256 * block
    bytes] of `qtype` blocks, ready for GGUFWriter.add_tensor(..., raw_dtype=qtype)."""
    values = np.asarray(values, dtype=np.float32)
    rows, cols = values.shape
    if cols % QK_K:
        raise ValueError(f"{qtype.name}: {cols} columns are not a multiple of {QK_K}")
    blocks = _QUANTIZERS[qtype](values.reshape(-1, QK_K))
    assert blocks.shape[1] == BLOCK_BYTES[qtype], blocks.shape
    return np.ascontiguousarray(blocks.reshape(rows, -1))
