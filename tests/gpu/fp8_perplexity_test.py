"""The parts of the GPU window's FP8 perplexity step (tests/gpu/fp8_perplexity.py) that need
no PyTorch, on this machine's CPU, so that the window never runs them first:

* `test_model_tool tokens` writes the ids `loom tokenize` gives for each file, concatenated;
* weights written by fp8_perplexity.write_safetensors under their GGUF names become, through
  `test_model_tool trained`, a GGUF whose matrices and embeddings are those values rounded to
  BF16 and whose norms are exact, with the default model's tokenizer; its perplexity through
  `loom perplexity` equals the float64 NumPy reference (tests/worker/llama_reference.py) read
  from that file, over fp8_perplexity.perplexity_windows' windows (so the script's PyTorch
  figure scores the same tokens as Loom's). The weights are scaled so that attention is far
  from uniform: a RoPE or head-layout slip moves the figure by whole percents;
* the tool refuses weights it cannot place: a missing tensor, a wrong shape, a shape field
  missing from __metadata__, with the reason;
* without PyTorch the script reports that, fails, and still writes its JSON.

The PyTorch half (training, and PyTorch's figure against Loom's on the trained model) runs on
the GPU machine, where the script itself holds the two to 2%.
"""
import json
import pathlib
import subprocess
import sys

import gguf
import numpy as np
import pytest

from conftest import BUILD_DIR, SOURCE_DIR, tool_path

sys.path.insert(0, str(SOURCE_DIR / "tests" / "gpu"))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "worker"))
import fp8_perplexity  # noqa: E402
import llama_reference as ref  # noqa: E402

LOOM = BUILD_DIR / "coordinator" / "loom"
SHAPE = {"hidden": 64, "heads": 2, "kv_heads": 1, "head_dim": 32, "ffn": 96, "layers": 2,
         "context_length": 256}


@pytest.fixture(scope="module")
def meta(tmp_path_factory, model_path):
    out = tmp_path_factory.mktemp("fp8") / "meta.gguf"
    subprocess.run([tool_path("test_model_tool"), "metadata", model_path, out], check=True)
    return out


def random_weights(vocab):
    """GGUF name -> float32 array (row-major [rows, cols]), attention made sharp."""
    rng = np.random.default_rng(5)
    h, q, kv, ffn = (SHAPE["hidden"], SHAPE["heads"] * SHAPE["head_dim"],
                     SHAPE["kv_heads"] * SHAPE["head_dim"], SHAPE["ffn"])
    rows_cols = {"attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h),
                 "attn_output": (h, q), "ffn_gate": (ffn, h), "ffn_up": (ffn, h),
                 "ffn_down": (h, ffn)}
    weights = {}
    for name in fp8_perplexity.gguf_names(SHAPE["layers"]):
        part = name.split(".")[-2]
        if name == "token_embd.weight":
            weights[name] = 0.3 * rng.standard_normal((vocab, h), dtype=np.float32)
        elif part.endswith("norm"):
            weights[name] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        else:
            rows, cols = rows_cols[part]
            scale = (3.0 if part in ("attn_q", "attn_k") else 1.0) / np.sqrt(cols)
            weights[name] = (scale * rng.standard_normal((rows, cols))).astype(np.float32)
    return weights


def write(path, weights, metadata=SHAPE):
    fp8_perplexity.write_safetensors(
        path, {name: ("F32", a.shape, a.tobytes()) for name, a in weights.items()}, metadata)


