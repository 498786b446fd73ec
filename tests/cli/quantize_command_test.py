"""`loom perplexity` and `loom quantize` (cli/perplexity_command.cc, cli/quantize_command.cc).

* perplexity: the sliding-window NLL of the default model on a short held-out text equals an
  independent float64 numpy computation (llama_reference.py) over the same windows. Loom runs
  float32 with a float32 KV cache (logits within ~1e-3 of the reference, see
  forward_pass_test.py), so the mean NLL may differ by float rounding only: tolerance
  NLL_TOLERANCE = 1e-4 nats per token (measured: 1.1e-7 on this text; an F16 KV cache would
  add ~1e-3). Scoring one position off (the usual sliding-window bug) moves the mean NLL by
  whole nats.
* quantize: the default model (Q4_1 weights) is written as F32 (the reference: its Q4_1 values
  dequantized), INT8 per channel, INT4 g128 RTN and INT4 g128 AWQ (a small calibration set so
  the test stays under two minutes); every output loads and generates, the F32 copy has exactly
  the original's perplexity, and INT8's perplexity is within 0.5% of the F32 reference (the
  issue's target). INT4 g128 (g64 on SmolLM2's 576-wide matrices) loses much more on this
  135M model (measured here: RTN ~1.5x, AWQ ~1.15x the reference), so it is held to a sanity
  bound (2x; a broken INT4 path gives thousands) and AWQ to beating RTN; the measured figures
  on a longer text are bench/quantization_bench.py's.
* perplexity --quantization int8 (quantized in memory, as the worker serves it) gives the INT8
  file's figure exactly; fp8 (CUDA only) and --device cuda without a GPU are refused with the
  reason (the GPU window measures FP8's perplexity: tests/gpu/fp8_perplexity.py).

Texts come from the Python documentation (Debian's python3-doc, installed by
scripts/install-deps.sh): held-out text from the tutorial, calibration text from the library
reference (disjoint files).
"""
import json
import os
import pathlib
import subprocess
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from conftest import BUILD_DIR  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
import llama_reference as ref  # noqa: E402

LOOM_BIN = BUILD_DIR / "coordinator" / "loom"
DOCS = pathlib.Path("/usr/share/doc/python3.11/html/_sources")
HELD_OUT_FILE = DOCS / "tutorial" / "interpreter.rst.txt"
CALIBRATION_FILE = DOCS / "library" / "functions.rst.txt"

NLL_TOLERANCE = 1e-4
INT8_MAX_PPL_RATIO = 1.005
INT4_MAX_PPL_RATIO = 2.0
PPL_ARGS = ("--context", "256", "--stride", "256", "--max-tokens", "768", "--kv-dtype", "f32")


