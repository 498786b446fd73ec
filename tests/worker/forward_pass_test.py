"""Loom's C++ forward pass (through tests/tools/forward_pass_tool) against the independent numpy
reference in llama_reference.py, on SmolLM2-135M and on the small random models of
random_model.py (GQA llama with mixed quant types, qwen2 with biases/neox RoPE/linear scaling/MQA,
llama3 rope_freqs, sliding-window layers beside a global one, mixtures of experts with top-8/2/1
routing, Gemma 3, Phi-3 with longrope, GLM-4.5's sigmoid routing with a selection bias).

Tolerances (max |Δ logit| against the float64 reference), from measurements of the reference
run with the forward pass's shortcuts emulated (Numerics), over prompts of 5-120 tokens:
  float32 arithmetic, float32 KV cache            <= 4.2e-5 on every model
  float32 arithmetic, float16 KV cache            <= 3.0e-2
  plus int8 activations (q8_0 blocks of 32)       up to 1.6 (SmolLM2), 1.4 (random models)
  a wrong RoPE pairing / missing scaling          3.7 to 20
TOL_F32_KV = 1e-3 (about 25x the float32 floor) and TOL_F16_KV = 0.1 (3x the measured float16-KV
effect). They assume the forward pass computes activations in float32; a forward pass that quantizes
activations to int8 would need ~2 and could no longer be told apart from subtle bugs, so the
tests keep the tight values and report the measured differences when they fail; the forward pass's
own --activations int8 mode has per-model limits from its measured error (TOL_INT8), and
--activations bf16 is held to the reference run with the same BF16 rounding (TOL_BF16).
Greedy tokens are compared on prompts whose reference top-2 margins stay above DECISIVE_MARGIN at
every step: where the margin exceeds twice the tolerance, any correct forward pass must pick the same
token.
"""
import json
import os
import pathlib
import queue
import subprocess
import threading

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("OMP_NUM_THREADS", "2")

import jinja2  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from conftest import tool_path  # noqa: E402
import llama_reference as ref  # noqa: E402
import random_model  # noqa: E402