def bf16(a):
    """Round-to-nearest-even to BF16, back in float32."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_tokens_are_loom_tokenizes_ids_of_each_file(meta, model_path, tmp_path):
    texts = [tmp_path / "a.md", tmp_path / "b.py"]
    texts[0].write_text("# Loom\n\nA serving system: paged attention, continuous batching.\n")
    texts[1].write_text("def f(x):\n    return x * 2  # <|im_start|> stays text\n")
    done = subprocess.run([tool_path("test_model_tool"), "tokens", "--metadata", meta,
                           tmp_path / "ids.u32", *texts], capture_output=True, text=True,
                          check=True)
    assert "files=2 vocab=49152" in done.stdout
    want = []
    for text in texts:
        printed = subprocess.run([LOOM, "tokenize", "--model", model_path, "--no-parse-special",
                                  text.read_text()], capture_output=True, text=True, check=True)
        want += [int(i) for i in printed.stdout.split()]
    assert fp8_perplexity.read_tokens(tmp_path / "ids.u32") == want


def test_trained_weights_become_the_model_loom_and_the_reference_agree_on(meta, tmp_path):
    weights = random_weights(49152)
    write(tmp_path / "w.safetensors", weights)
    subprocess.run([tool_path("test_model_tool"), "trained", "--metadata", meta, "--tensors",
                    tmp_path / "w.safetensors", tmp_path / "m.gguf"], check=True)
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(weights)
    for name, values in weights.items():
        tensor = tensors[name]
        assert [int(d) for d in tensor.shape] == list(values.shape[::-1]), name
        stored = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(values.shape)
        if values.ndim == 1:
            assert tensor.tensor_type == gguf.GGMLQuantizationType.F32
            np.testing.assert_array_equal(stored, values)
        else:
            assert tensor.tensor_type == gguf.GGMLQuantizationType.BF16, name
            np.testing.assert_array_equal(stored, bf16(values))
    assert reader.get_field("llama.context_length").contents() == 256
    assert len(reader.get_field("tokenizer.ggml.tokens").contents()) == 49152

    text = SOURCE_DIR / "docs" / "ARCHITECTURE.md"
    done = subprocess.run([LOOM, "perplexity", "--model", tmp_path / "m.gguf", "--text", text,
                           "--context", "64", "--stride", "32", "--max-tokens", "160",
                           "--kv-dtype", "f32", "--device", "cpu", "--json"],
                          capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    subprocess.run([tool_path("test_model_tool"), "tokens", "--metadata", meta,
                    tmp_path / "held_out.u32", text], check=True, capture_output=True)
    tokens = fp8_perplexity.read_tokens(tmp_path / "held_out.u32")[:160]
    model = ref.load(tmp_path / "m.gguf")
    windows = fp8_perplexity.perplexity_windows(len(tokens), 64, 32)
    nll, scored = 0.0, 0
    for begin, end, score_begin in windows:
        logits = ref.logits(model, tokens[begin:end])
        for p in range(score_begin, end):
            row = logits[p - 1 - begin]
            top = row.max()
            nll += top + np.log(np.exp(row - top).sum()) - row[tokens[p]]
            scored += 1
    assert got["windows"] == len(windows) and got["scored"] == scored == len(tokens) - 1
    assert got["nll"] == pytest.approx(nll / scored, abs=1e-4)
    # Sharp attention: far from the uniform guess, so positions and heads matter.
    assert got["perplexity"] < 0.5 * 49152 or got["perplexity"] > 2 * 49152


@pytest.mark.parametrize("damage, message", [
    ("missing", "lacks blk.1.ffn_up.weight"),
    ("shape", "attn_k.weight: shape [32, 96]"),
    ("metadata", "positive integer \"ffn\""),
])
def test_trained_refuses_weights_it_cannot_place(meta, tmp_path, damage, message):
    weights = random_weights(49152)
    metadata = dict(SHAPE)
    if damage == "missing":
        weights["blk.1.extra.weight"] = weights.pop("blk.1.ffn_up.weight")
    elif damage == "shape":
        weights["blk.0.attn_k.weight"] = np.zeros((32, 96), np.float32)
    else:
        del metadata["ffn"]
    write(tmp_path / "w.safetensors", weights, metadata)
    done = subprocess.run([tool_path("test_model_tool"), "trained", "--metadata", meta,
                           "--tensors", tmp_path / "w.safetensors", tmp_path / "m.gguf"],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert message in done.stderr
    assert not (tmp_path / "m.gguf").exists()


def test_without_pytorch_the_script_says_so(meta, tmp_path):
    try:
        import torch  # noqa: F401
        pytest.skip("PyTorch is importable here (CI's environment has none)")
    except ImportError:
        pass
    out = tmp_path / "fp8.json"
    done = subprocess.run([sys.executable, SOURCE_DIR / "tests" / "gpu" / "fp8_perplexity.py",
                           "--tool", tool_path("test_model_tool"), "--loom", LOOM,
                           "--metadata", meta, "--work", tmp_path, "--out", out],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    summary = json.loads(out.read_text())
    assert summary["passed"] is False and "PyTorch" in summary["error"]