def loom(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    if not LOOM_BIN.exists():
        pytest.fail(f"{LOOM_BIN} is missing: build the project first")
    done = subprocess.run([str(LOOM_BIN), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"loom {' '.join(map(str, args))} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def perplexity(model: pathlib.Path, text: pathlib.Path, *args) -> dict:
    return json.loads(loom("perplexity", "--model", model, "--text", text, "--json", *args).stdout)


@pytest.fixture(scope="module")
def texts() -> dict:
    for path in (HELD_OUT_FILE, CALIBRATION_FILE):
        if not path.exists():
            pytest.fail(f"{path} is missing: the python3-doc corpus is installed by scripts/install-deps.sh")
    return {"held_out": HELD_OUT_FILE, "calibration": CALIBRATION_FILE}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, model_path, texts) -> dict:
    """name -> path of the default model written in each format."""
    directory = tmp_path_factory.mktemp("quantized")
    runs = {
        "f32": ("--format", "f32"),
        "int8": ("--format", "int8"),
        "int4_rtn": ("--format", "int4", "--group-size", "128"),
        "int4_awq": ("--format", "int4", "--group-size", "128", "--method", "awq",
                     "--calibration", texts["calibration"], "--calibration-samples", "8",
                     "--calibration-length", "128", "--awq-grid", "10", "--awq-samples", "256"),
    }
    paths = {}
    for name, args in runs.items():
        paths[name] = directory / f"{name}.gguf"
        loom("quantize", "--model", model_path, "--out", paths[name], *args)
    return paths


def reference_windows(n_tokens: int, context: int, stride: int):
    """Hugging Face's sliding windows: (begin, end, first scored position)."""
    windows, previous_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        windows.append((begin, end, max(previous_end, begin + 1)))
        previous_end = end
        if end == n_tokens:
            break
    return windows


def reference_token_nll(model: ref.Model, tokens, context: int, stride: int) -> np.ndarray:
    """Each scored token's NLL in float64, in text order, window by window."""
    nll = []
    for begin, end, score_begin in reference_windows(len(tokens), context, stride):
        logits = ref.logits(model, tokens[begin:end])  # [end - begin, vocab]
        for p in range(score_begin, end):
            row = logits[p - 1 - begin]
            top = row.max()
            nll.append(top + np.log(np.exp(row - top).sum()) - row[tokens[p]])
    return np.array(nll)


def test_perplexity_matches_the_numpy_reference(model_path, texts, tmp_path):
    # Token by token (--nll-out), and the figure's standard error as the tokens' spread.
    nll_out = tmp_path / "nll.txt"
    got = perplexity(model_path, texts["held_out"], "--context", "96", "--stride", "48",
                     "--max-tokens", "200", "--kv-dtype", "f32", "--nll-out", nll_out)
    text = texts["held_out"].read_text()
    ids = [int(i) for i in loom("tokenize", "--model", model_path, "--no-parse-special", text).stdout.split()]
    tokens = ids[:200]
    assert got["tokens"] == len(tokens)
    model = ref.load(model_path)
    want = reference_token_nll(model, tokens, 96, 48)
    assert got["scored"] == len(want) == len(tokens) - 1
    assert got["windows"] == len(reference_windows(len(tokens), 96, 48))
    want_nll = want.mean()
    assert abs(got["nll"] - want_nll) < NLL_TOLERANCE, (got, want_nll)
    assert got["perplexity"] == pytest.approx(np.exp(want_nll), rel=NLL_TOLERANCE * 1.01)
    token_nll = np.array([float(line) for line in nll_out.read_text().split()])
    assert len(token_nll) == len(want)
    assert np.abs(token_nll - want).max() < 10 * NLL_TOLERANCE
    assert token_nll.mean() == pytest.approx(got["nll"], abs=1e-12)
    stderr = want.std(ddof=1) / np.sqrt(len(want))
    assert got["nll_stderr"] == pytest.approx(stderr, rel=1e-3)
    assert got["perplexity_stderr"] == pytest.approx(got["perplexity"] * got["nll_stderr"], rel=1e-9)


def test_perplexity_reports_the_kv_type_auto_resolved_to(model_path, texts):
    # vLLM's `auto`: the compute type's, bf16 under --activations bf16 on the CPU, else f16; a
    # type given stays.
    def kv_dtype(*args):
        return perplexity(model_path, texts["held_out"], "--context", "32", "--max-tokens", "48",
                          "--device", "cpu", *args)["kv_dtype"]
    assert kv_dtype() == "f16"
    assert kv_dtype("--kv-dtype", "bf16") == "bf16"
    bf16 = subprocess.run([str(LOOM_BIN), "perplexity", "--model", str(model_path), "--text",
                           str(texts["held_out"]), "--context", "32", "--max-tokens", "48",
                           "--device", "cpu", "--json", "--activations", "bf16"],
                          capture_output=True, text=True, timeout=300)
    if bf16.returncode != 0:
        assert "AMX" in bf16.stderr, bf16.stderr[-2000:]  # this CPU has no AMX-BF16
        return
    assert json.loads(bf16.stdout)["kv_dtype"] == "bf16"
    assert kv_dtype("--activations", "bf16", "--kv-cache-dtype", "auto") == "bf16"
    assert kv_dtype("--activations", "bf16", "--kv-dtype", "f16") == "f16"


def test_perplexity_refuses_an_nll_file_it_cannot_write(model_path, texts, tmp_path):
    done = subprocess.run([str(LOOM_BIN), "perplexity", "--model", str(model_path), "--text",
                           str(texts["held_out"]), "--nll-out", str(tmp_path / "no" / "such.txt")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot write --nll-out" in done.stderr and "No such file" in done.stderr


def test_perplexity_rejects_bad_windows(model_path, texts):
    done = subprocess.run([str(LOOM_BIN), "perplexity", "--model", str(model_path), "--text",
                           str(texts["held_out"]), "--context", "64", "--stride", "65"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "stride 65" in done.stderr
    done = subprocess.run([str(LOOM_BIN), "perplexity", "--model", str(model_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--text" in done.stderr


def test_perplexity_quantizes_at_load_as_the_worker_does(quantized, model_path, texts):
    # --quantization int8 quantizes in memory as `loom-worker --quantization int8` serves:
    # the same values as the file `loom quantize --format int8` wrote, so the same figure.
    in_memory = perplexity(model_path, texts["held_out"], *PPL_ARGS, "--quantization", "int8")
    from_file = perplexity(quantized["int8"], texts["held_out"], *PPL_ARGS)
    assert in_memory["quantization"] == "int8" and from_file["quantization"] == "none"
    assert in_memory["device"] == "cpu"
    assert in_memory["perplexity"] == pytest.approx(from_file["perplexity"], rel=1e-9)


def test_perplexity_refuses_fp8_and_cuda_where_they_cannot_run(model_path, texts):
    args = [str(LOOM_BIN), "perplexity", "--model", str(model_path), "--text",
            str(texts["held_out"]), "--max-tokens", "64"]
    done = subprocess.run(args + ["--quantization", "fp8", "--device", "cpu"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "--quantization fp8" in done.stderr and "--device cuda" in done.stderr
    done = subprocess.run(args + ["--quantization", "fp4"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--quantization" in done.stderr
    if not os.path.exists("/dev/nvidiactl"):
        done = subprocess.run(args + ["--device", "cuda"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1
        assert "FAILED_PRECONDITION" in done.stderr and "--device cuda" in done.stderr


def test_quantized_models_load_and_generate(quantized):
    for name, path in quantized.items():
        done = loom("generate", "--model", path, "--prompt", "The capital of France is",
                    "--max-tokens", "8", "--threads", "2")
        continuation = done.stdout.removeprefix("The capital of France is")
        assert continuation.strip(), f"{name} generated nothing"
        if name in ("f32", "int8"):
            assert "Paris" in continuation, f"{name}: {continuation!r}"
        assert "INT8" in done.stderr if name == "int8" else True


def test_quantized_files_keep_the_metadata_and_describe_the_format(quantized, model_path):
    import gguf
    original = gguf.GGUFReader(model_path)
    for name, path in quantized.items():
        reader = gguf.GGUFReader(path)  # the PyPI reader parses Loom's files
        for key in ("tokenizer.ggml.tokens", "tokenizer.chat_template", "llama.block_count",
                    "llama.rope.freq_base"):
            assert reader.get_field(key).contents() == original.get_field(key).contents(), (name, key)
        tensors = {t.name: t for t in reader.tensors}
        if name == "f32":
            assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F32
            continue
        fmt = "int8" if name == "int8" else "int4"
        assert reader.get_field("loom.quantization.format").contents() == fmt
        suffix = ".q8" if fmt == "int8" else ".q4"
        q = tensors["blk.0.ffn_down.weight" + suffix]
        assert q.tensor_type == gguf.GGMLQuantizationType.I8
        assert "blk.0.ffn_down.weight" not in tensors
        scales = tensors["blk.0.ffn_down.weight.scale"]
        assert scales.tensor_type == gguf.GGMLQuantizationType.F16
        # ggml shape [groups, rows]: per channel for int8, g128 over down's 1536 inputs for int4.
        assert [int(d) for d in scales.shape] == ([1, 576] if fmt == "int8" else [12, 576])
        if name == "int4_awq":
            assert reader.get_field("loom.quantization.method").contents() == "awq"
            assert "functions.rst.txt" in reader.get_field("loom.quantization.calibration").contents()


def test_quantized_perplexity_against_the_f32_reference(quantized, model_path, texts):
    results = {name: perplexity(path, texts["held_out"], *PPL_ARGS) for name, path in quantized.items()}
    original = perplexity(model_path, texts["held_out"], *PPL_ARGS)
    reference = results["f32"]["perplexity"]
    # The F32 copy holds the Q4_1 values exactly.
    assert reference == pytest.approx(original["perplexity"], rel=1e-5)
    ratios = {name: r["perplexity"] / reference for name, r in results.items()}
    print("perplexity ratios to the F32 reference:", json.dumps(ratios))
    assert ratios["int8"] < INT8_MAX_PPL_RATIO, ratios
    assert ratios["int4_rtn"] < INT4_MAX_PPL_RATIO, ratios
    assert ratios["int4_awq"] < ratios["int4_rtn"], ratios