TOL_F32_KV = 1e-3
TOL_F16_KV = 0.1
DECISIVE_MARGIN = 0.02  # 20x TOL_F32_KV
# --activations int8 against the float64 reference, per model: (max |Δlogit|, RMS Δlogit) on
# prompts_for()'s prompts, each limit 1.5x the worst figure measured over the AVX-512, AVX2 and
# scalar kernels (LOOM_CPU_ISA=avx512|avx2|scalar; the integer dot products are exact and the
# thread count fixed, so a given ISA gives the same figures every run; the ISAs differ by up
# to 1.3x on SmolLM2 and < 2% on the random models). Measured (avx512 / avx2 / scalar):
#   smollm2      max 0.949 / 0.981 / 1.005   RMS 0.245 / 0.291 / 0.317
#   llama_gqa    max 0.800 / 0.782 / 0.787   RMS 0.1586 / 0.1586 / 0.1589
#   qwen2_mqa    max 0.514 / 0.514 / 0.514   RMS 0.105 / 0.105 / 0.105
#   llama3_rope  max 0.306 (every ISA)        RMS 0.0851 / 0.0859 / 0.0842
#   llama_swa    max 0.276 (every ISA)        RMS 0.0710
#   qwen3moe_top8 max 0.278 (every ISA)       RMS 0.0477
#   mixtral_top2 max 0.383 (every ISA)        RMS 0.0608
#   moe_top1     max 0.291 (every ISA)        RMS 0.0541
#   gemma3_swa   max 0.162 (every ISA)        RMS 0.0426
#   phi3_longrope max 0.690 (every ISA)       RMS 0.141 (untied Q8_0 head with gain 4: large logits)
#   llama_q5     max 0.485 (every ISA)        RMS 0.0910 (Q5_1 layers now INT5 with int8
#                activations, as llama.cpp's Q8_1 arithmetic; 0.152 / 0.0395 with them in F32)
#   gemma2_softcap max 0.283 (every ISA)     RMS 0.0645
#   smollm3_nope max 0.316 (avx2, scalar)    RMS 0.0671 (measured on an AVX2-only machine)
#   granite_scaled max 0.0382 (avx2, scalar) RMS 0.0110 (logits halved by its logit_scale; same)
#   glm4_sandwich max 0.294 (avx2, scalar)   RMS 0.0679 (same)
#   gemma1_gelu  max 0.278 (avx2, scalar)     RMS 0.0561 / 0.0555 (same)
#   gpt_oss_sinks max 0.291 (avx2, scalar)   RMS 0.0714 (same; MXFP4 experts as NL4 g32, the bits of INT8 g32)
#   llama_k      max 0.864 (every ISA)        RMS 0.1659 / 0.1659 / 0.1680 (Q8_K: a scale per 256)
#   qwen2moe_shared max 0.945 (avx2, scalar)  RMS 0.139 (same; larger than the other MoE models'
#                because its routing is fragile: the reference's own int8 emulation
#                (Numerics.int8_activations) lands 2.35 from the exact logits on one prompt)
#   glm4moe      max 0.367 (avx2, scalar)     RMS 0.0714 (same). The reference's own int8
#                emulation (Numerics int8 + f16 KV + float32) lands max 0.299, RMS 0.076 from the
#                exact logits; a selection bias of +-0.3 left a near tie that int8 flipped (max 11)
#   olmo2_swa    max 0.223 (avx2, scalar)     RMS 0.0586 (same)
#   olmoe        max 0.198 (avx2, scalar)     RMS 0.0480 (same)
#   ernie45      max 0.369 (avx2, scalar)     RMS 0.0570 (same)
#   exaone4_swa  max 0.182 (avx2, scalar)     RMS 0.0448 / 0.0446
#   ernie45_moe  max 0.528 (avx2, scalar)     RMS 0.110 (same; seed 1415's near routing tie gave 2.5)
#   granitemoe_shared max 0.0449 (avx2, scalar) RMS 0.0108 (same; granite_scaled's scale)
#   deepseek2_lite max 0.787 / 0.784 (avx2 / scalar) RMS 0.155 (softmax routing not renormalized:
#                seeds 1618 and 1620 measured 2.6 on one prompt each, the others under 1.3)
#   deepseek2_qlora max 0.337 (avx2, scalar)  RMS 0.0843 (same)
# llama_gqa, llama_swa, llama3_rope and the MoE models grew when fused matrices of mixed integer
# formats (Q4_0 Q beside a Q8_0 V, ...) stopped falling back to F32 weights: they are widened
# without loss to INT8 and now take int8 activations like their parts (were 0.28, 0.25, 0.27,
# 0.14 and 0.21 with those layers in float).
# Mutation check: the activation scale made 1% too large (amax / 127 * 1.01 in
# QuantizeActivationRows) measured max 0.908 / 0.849 / 0.838 and RMS 0.158 / 0.163 / 0.161 on
# the three random models, inside the former single bound (max 1.5, mean 0.25) but outside
# these; 2% too large gives SmolLM2 max 1.56-1.78, RMS 0.52-0.59. A wrong RoPE gives max 3.7-20.
# Rerun after the widening (AVX2): qwen2_mqa 0.849, llama_swa 0.562, mixtral_top2 0.833,
# moe_top1 0.516 and llama3_rope 0.678 fail their bounds; llama_gqa (1.11) no longer does.
TOL_INT8 = {  # name: (max |Δlogit|, RMS Δlogit)
    "smollm2": (1.5, 0.48),
    "llama_gqa": (1.2, 0.24),
    "qwen2_mqa": (0.77, 0.16),
    "llama3_rope": (0.41, 0.125),
    "llama_swa": (0.42, 0.107),
    "qwen3moe_top8": (0.42, 0.072),
    "mixtral_top2": (0.58, 0.092),
    "moe_top1": (0.44, 0.081),
    "gemma3_swa": (0.24, 0.064),
    "phi3_longrope": (1.04, 0.21),
    "llama_q5": (0.73, 0.137),
    "llama_k": (1.3, 0.252),
    "gemma2_softcap": (0.43, 0.097),
    "smollm3_nope": (0.48, 0.101),
    "granite_scaled": (0.058, 0.0165),
    "glm4_sandwich": (0.45, 0.102),
    "gemma1_gelu": (0.42, 0.085),
    "gpt_oss_sinks": (0.44, 0.107),
    "qwen2moe_shared": (1.42, 0.21),
    "glm4moe": (0.55, 0.107),
    "olmo2_swa": (0.34, 0.088),
    "olmoe": (0.30, 0.072),
    "granitemoe_shared": (0.068, 0.0165),
    "ernie45": (0.55, 0.086),
    "ernie45_moe": (0.79, 0.165),
    "exaone4_swa": (0.28, 0.068),
    "deepseek2_lite": (1.18, 0.233),
    "deepseek2_qlora": (0.51, 0.128),
}
GREEDY_TOKENS = 32
REQUEST_TIMEOUT_S = 600
RANDOM_MODELS = tuple(random_model.SPECS)
ALL_MODELS = ("smollm2",) + RANDOM_MODELS
# --activations bf16 against the reference with the same BF16 rounding (Numerics.bf16: every
# matmul's inputs, and attention's q, K, V and softmax weights): (max |Δlogit|, RMS Δlogit), about
# 2.2x the worst measured (AMX on a Sapphire Rapids Xeon; AMX's sums are deterministic and
# batch- and thread-invariant). Measured: smollm2 max 0.312 RMS 0.080 (30 layers: some values
# round to the other side of a BF16 step, where float32 and float64 differ); the random models
# max 0.000-0.139, RMS 0.000-0.015, against 0.019-0.64 / 0.005-0.10 from the exact reference, so
# the kernels round what the reference rounds: most prompts agree to ~1e-6, the largest
# differences are single prompts where such a flip was amplified (before attention was rounded
# too, with fewer rounding sites: smollm2 0.221 / 0.052, random models up to 0.060 / 0.0093). The DeepSeek-V2 models are held to the exact
# reference instead (measured max 0.542 / 0.439, RMS 0.104 / 0.080): Loom runs their latent
# attention absorbed (k_b and v_b as matmuls of the heads, so rounded), the reference not (its
# einsums are not rounded), and on one prompt that moved the bf16 reference's routing (11.6).
TOL_BF16 = {name: (0.3, 0.035) for name in ALL_MODELS}
TOL_BF16["smollm2"] = (0.7, 0.18)
BF16_HELD_TO_EXACT = {"deepseek2_lite": (1.2, 0.25), "deepseek2_qlora": (1.2, 0.25)}

TEXT_PROMPTS = (
    "The capital of France is",
    "What is two plus two? Two plus two is",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "She said that they would come to the station at seven, but",
    "A model reads the tokens of a prompt and predicts",
    "In the beginning there was the word, and the word was with the machine, and it was good. "
    "The cache keeps the keys and the values of every token that the model has already seen, so",
)


# ---------------------------------------------------------------------------------------------
# The driver process.

class ForwardPassTool:
    """One forward_pass_tool process: a JSON request per line in, a JSON answer per line out."""

    def __init__(self, model_path, kv_dtype="f32", num_blocks=None, threads=2, activations="f32"):
        args = [str(tool_path("forward_pass_tool")), "--model", str(model_path),
                "--kv-dtype", kv_dtype, "--threads", str(threads), "--activations", activations]
        if num_blocks is not None:
            args += ["--num-blocks", str(num_blocks)]
        self.args = args
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, bufsize=1)
        self._lines: queue.Queue = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.process.stdout, self._lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.process.stderr, self._stderr.append), daemon=True).start()

    @staticmethod
    def _pump(stream, sink):
        for line in stream:
            sink(line)
        sink(None)

    def _died(self, what: str):
        self.process.wait(timeout=10)
        stderr = "".join(s for s in self._stderr if s)[-4000:]
        pytest.fail(f"{what}; {' '.join(self.args)} exited with {self.process.returncode}:\n{stderr}")

    def send_line(self, line: str) -> dict:
        """Sends one raw line and returns the parsed answer."""
        if self.process.poll() is not None:
            self._died("the tool is not running")
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        try:
            answer = self._lines.get(timeout=REQUEST_TIMEOUT_S)
        except queue.Empty:
            self.process.kill()
            pytest.fail(f"no answer within {REQUEST_TIMEOUT_S}s to {line[:200]}")
        if answer is None:
            self._died(f"no answer to {line[:200]}")
        return json.loads(answer)

    def request(self, **request) -> dict:
        return self.send_line(json.dumps(request))

    def call(self, **request) -> dict:
        """request() that fails the test on an error answer."""
        answer = self.request(**request)
        if "error" in answer:
            pytest.fail(f"{request['op']} failed: {answer['error']}")
        return answer

    def logits(self, prompts) -> np.ndarray:
        rows = self.call(op="logits", prompts=[list(map(int, p)) for p in prompts])["logits"]
        return np.asarray(rows, dtype=np.float64)

    def greedy(self, prompts, max_tokens=GREEDY_TOKENS, batched=True, stop_at_eos=False):
        return self.call(op="greedy", prompts=[list(map(int, p)) for p in prompts],
                         max_tokens=max_tokens, batched=batched, stop_at_eos=stop_at_eos)["tokens"]

    def tokenize(self, text: str) -> list[int]:
        return self.call(op="tokenize", text=text, add_special=False)["ids"]

    def detokenize(self, ids) -> str:
        return self.call(op="detokenize", ids=list(ids))["text"]

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ---------------------------------------------------------------------------------------------
# Fixtures.

@pytest.fixture(scope="module")
def model_files(tmp_path_factory, model_path) -> dict:
    directory = tmp_path_factory.mktemp("random_models")
    files = {name: pathlib.Path(path) for name, path in random_model.write_all(directory).items()}
    files["smollm2"] = pathlib.Path(model_path)
    return files


@pytest.fixture(scope="module")
def reference(model_files):
    """name -> ref.Model, loaded once per module."""
    cache = {}

    def get(name: str) -> ref.Model:
        if name not in cache:
            cache[name] = ref.load(model_files[name])
        return cache[name]
    return get


@pytest.fixture(scope="module")
def forward_pass(model_files):
    """(name, kv_dtype, num_blocks, activations) -> a running ForwardPassTool, shared within the
    module."""
    tools = {}

    def get(name: str, kv_dtype: str = "f32", num_blocks=None, activations="f32") -> ForwardPassTool:
        key = (name, kv_dtype, num_blocks, activations)
        if key not in tools or tools[key].process.poll() is not None:
            tools[key] = ForwardPassTool(model_files[name], kv_dtype=kv_dtype, num_blocks=num_blocks,
                                    activations=activations)
        return tools[key]
    yield get
    for tool in tools.values():
        tool.close()


def prompts_for(model: ref.Model, name: str) -> list[list[int]]:
    """Several prompts for a model: tokenized text plus (random models) seeded random ids of
    lengths 1 to 130 that cross KV-block boundaries."""
    tokenizer = ref.hf_tokenizer(model)
    prompts = [tokenizer.encode(text).ids for text in TEXT_PROMPTS[:4]]
    prompts.append([int(tokenizer.encode(" the").ids[0])])  # a one-token prompt
    if name != "smollm2":
        rng = np.random.default_rng(2024)
        prompts += [rng.integers(0, model.n_vocab, n).tolist() for n in (16, 17, 130)]
    return prompts


_LAST_LOGITS: dict = {}


def reference_last_logits(model: ref.Model, prompts) -> np.ndarray:
    """Reference logits [len(prompts), vocab] at each prompt's last position (memoized)."""
    rows = []
    for prompt in prompts:
        key = (id(model), tuple(prompt))
        if key not in _LAST_LOGITS:
            _LAST_LOGITS[key] = ref.logits(model, prompt)[-1]
        rows.append(_LAST_LOGITS[key])
    return np.stack(rows)


def decisive_prompts(model: ref.Model, candidates, n_tokens: int, want: int):
    """Up to `want` prompts whose greedy continuation under the reference never has a top-2
    margin below DECISIVE_MARGIN, with those continuations."""
    chosen = []
    for prompt in candidates:
        tokens, margins = ref.greedy(model, prompt, n_tokens, return_margins=True)
        if min(margins) >= DECISIVE_MARGIN:
            chosen.append((prompt, tokens))
            if len(chosen) == want:
                break
    return chosen


def describe(diffs) -> str:
    return ", ".join(f"{d:.2e}" for d in diffs)


# ---------------------------------------------------------------------------------------------
# The reference and the generated models on their own (no C++ involved).

def test_reference_puts_paris_first_after_the_capital_of_france(reference):
    model = reference("smollm2")
    tokenizer = ref.hf_tokenizer(model)
    ids = tokenizer.encode("The capital of France is").ids
    last = ref.logits(model, ids)[-1]
    assert model.tokens[int(np.argmax(last))] == "ĠParis"
    assert ref.top2_margin(last) > 1.0


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_reference_kv_cached_greedy_matches_full_recompute(reference, name):
    model = reference(name)
    rng = np.random.default_rng(5)
    for n in (1, 9, 40):
        prompt = rng.integers(0, model.n_vocab, n).tolist()
        assert ref.greedy(model, prompt, 12) == ref.greedy_recompute(model, prompt, 12)


def test_reference_llama_rope_equals_neox_rope_on_unpermuted_weights(reference):
    """The GGUF converter permutes Q/K rows so that llama's rotated pairs are adjacent; undoing
    that permutation and rotating (i, i + d/2) pairs must give the same model."""
    model = reference("llama_gqa")
    hd = model.head_dim

    def unpermute(w, heads):
        return w.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)

    neox = ref.Model(**{**model.__dict__, "rope_mode": "neox", "layers": [
        ref.Layer(**{**layer.__dict__,
                     "q": ref.Linear(unpermute(layer.q.weight, model.n_head), None, layer.q.ggml_type),
                     "k": ref.Linear(unpermute(layer.k.weight, model.n_head_kv), None, layer.k.ggml_type)})
        for layer in model.layers]})
    prompt = np.random.default_rng(3).integers(0, model.n_vocab, 50).tolist()
    normal_logits = ref.logits(model, prompt)
    np.testing.assert_allclose(ref.logits(neox, prompt), normal_logits, rtol=0, atol=1e-9)
    # And the pairing matters: the same weights under the other mode are a different model.
    wrong = ref.Model(**{**model.__dict__, "rope_mode": "neox"})
    assert np.abs(ref.logits(wrong, prompt) - normal_logits).max() > 1.0


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_random_models_give_different_prompts_different_predictions(reference, name):
    model = reference(name)
    last = reference_last_logits(model, prompts_for(model, name))
    assert np.all(np.isfinite(last))
    assert len(set(np.argmax(last, axis=1).tolist())) >= 4
    assert last.std(axis=1).min() > 1.0  # logits spread, not a flat distribution


def test_random_model_files_are_byte_identical_for_the_same_seed(tmp_path):
    spec = random_model.SPECS["qwen2_mqa"]
    first = random_model.write_model(spec, tmp_path / "a.gguf")
    second = random_model.write_model(spec, tmp_path / "b.gguf")
    assert pathlib.Path(first).read_bytes() == pathlib.Path(second).read_bytes()


def test_llama3_random_model_carries_scaled_rope_frequencies(reference):
    model = reference("llama3_rope")
    plain = 500000.0 ** (-np.arange(0, model.head_dim, 2) / model.head_dim)
    divisors = plain / model.rope_inv_freq
    assert divisors[0] == pytest.approx(1.0) and divisors[-1] == pytest.approx(8.0)
    assert np.any((divisors > 1.01) & (divisors < 7.99))  # the smooth blend region is exercised


# ---------------------------------------------------------------------------------------------
# C++ forward pass against the reference.

@pytest.mark.parametrize("name", ALL_MODELS)
def test_tool_tokenizes_plain_text_like_the_reference_bpe(forward_pass, reference, name):
    model = reference(name)
    tokenizer = ref.hf_tokenizer(model)
    tool = forward_pass(name)
    for text in TEXT_PROMPTS:
        ids = tool.tokenize(text)
        assert ids == tokenizer.encode(text).ids, text
        assert tool.detokenize(ids) == text


@pytest.mark.parametrize("name", ALL_MODELS)
def test_batched_prefill_logits_match_reference_with_f32_kv_cache(forward_pass, reference, name):
    model = reference(name)
    prompts = prompts_for(model, name)
    got = forward_pass(name, "f32").logits(prompts)  # every prompt in one step
    want = reference_last_logits(model, prompts)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    diffs = np.abs(got - want).max(axis=1)
    print(f"{name} f32 KV max|Δlogit| per prompt: {describe(diffs)}")
    assert diffs.max() <= TOL_F32_KV, f"max |Δlogit| per prompt: {describe(diffs)}"
    assert np.argmax(got, axis=1).tolist() == np.argmax(want, axis=1).tolist()


@pytest.mark.parametrize("name", ALL_MODELS)
def test_batched_prefill_logits_match_reference_with_f16_kv_cache(forward_pass, reference, name):
    model = reference(name)
    prompts = prompts_for(model, name)
    got = forward_pass(name, "f16").logits(prompts)
    want = reference_last_logits(model, prompts)
    diffs = np.abs(got - want).max(axis=1)
    print(f"{name} f16 KV max|Δlogit| per prompt: {describe(diffs)}")
    assert diffs.max() <= TOL_F16_KV, f"max |Δlogit| per prompt: {describe(diffs)}"
    margins = np.array([ref.top2_margin(row) for row in want])
    decisive = margins > 2 * TOL_F16_KV
    assert (np.argmax(got, axis=1) == np.argmax(want, axis=1))[decisive].all()


@pytest.mark.parametrize("name", ALL_MODELS)
def test_logits_of_a_prompt_do_not_depend_on_its_batch_companions(forward_pass, reference, name):
    tool = forward_pass(name, "f32")
    prompts = prompts_for(reference(name), name)
    together = tool.logits(prompts)
    alone = np.stack([tool.logits([p])[0] for p in prompts])
    diffs = np.abs(together - alone).max(axis=1)
    assert diffs.max() <= TOL_F32_KV, f"max |Δlogit| per prompt: {describe(diffs)}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_greedy_tokens_match_reference_exactly_with_f32_kv_cache(forward_pass, reference, name):
    model = reference(name)
    candidates = prompts_for(model, name)
    chosen = decisive_prompts(model, candidates, GREEDY_TOKENS, want=2 if name == "smollm2" else 3)
    assert len(chosen) >= 2, "too few prompts whose reference continuation has no near-ties"
    got = forward_pass(name, "f32").greedy([p for p, _ in chosen], batched=True)
    for (prompt, want), tokens in zip(chosen, got):
        assert tokens == want, f"prompt {prompt[:8]}...: first difference at step " \
            f"{next(i for i, (a, b) in enumerate(zip(tokens, want)) if a != b)}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_batched_and_one_at_a_time_greedy_decode_give_identical_tokens(forward_pass, reference, name):
    tool = forward_pass(name, "f16")  # the default KV cache
    prompts = prompts_for(reference(name), name)
    batched = tool.greedy(prompts, batched=True)
    sequential = tool.greedy(prompts, batched=False)
    assert all(len(t) == GREEDY_TOKENS for t in batched)
    assert batched == sequential


@pytest.mark.parametrize("name", ALL_MODELS)
def test_mixed_prefill_and_decode_step_matches_separate_steps(forward_pass, reference, name):
    tool = forward_pass(name, "f32")
    prompts = prompts_for(reference(name), name)
    for a, b in ((prompts[0], prompts[1]), (prompts[2], prompts[4]), (prompts[4], prompts[-1])):
        answer = tool.call(op="mixed_step_check", prompts=[a, b])
        assert answer["max_abs_diff"] <= TOL_F32_KV, answer


# BF16 activations run on Intel AMX-BF16 only (the tool refuses the flag elsewhere).
def cpu_has_amx_bf16() -> bool:
    flags = pathlib.Path("/proc/cpuinfo").read_text().split()
    return "amx_bf16" in flags and "avx512_bf16" in flags


def bf16_runs() -> bool:
    return cpu_has_amx_bf16() and os.environ.get("LOOM_CPU_ISA", "") in ("", "amx")


BF16 = ref.Numerics(bf16=True)
needs_bf16 = pytest.mark.skipif(not bf16_runs(), reason="no AMX-BF16 here (or LOOM_CPU_ISA caps it)")


# ---------------------------------------------------------------------------------------------
# int8 activations (--activations int8: inputs of the INT8/INT4 layers quantized per 32 values,
# integer dot products). A single int8 rounding flip can move a logit by ~1, so against the
# exact reference only loose bounds hold; batch invariance must still be exact (for bf16, below,
# too: its batch-invariance test is this one's second parameter).

@pytest.mark.parametrize("name", ALL_MODELS)
def test_int8_activation_logits_stay_close_to_reference(forward_pass, reference, name):
    model = reference(name)
    prompts = prompts_for(model, name)
    got = forward_pass(name, "f32", activations="int8").logits(prompts)
    exact = forward_pass(name, "f32").logits(prompts)
    want = reference_last_logits(model, prompts)
    tol_max, tol_rms = TOL_INT8[name]
    diffs = np.abs(got - want).max(axis=1)
    rms = float(np.sqrt(np.mean((got - want) ** 2)))
    print(f"{name} int8 activations max|Δlogit| {diffs.max():.4f} (limit {tol_max}), "
          f"RMS {rms:.4f} (limit {tol_rms}); per prompt max {describe(diffs)}")
    assert np.abs(got - exact).max() > 10 * TOL_F32_KV, "int8 activations changed nothing"
    assert diffs.max() <= tol_max, f"max |Δlogit| per prompt: {describe(diffs)} (limit {tol_max})"
    assert rms <= tol_rms, f"RMS Δlogit {rms:.4f} (limit {tol_rms})"
    margins = np.array([ref.top2_margin(row) for row in want])
    decisive = margins > 2 * tol_max
    assert (np.argmax(got, axis=1) == np.argmax(want, axis=1))[decisive].all()


@pytest.mark.parametrize("activations", ["int8", pytest.param("bf16", marks=needs_bf16)])
@pytest.mark.parametrize("name", ALL_MODELS)
def test_quantized_activation_decode_is_batch_invariant(forward_pass, reference, name, activations):
    # bf16 (below) is held to the bits: AMX's sums run in one order whatever the batch.
    tol = 0.0 if activations == "bf16" else TOL_F32_KV
    tool = forward_pass(name, "f16", activations=activations)
    prompts = prompts_for(reference(name), name)
    together = tool.logits(prompts)
    alone = np.stack([tool.logits([p])[0] for p in prompts])
    assert np.abs(together - alone).max() <= tol
    assert tool.greedy(prompts, batched=True) == tool.greedy(prompts, batched=False)
    for a, b in ((prompts[0], prompts[1]), (prompts[2], prompts[4])):
        answer = tool.call(op="mixed_step_check", prompts=[a, b])
        assert answer["max_abs_diff"] <= tol, answer


# ---------------------------------------------------------------------------------------------
# BF16 activations (--activations bf16: every matmul's input and weight rounded to bfloat16, AMX
# tiles). Against the reference run with the same rounding (Numerics.bf16) the logits differ by
# the roundings that land on the other side of a bfloat16 step (the inputs differ by float32
# rounding) and by float32 sums; batch invariance must be exact (above). Where the CPU has no
# AMX-BF16 (or LOOM_CPU_ISA caps it) the tool refuses the flag, which the last test checks.

@needs_bf16
@pytest.mark.parametrize("name", ALL_MODELS)
def test_bf16_activation_logits_follow_the_bf16_reference(forward_pass, reference, name):
    model = reference(name)
    prompts = prompts_for(model, name)
    got = forward_pass(name, "f32", activations="bf16").logits(prompts)
    exact = forward_pass(name, "f32").logits(prompts)
    want_exact = reference_last_logits(model, prompts)
    if name in BF16_HELD_TO_EXACT:
        want = want_exact
        tol_max, tol_rms = BF16_HELD_TO_EXACT[name]
    else:
        want = np.stack([ref.logits(model, p, BF16)[-1] for p in prompts])
        tol_max, tol_rms = TOL_BF16[name]
    diffs = np.abs(got - want).max(axis=1)
    rms = float(np.sqrt(np.mean((got - want) ** 2)))
    rms_exact = float(np.sqrt(np.mean((got - want_exact) ** 2)))
    print(f"{name} bf16 activations vs bf16 reference max|Δlogit| {diffs.max():.4f} "
          f"(limit {tol_max}), RMS {rms:.4f} (limit {tol_rms}); vs exact reference max "
          f"{np.abs(got - want_exact).max():.4f} RMS {rms_exact:.4f}")
    assert np.abs(got - exact).max() > 10 * TOL_F32_KV, "bf16 activations changed nothing"
    assert diffs.max() <= tol_max, f"max |Δlogit| per prompt: {describe(diffs)} (limit {tol_max})"
    assert rms <= tol_rms, f"RMS Δlogit {rms:.4f} (limit {tol_rms})"


def test_bf16_activations_are_refused_with_the_reason_without_amx(model_files):
    args = [str(tool_path("forward_pass_tool")), "--model", str(model_files["smollm2"]),
            "--activations", "bf16"]
    done = subprocess.run(args, input="", capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LOOM_CPU_ISA": "avx2"})
    assert done.returncode != 0
    # The reason: the forced ISA where the CPU has AMX-BF16, the CPU itself elsewhere.
    reason = "LOOM_CPU_ISA=avx2" if cpu_has_amx_bf16() else "AMX-BF16"
    assert "--activations bf16" in done.stderr and reason in done.stderr, done.stderr


def test_smollm2_continues_the_capital_of_france_with_paris(forward_pass):
    tool = forward_pass("smollm2", "f16")
    ids = tool.tokenize("The capital of France is")
    [tokens] = tool.greedy([ids], max_tokens=8)
    assert "Paris" in tool.detokenize(tokens)


@pytest.mark.parametrize("question, expected", [
    ("What is the capital of France?", "Paris"),
    ("What is 2+2?", "4"),
])
def test_smollm2_answers_chat_questions(forward_pass, reference, question, expected):
    model = reference("smollm2")
    text = jinja2.Template(model.chat_template).render(
        messages=[{"role": "user", "content": question}], add_generation_prompt=True)
    tool = forward_pass("smollm2", "f16")
    ids = tool.tokenize(text)
    assert model.tokens.index("<|im_start|>") in ids  # the template's markers became special tokens
    [tokens] = tool.greedy([ids], max_tokens=40, stop_at_eos=True)
    answer = tool.detokenize(tokens)
    assert expected in answer, answer
    assert len(tokens) < 40 and model.tokens[tokens[-1]] == "<|im_end|>", answer


# ---------------------------------------------------------------------------------------------
# Bad input: an error answer, and the process keeps serving unchanged results.

BAD_INPUT_BLOCKS = 32


@pytest.fixture(scope="module")
def bad_input_tool(forward_pass, reference):
    model = reference("llama_gqa")
    tool = forward_pass("llama_gqa", "f32", num_blocks=BAD_INPUT_BLOCKS)
    probe = [[5, 77, 300, 12]]
    return tool, model, probe, tool.logits(probe)


def assert_rejected_and_still_serving(bad_input_tool, answer):
    tool, _, probe, baseline = bad_input_tool
    assert set(answer) == {"error"} and answer["error"], answer
    np.testing.assert_array_equal(tool.logits(probe), baseline)


@pytest.mark.parametrize("bad_id", ["vocab", -1])
def test_token_id_outside_the_vocabulary_is_rejected(bad_input_tool, bad_id):
    tool, model, _, _ = bad_input_tool
    token = model.n_vocab if bad_id == "vocab" else bad_id
    answer = tool.request(op="logits", prompts=[[1, 2, 3], [4, token, 6]])
    assert_rejected_and_still_serving(bad_input_tool, answer)
    answer = tool.request(op="greedy", prompts=[[token]], max_tokens=2, batched=True)
    assert_rejected_and_still_serving(bad_input_tool, answer)


def test_prompt_longer_than_the_context_is_rejected(bad_input_tool):
    tool, model, _, _ = bad_input_tool
    too_long = (np.arange(model.n_ctx + 1) % 200).tolist()
    assert_rejected_and_still_serving(bad_input_tool, tool.request(op="logits", prompts=[too_long]))


def test_empty_prompt_is_rejected(bad_input_tool):
    tool, _, _, _ = bad_input_tool
    assert_rejected_and_still_serving(bad_input_tool, tool.request(op="logits", prompts=[[]]))


@pytest.mark.parametrize("block_id", [BAD_INPUT_BLOCKS, 1 << 30, -1])
def test_block_id_outside_the_pool_is_rejected(bad_input_tool, block_id):
    tool, _, _, _ = bad_input_tool
    answer = tool.request(op="raw_step", tokens=[1, 2], positions=[0, 1], block_ids=[block_id])
    assert_rejected_and_still_serving(bad_input_tool, answer)


def test_position_past_the_context_length_is_rejected(bad_input_tool):
    tool, model, _, _ = bad_input_tool
    blocks = list(range(model.n_ctx // 16 + 1))
    answer = tool.request(op="raw_step", tokens=[1], positions=[model.n_ctx], block_ids=blocks)
    assert_rejected_and_still_serving(bad_input_tool, answer)


def test_malformed_request_line_is_rejected(bad_input_tool):
    tool, _, _, _ = bad_input_tool
    assert_rejected_and_still_serving(bad_input_tool, tool.send_line("{not json"))
    assert_rejected_and_still_serving(bad_input_tool, tool.request(op="logits"))
