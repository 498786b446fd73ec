"""Independent numpy reference of the Llama-family forward pass, read straight from a GGUF file.

Written from the model definition (llama.cpp's graph for GGUF files), not from Loom's code, so
the C++ forward pass can be checked against it. Numerics: every weight is dequantized once with
`gguf.quants.dequantize` and kept in float32; every matmul, norm, softmax and residual add runs in
float64 (weights are upcast per product), so the reference's own rounding error (~1e-12 relative)
is negligible next to any float32 / float16 / int8 implementation it is compared against.

Supported: architectures `llama` (RoPE "normal" mode: the GGUF converter permuted Q/K rows so
the rotated pairs are adjacent, (2i, 2i+1)) and `qwen2` (RoPE "neox" mode: pairs (i, i + n_rot/2),
Q/K/V biases); GQA/MQA with any ratio; partial rotary (`rope.dimension_count` < head_dim);
`rope.scaling.type` none, linear (positions divided by the factor) or yarn (`yarn_parameters`:
the YaRN paper's ramp between interpolated and extrapolated frequencies and its attention
factor on cos/sin, with transformers' `rope_scaling` defaults; `with_hf_rope_scaling` applies a
config.json `rope_scaling` to a loaded model); llama3-style per-frequency divisors from the
`rope_freqs.weight` tensor; tied output (`output.weight` absent); mixtures of experts (Mixtral
as `llama` with `expert_count`, `qwen3moe`: softmax router, top-k, renormalized unless
`expert_weights_norm` is false; stacked `*_exps` or per-expert tensors); `gemma3` (embeddings
scaled by sqrt(n_embd), GELU-tanh gate, post-attention and post-FFN norms, QK-norm, every 6th layer
global, local layers' RoPE base 10,000 unscaled; norm weights as the GGUF stores them, 1 + w);
`smollm3` (llama's layout, every 4th layer without RoPE, or the layers `loom.rope.layers` lists);
`granite` (llama's layout with embedding, attention, residual and logit multipliers;
`granitemoe` the same over experts, renormalized, and an ungated shared expert); `glm4` (norms
before and after each sub-layer, fused gate/up, Q/K/V biases, half of each head rotating in
interleaved pairs); `gpt-oss` (biases on Q/K/V, the attention output, the router and every expert
matrix, a sink logit per query head in each attention softmax (transformers' GptOssAttention),
the router's top-k softmaxed (equal to a renormalized softmax), OpenAI's clamped SwiGLU in the
experts, even layers local, YaRN; post_attention_norm is its FFN norm); `qwen2moe` (qwen2's
attention, routed experts not renormalized unless `expert_weights_norm` says so, and a shared
SwiGLU expert `ffn_*_shexp` for every token, scaled by sigmoid(ffn_gate_inp_shexp · x) and added
to the routed sum: llama.cpp's and transformers' Qwen2MoeSparseMoeBlock); `glm4moe` (GLM-4.5 /
GLM-4.5-Air, transformers' Glm4MoeForCausalLM: Q/K/V biases, QK-norm, partial NeoX rotary,
post_attention_norm as the FFN norm; the first `leading_dense_block_count` layers dense, the
others a sigmoid router (`expert_gating_func` 2) choosing the top-k by score + the layer's
`exp_probs_b.bias`, weighted by the unbiased scores renormalized (`expert_weights_norm`) and
times `expert_weights_scale`, plus an ungated shared expert; `block_count` includes the
`nextn_predict_layers` multi-token-prediction blocks at the end, which are not run); `olmo2`
(OLMo 2 and 3, transformers' Olmo2/Olmo3ForCausalLM: no norm before attention or the FFN, each
sub-layer's output RMS-normalized before it joins the residual stream, a QK-norm over all heads
of q (and of k) at once; with a sliding window every 4th layer global, llama.cpp's rule);
`olmoe` (transformers' OlmoeForCausalLM: llama's norms, the all-heads QK-norm, routed experts
not renormalized unless `expert_weights_norm` says so); `ernie4_5` (ERNIE 4.5 dense: llama's layout
rotating interleaved pairs); `ernie4_5-moe` (the same attention, `leading_dense_block_count`
dense layers, then softmax probabilities chosen with `exp_probs_b.bias`, renormalized, beside
ungated shared experts); `exaone4` (EXAONE 4.0: OLMo 2's norms with a per-head QK-norm; with a
window every 4th layer global and only the local layers rotating); `deepseek2` (DeepSeek-V2/V3,
transformers' DeepseekV2Attention: multi-head latent attention, keys and values decompressed per
head from a normalized latent (`attn_kv_b`, or llama.cpp's `attn_k_b` / `attn_v_b`), the last
`rope.dimension_count` dims of each head rotating in interleaved pairs, the key's shared by every
head, queries from x or through a normalized latent; YaRN scaling the softmax by
(1 + yarn_log_multiplier ln(factor))^2 instead of cos and sin; experts as ernie4_5-moe's, not
renormalized unless the file says).
Other scaling types raise
NotImplementedError rather than give silently wrong logits.

Optional `Numerics` emulate what a fast forward pass does (float32 arithmetic, float16 KV cache, int8
activations in front of quantized weights) so tests can measure how far such shortcuts move the
logits; they are for calibrating tolerances, not a bit-exact model of any forward pass (a single int8
rounding flip can move SmolLM2's logits by ~1).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import numpy as np
import gguf
from gguf import GGMLQuantizationType

SUPPORTED_ARCHS = {"llama": "normal", "mistral": "normal", "qwen2": "neox", "qwen3": "neox",
                   "qwen3moe": "neox", "gemma2": "neox", "gemma3": "neox", "phi3": "neox",
                   "smollm3": "normal", "granite": "normal", "glm4": "normal", "gemma": "neox",
                   "gpt-oss": "neox", "qwen2moe": "neox", "glm4moe": "neox",
                   "olmo2": "neox", "olmoe": "neox", "ernie4_5": "normal",
                   "ernie4_5-moe": "normal", "exaone4": "neox", "granitemoe": "normal",
                   "deepseek2": "normal"}
# gpt-oss (transformers' GptOssExperts, llama.cpp's swiglu_oai): the clamped SwiGLU's limit when
# the file does not say (loom.swiglu_limit), its sigmoid's alpha, and the local layers' period.
GPT_OSS_SWIGLU_LIMIT = 7.0
GPT_OSS_SWIGLU_ALPHA = 1.702
# SmolLM3 (llama.cpp's and transformers' definition): every 4th layer applies no RoPE, unless
# the file lists the layers that do (loom.rope.layers, from config.json's no_rope_layers).
SMOLLM3_NO_ROPE_PERIOD = 4
# Gemma 3 (llama.cpp's and transformers' definition): every 6th layer global, local layers'
# RoPE base 10,000 without scaling, queries scaled by query_pre_attn_scalar^-1/2 (the head dim;
# hidden / heads for the 62-layer 27B model, whose GGUF says neither).
GEMMA3_SLIDING_PERIOD = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
# Weight types whose matmuls a fast forward pass may feed int8-quantized activations.
INTEGER_WEIGHT_TYPES = {
    GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q3_K, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.MXFP4,
}
# Their int8 activations are llama.cpp's Q8_K: one float scale per 256 values.
K_QUANT_TYPES = {
    GGMLQuantizationType.Q2_K, GGMLQuantizationType.Q3_K, GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K,
}


@dataclasses.dataclass
class Linear:
    """One projection: y = x @ weight.T (+ bias)."""
    weight: np.ndarray  # [out_features, in_features] float32
    bias: Optional[np.ndarray]  # [out_features] float32 or None
    ggml_type: GGMLQuantizationType  # storage type in the file


@dataclasses.dataclass
class Layer:
    attn_norm: Optional[np.ndarray]  # [n_embd]; None without pre-norms (OLMo 2)
    q: Linear  # [n_head * head_dim, n_embd]
    k: Linear  # [n_head_kv * head_dim, n_embd]
    v: Linear  # [n_head_kv * head_dim, n_embd]
    o: Linear  # [n_embd, n_head * head_dim]
    ffn_norm: Optional[np.ndarray]  # [n_embd]; None as attn_norm
    gate: Optional[Linear]  # [n_ff, n_embd]; None in a mixture of experts
    up: Optional[Linear]  # [n_ff, n_embd]
    down: Optional[Linear]  # [n_embd, n_ff]
    # RMSNorm of q and k before RoPE: [head_dim] per head (qwen3), or over all heads at once
    # ([n_head * head_dim] and [n_head_kv * head_dim]: OLMo's).
    q_norm: Optional[np.ndarray] = None
    k_norm: Optional[np.ndarray] = None
    # Mixture of experts (gate/up/down then unused): the router [n_expert, n_embd] and each
    # expert's (gate, up, down).
    router: Optional[Linear] = None
    experts: Optional[list] = None
    # Gemma's sandwich norms: RMSNorm of the attention output and of the FFN output before
    # each joins the residual stream.
    post_attn_norm: Optional[np.ndarray] = None
    post_ffw_norm: Optional[np.ndarray] = None
    # gpt-oss: a logit per query head that joins each attention softmax's denominator.
    sinks: Optional[np.ndarray] = None
    # Qwen2-MoE: the shared expert's (gate, up, down), and its sigmoid gate [1, n_embd] (None:
    # ungated, GLM-4.5's).
    shared: Optional[tuple] = None
    shared_gate: Optional[Linear] = None
    # GLM-4.5: a bias per expert added to the router's scores to choose the top-k (not to weigh
    # them): llama.cpp's exp_probs_b, transformers' e_score_correction_bias.
    selection_bias: Optional[np.ndarray] = None
    # DeepSeek-V2's multi-head latent attention (q, k, v then unused but q without q_a): the
    # query latent and its norm (or None: q from x), the key-value latent with the shared
    # RoPE key part (kv_a) and the latent's norm, and each head's decompression of the latent
    # into its key's no-RoPE part k_b [heads, nope, latent] and its value v_b [heads, value,
    # latent].
    q_a: Optional[Linear] = None
    q_a_norm: Optional[np.ndarray] = None
    kv_a: Optional[Linear] = None
    kv_a_norm: Optional[np.ndarray] = None
    k_b: Optional[np.ndarray] = None
    v_b: Optional[np.ndarray] = None


@dataclasses.dataclass
class Model:
    arch: str
    n_vocab: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int  # leading dims of each head that RoPE rotates
    n_ff: int
    n_ctx: int  # trained context length
    rms_eps: float
    rope_mode: str  # "normal" (pairs 2i, 2i+1) or "neox" (pairs i, i + n_rot/2)
    rope_inv_freq: np.ndarray  # [n_rot/2] float64, already divided by rope_freqs if present
    rope_position_scale: float  # positions are multiplied by this (1 / linear factor)
    token_embd: np.ndarray  # [n_vocab, n_embd] float32
    token_embd_type: GGMLQuantizationType
    layers: list[Layer]
    output_norm: np.ndarray  # [n_embd]
    output: Linear  # [n_vocab, n_embd]; token_embd when tied
    tied_output: bool
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: Optional[int]
    eos_id: Optional[int]
    chat_template: Optional[str]
    rope_attention_factor: float = 1.0  # multiplies cos and sin (YaRN's attention scaling)
    rope_base: float = 10000.0
    # Sliding-window attention: a local layer's query sees its last sliding_window positions.
    sliding_window: int = 0
    sliding_layers: tuple = ()  # bool per layer
    # Mixture of experts: experts per token and whether their weights are renormalized; the
    # router's scores ("softmax" or GLM-4.5's "sigmoid") and a factor on the routed weights
    # (after any renormalization: GLM-4.5's routed_scaling_factor).
    n_expert_used: int = 0
    expert_norm: bool = True
    expert_gating: str = "softmax"
    expert_weights_scale: float = 1.0
    # Gemma: embeddings times sqrt(n_embd), a GELU (tanh) gate, the query scale, and the RoPE of
    # local layers (inverse frequencies without scaling).
    embedding_scale: float = 1.0
    # Gemma 2's soft-capping of attention scores and final logits (0: none).
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    activation: str = "silu"
    attention_scale: Optional[float] = None  # None: 1 / sqrt(head_dim)
    local_rope_inv_freq: Optional[np.ndarray] = None
    rope_layers: tuple = ()  # bool per layer: whether it applies RoPE (empty: every layer)
    # Granite: each sub-layer's output times residual_scale before the residual add, the logits
    # divided by logit_scale (its embedding and attention multipliers are the fields above).
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    # gpt-oss: the experts' clamped SwiGLU limit (0: SiLU(gate) * up).
    swiglu_limit: float = 0.0
    # Multi-head latent attention: a value's width (0: standard attention); a head's key is
    # [head_dim - n_rot no-RoPE dims, n_rot RoPE dims] and so is its query.
    mla_value_dim: int = 0
    # DeepSeek's grouped routing (<arch>.expert_group_count / expert_group_used_count; 1: none).
    expert_groups: int = 1
    expert_groups_used: int = 1


@dataclasses.dataclass(frozen=True)
class Numerics:
    """Shortcuts a fast runner may take; the defaults are the exact (float64) model."""
    kv_f16: bool = False  # round cached K and V to float16
    int8_activations: bool = False  # quantize matmul inputs to int8 for integer-typed weights
    int8_block: int = 32  # values sharing one int8 scale (ggml's q8_0: 32); 0 = one scale per row
    float32: bool = False  # run every operation in float32 instead of float64
    bf16: bool = False  # round every matmul's input and (dequantized) weight, and an F16/F32 embedding table, to bfloat16


EXACT = Numerics()


def _field(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _dequantize(tensor) -> np.ndarray:
    """A GGUF tensor as float32 with numpy shape (ne[n-1], ..., ne[0]), i.e. (rows, cols)."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return np.asarray(values, dtype=np.float32).reshape(shape)


def load(path: str | os.PathLike, run_nextn: bool = False) -> Model:
    """Reads and dequantizes a llama-family GGUF file. With run_nextn, GLM-4.5's
    multi-token-prediction blocks are run as ordinary layers after the others (not the model:
    for tests that show skipping them matters)."""
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise NotImplementedError(f"architecture {arch!r} is not supported (have {sorted(SUPPORTED_ARCHS)})")
    tensors = {t.name: t for t in reader.tensors}

    def weight(name: str) -> np.ndarray:
        return _dequantize(tensors[name])

    def linear(prefix: str) -> Linear:
        if prefix not in linear_parts and prefix + ".weight" not in tensors:
            _split_fused(prefix)
        if prefix in linear_parts:
            return linear_parts[prefix]
        bias = weight(prefix + ".bias") if prefix + ".bias" in tensors else None
        return Linear(weight(prefix + ".weight"), bias, tensors[prefix + ".weight"].tensor_type)

    # Phi-3's fused tensors, split into the parts the graph uses: attn_qkv into Q, K, V rows and
    # ffn_up (without ffn_gate) into gate rows, then up rows.
    linear_parts: dict = {}

    def _split_fused(prefix: str) -> None:
        block, role = prefix.rsplit(".", 1)
        if role in ("attn_q", "attn_k", "attn_v") and block + ".attn_qkv.weight" in tensors:
            fused = tensors[block + ".attn_qkv.weight"]
            values = _dequantize(fused)
            q_rows = n_head * head_dim
            kv_rows = n_head_kv * head_dim
            for name, rows in (("attn_q", slice(0, q_rows)), ("attn_k", slice(q_rows, q_rows + kv_rows)),
                               ("attn_v", slice(q_rows + kv_rows, q_rows + 2 * kv_rows))):
                linear_parts[f"{block}.{name}"] = Linear(values[rows], None, fused.tensor_type)
        elif role in ("ffn_gate", "ffn_up") and block + ".ffn_gate.weight" not in tensors:
            fused = tensors[block + ".ffn_up.weight"]
            values = _dequantize(fused)
            half = values.shape[0] // 2
            linear_parts[block + ".ffn_gate"] = Linear(values[:half], None, fused.tensor_type)
            linear_parts[block + ".ffn_up"] = Linear(values[half:], None, fused.tensor_type)

    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    # GLM-4.5's block_count includes its multi-token-prediction (nextn) blocks, which come
    # last and which next-token inference does not run (llama.cpp skips them too).
    n_layer = int(_field(reader, f"{arch}.block_count"))
    if not run_nextn:
        n_layer -= int(_field(reader, f"{arch}.nextn_predict_layers", 0) or 0)
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_head_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head))
    mla = arch == "deepseek2"
    mla_value_dim = 0
    if mla:
        # Files for llama.cpp's absorbed MLA give the decompressed widths as *_mla (and one KV
        # head); a decompressed head each either way.
        head_dim = int(_field(reader, f"{arch}.attention.key_length_mla", head_dim))
        mla_value_dim = int(_field(reader, f"{arch}.attention.value_length_mla",
                                   _field(reader, f"{arch}.attention.value_length")))
        n_head_kv = n_head
    n_rot = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if n_head % n_head_kv != 0:
        raise ValueError(f"head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")

    scaling_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    scaling_factor = float(_field(reader, f"{arch}.rope.scaling.factor", 1.0) or 1.0)
    base = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    attention_factor = 1.0
    if scaling_type == "linear":
        position_scale = 1.0 / scaling_factor
    elif scaling_type == "none" or (scaling_type is None):
        position_scale = 1.0
    elif scaling_type == "yarn":
        position_scale = 1.0
        yarn = {"factor": scaling_factor,
                "original_max_position_embeddings": _field(reader, f"{arch}.rope.scaling.original_context_length"),
                "beta_fast": _field(reader, f"{arch}.rope.scaling.yarn_beta_fast"),
                "beta_slow": _field(reader, f"{arch}.rope.scaling.yarn_beta_slow"),
                "attention_factor": _field(reader, "loom.rope.scaling.attention_factor"),
                "truncate": _field(reader, "loom.rope.scaling.yarn_truncate", True)}
        yarn_inv_freq, attention_factor = yarn_parameters(
            base, n_rot, yarn, int(_field(reader, f"{arch}.context_length", 0)))
    else:
        raise NotImplementedError(f"rope.scaling.type {scaling_type!r} is not supported")
    # llama.cpp: theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factors[i].
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if scaling_type == "yarn":
        inv_freq = yarn_inv_freq
    factors_name = "rope_freqs.weight"
    if "rope_factors_long.weight" in tensors:
        # Phi-3's longrope: the long factors when the context exceeds the original one (llama.cpp's
        # choice), cos and sin scaled by sqrt(1 + ln(s) / ln(original)) unless the file says.
        original = int(_field(reader, f"{arch}.rope.scaling.original_context_length"))
        stretch = int(_field(reader, f"{arch}.context_length")) / original
        factors_name = "rope_factors_long.weight" if stretch > 1 else "rope_factors_short.weight"
        attention_factor = _field(reader, f"{arch}.rope.scaling.attn_factor",
                                  np.sqrt(1 + np.log(stretch) / np.log(original)) if stretch > 1 else 1.0)
    if factors_name in tensors:
        freq_factors = weight(factors_name).astype(np.float64).reshape(-1)
        if freq_factors.shape != inv_freq.shape:
            raise ValueError(f"rope_freqs has {freq_factors.shape[0]} entries, expected {inv_freq.shape[0]}")
        inv_freq = inv_freq / freq_factors

    attention_scale = None
    if mla and scaling_type == "yarn":
        # DeepSeek's YaRN (llama.cpp's deepseek2 graph, transformers' mscale_all_dim): the
        # softmax scale times m^2, m = 1 + yarn_log_multiplier ln(factor); cos and sin unscaled.
        m = 1.0 + float(_field(reader, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0)) * np.log(scaling_factor)
        attention_scale = m * m / np.sqrt(head_dim)
        attention_factor = 1.0

    n_expert = int(_field(reader, f"{arch}.expert_count", 0) or 0)

    def optional(name: str) -> Optional[np.ndarray]:
        return weight(name) if name in tensors else None

    def experts(p: str) -> list:
        """Each expert's (gate, up, down): stacked 3-D tensors or one tensor per expert."""
        if p + ".ffn_gate_exps.weight" in tensors:
            roles = ("ffn_gate", "ffn_up", "ffn_down")
            stacks = [(weight(f"{p}.{role}_exps.weight"), tensors[f"{p}.{role}_exps.weight"].tensor_type,
                       optional(f"{p}.{role}_exps.bias")) for role in roles]
            return [tuple(Linear(values[e], None if bias is None else bias[e], kind)
                          for values, kind, bias in stacks) for e in range(n_expert)]
        return [tuple(linear(f"{p}.{role}.{e}") for role in ("ffn_gate", "ffn_up", "ffn_down"))
                for e in range(n_expert)]

    def shared_expert(p: str) -> tuple:
        """The shared expert's (gate, up, down) and sigmoid gate, or Nones."""
        if p + ".ffn_up_shexp.weight" not in tensors:
            return None, None
        experts = tuple(linear(f"{p}.{role}_shexp") for role in ("ffn_gate", "ffn_up", "ffn_down"))
        gate = optional(p + ".ffn_gate_inp_shexp.weight")
        # [n_embd] as llama.cpp declares it or [1, n_embd]; Loom keeps it in float32.
        return experts, (None if gate is None else
                         Linear(gate.reshape(1, -1), None, GGMLQuantizationType.F32))

    layers = []
    gpt_oss = arch == "gpt-oss"
    # gpt-oss and GLM-4.5 name their FFN norm post_attention_norm (llama.cpp's attn_post_norm).
    post_attention_ffn_norm = arch in ("gpt-oss", "glm4moe")
    # GLM-4.5: the first leading_dense_block_count layers are dense FFNs.
    leading_dense = int(_field(reader, f"{arch}.leading_dense_block_count", 0) or 0)
    for i in range(n_layer):
        p = f"blk.{i}"
        moe = n_expert > 0 and i >= leading_dense
        layers.append(Layer(
            attn_norm=optional(p + ".attn_norm.weight"),
            q=None if mla else linear(p + ".attn_q"), k=None if mla else linear(p + ".attn_k"),
            v=None if mla else linear(p + ".attn_v"),
            o=linear(p + ".attn_output"),
            ffn_norm=optional(p + (".post_attention_norm.weight" if post_attention_ffn_norm
                                   else ".ffn_norm.weight")),
            gate=None if moe else linear(p + ".ffn_gate"), up=None if moe else linear(p + ".ffn_up"),
            down=None if moe else linear(p + ".ffn_down"),
            q_norm=weight(p + ".attn_q_norm.weight") if p + ".attn_q_norm.weight" in tensors else None,
            k_norm=weight(p + ".attn_k_norm.weight") if p + ".attn_k_norm.weight" in tensors else None,
            router=linear(p + ".ffn_gate_inp") if moe else None,
            experts=experts(p) if moe else None,
            post_attn_norm=None if post_attention_ffn_norm else optional(p + ".post_attention_norm.weight"),
            post_ffw_norm=optional(p + ".post_ffw_norm.weight"),
            sinks=optional(p + ".attn_sinks.weight"),
            selection_bias=optional(p + ".exp_probs_b.bias") if moe else None))
        layers[-1].shared, layers[-1].shared_gate = shared_expert(p)
        if mla:
            _load_latent_attention(layers[-1], p, tensors, weight, linear, n_head, head_dim - n_rot,
                                   mla_value_dim)

    token_embd = weight("token_embd.weight")
    tied = "output.weight" not in tensors
    output = (Linear(token_embd, None, tensors["token_embd.weight"].tensor_type) if tied
              else linear("output"))
    tokens = _field(reader, "tokenizer.ggml.tokens", []) or []
    return Model(
        arch=arch, n_vocab=token_embd.shape[0], n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_rot=n_rot,
        n_ff=(next(layer.experts[0][0] for layer in layers if layer.experts) if n_expert
              else layers[0].gate).weight.shape[0] if layers else 0,
        n_ctx=int(_field(reader, f"{arch}.context_length", 0)),
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_mode=SUPPORTED_ARCHS[arch], rope_inv_freq=inv_freq, rope_position_scale=position_scale,
        token_embd=token_embd, token_embd_type=tensors["token_embd.weight"].tensor_type,
        layers=layers, output_norm=weight("output_norm.weight"), output=output, tied_output=tied,
        tokens=tokens, token_types=_field(reader, "tokenizer.ggml.token_type", []) or [],
        merges=_field(reader, "tokenizer.ggml.merges", []) or [],
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        chat_template=_field(reader, "tokenizer.chat_template"),
        rope_attention_factor=attention_factor, rope_base=base,
        sliding_window=int(_field(reader, f"{arch}.attention.sliding_window", 0) or 0),
        sliding_layers=_sliding_layers(reader, arch, n_layer),
        rope_layers=_rope_layers(reader, arch, n_layer,
                                 _sliding_layers(reader, arch, n_layer)
                                 if _field(reader, f"{arch}.attention.sliding_window") else None),
        n_expert_used=int(_field(reader, f"{arch}.expert_used_count", 0) or 0),
        expert_norm=bool(_field(reader, f"{arch}.expert_weights_norm",
                                arch not in ("qwen2moe", "olmoe", "deepseek2"))),
        expert_gating=_expert_gating(reader, arch),
        expert_weights_scale=float(_field(reader, f"{arch}.expert_weights_scale", 0.0) or 1.0),
        attn_softcap=float(_field(reader, f"{arch}.attn_logit_softcapping", 0.0) or 0.0),
        final_softcap=float(_field(reader, f"{arch}.final_logit_softcapping", 0.0) or 0.0),
        swiglu_limit=float(_field(reader, "loom.swiglu_limit", GPT_OSS_SWIGLU_LIMIT if gpt_oss else 0.0)),
        mla_value_dim=mla_value_dim,
        expert_groups=int(_field(reader, f"{arch}.expert_group_count", 1) or 1),
        expert_groups_used=int(_field(reader, f"{arch}.expert_group_used_count", 1) or 1),
        **({"attention_scale": attention_scale} if attention_scale is not None else {}),
        **(_gemma(arch, n_embd, n_head, head_dim, n_layer, n_rot)
           if arch in ("gemma", "gemma2", "gemma3") else {}),
        **_multipliers(reader, arch))


def _load_latent_attention(layer: Layer, p: str, tensors: dict, weight, linear, n_head: int,
                           nope: int, value_dim: int) -> None:
    """DeepSeek-V2's attention tensors (llama.cpp's names): attn_q, or attn_q_a, attn_q_a_norm and
    attn_q_b; attn_kv_a_mqa and attn_kv_a_norm; attn_kv_b (per head: nope key rows, then value_dim
    value rows), or attn_k_b [heads, latent, nope] and attn_v_b [heads, value_dim, latent]."""
    if p + ".attn_q_a.weight" in tensors:
        layer.q_a = linear(p + ".attn_q_a")
        layer.q_a_norm = weight(p + ".attn_q_a_norm.weight")
        layer.q = linear(p + ".attn_q_b")
    else:
        layer.q = linear(p + ".attn_q")
    layer.kv_a = linear(p + ".attn_kv_a_mqa")
    layer.kv_a_norm = weight(p + ".attn_kv_a_norm.weight")
    latent = layer.kv_a_norm.shape[0]
    if p + ".attn_kv_b.weight" in tensors:
        kv_b = weight(p + ".attn_kv_b.weight").reshape(n_head, nope + value_dim, latent)
        layer.k_b, layer.v_b = kv_b[:, :nope], kv_b[:, nope:]
    else:
        layer.k_b = weight(p + ".attn_k_b.weight").reshape(n_head, latent, nope).transpose(0, 2, 1)
        layer.v_b = weight(p + ".attn_v_b.weight").reshape(n_head, value_dim, latent)


def _latent_attention_qkv(model: Model, layer: Layer, h: np.ndarray, positions: np.ndarray,
                          numerics: Numerics) -> tuple:
    """Multi-head latent attention's query, key and value heads ([n, heads, head_dim] twice,
    [n, heads, value_dim]) for the normed hidden states h, RoPE applied (DeepSeek-V2's
    attention: transformers' DeepseekV2Attention, llama.cpp's deepseek2 graph)."""
    n, heads, nope = h.shape[0], model.n_head, model.head_dim - model.n_rot
    cq = h if layer.q_a is None else _rms_norm(_linear(h, layer.q_a, numerics), layer.q_a_norm, model.rms_eps)
    q = _linear(cq, layer.q, numerics).reshape(n, heads, model.head_dim)
    kv_a = _linear(h, layer.kv_a, numerics)
    latent = layer.kv_a_norm.shape[0]
    c = _rms_norm(kv_a[:, :latent], layer.kv_a_norm, model.rms_eps)
    k_nope = np.einsum("nc,hjc->nhj", c, layer.k_b.astype(c.dtype))
    v = np.einsum("nc,hjc->nhj", c, layer.v_b.astype(c.dtype))
    q_pe = rope(model, q[..., nope:], positions)
    k_pe = rope(model, kv_a[:, None, latent:], positions)
    q = np.concatenate([q[..., :nope], q_pe], axis=-1)
    k = np.concatenate([k_nope, np.repeat(k_pe, heads, axis=1)], axis=-1)
    return q, k, v


def _expert_gating(reader: gguf.GGUFReader, arch: str) -> str:
    """The router's scores: <arch>.expert_gating_func (llama.cpp's enum: 1 softmax, 2 sigmoid),
    else sigmoid for glm4moe and softmax for the others."""
    kind = _field(reader, f"{arch}.expert_gating_func")
    if kind is None:
        return "sigmoid" if arch == "glm4moe" else "softmax"
    names = {1: "softmax", 2: "sigmoid"}
    if int(kind) not in names:
        raise NotImplementedError(f"{arch}.expert_gating_func {int(kind)}")
    return names[int(kind)]


def _multipliers(reader: gguf.GGUFReader, arch: str) -> dict:
    """Granite's multipliers (llama.cpp's keys; absent or 0 means none)."""
    keys = {"embedding_scale": "embedding_scale", "residual_scale": "residual_scale",
            "attention_scale": "attention.scale", "logit_scale": "logit_scale"}
    values = {name: float(_field(reader, f"{arch}.{key}", 0.0) or 0.0) for name, key in keys.items()}
    return {name: value for name, value in values.items() if value}


def _gemma(arch: str, n_embd: int, n_head: int, head_dim: int, n_layer: int, n_rot: int) -> dict:
    """Gemma 1, 2 and 3: scaled embeddings, GELU, the query scale (llama.cpp's rule: the head dim,
    hidden / heads for the 27B models), Gemma 3's local RoPE base."""
    large = (arch, n_layer) in (("gemma3", 62), ("gemma2", 46))
    query_pre_attn_scalar = n_embd // n_head if large else head_dim
    extra = {}
    if arch == "gemma3":
        extra["local_rope_inv_freq"] = GEMMA3_LOCAL_ROPE_BASE ** (
            -np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    return {"embedding_scale": float(np.sqrt(n_embd)), "activation": "gelu_tanh",
            "attention_scale": query_pre_attn_scalar ** -0.5, **extra}


def _rope_layers(reader: gguf.GGUFReader, arch: str, n_layer: int, sliding=None) -> tuple:
    """Whether each layer applies RoPE: loom.rope.layers, else SmolLM3's every-4th-layer rule,
    else EXAONE 4's (with a window, only the local layers: transformers' Exaone4Attention)."""
    listed = _field(reader, "loom.rope.layers")
    if listed is not None:
        return tuple(bool(x) for x in listed)
    if arch == "exaone4" and sliding is not None:
        return tuple(sliding)
    if arch == "smollm3":
        return tuple((li + 1) % SMOLLM3_NO_ROPE_PERIOD != 0 for li in range(n_layer))
    return ()


def _sliding_layers(reader: gguf.GGUFReader, arch: str, n_layer: int) -> tuple:
    """Which layers are local: the pattern as bools per layer or a period (every N-th layer
    global), every layer when absent."""
    pattern = _field(reader, f"{arch}.attention.sliding_window_pattern")
    if pattern is None and arch == "gemma3":
        pattern = GEMMA3_SLIDING_PERIOD
    if pattern is None and arch in ("gemma2", "gpt-oss"):
        pattern = 2  # every other layer global: the even ones local
    if pattern is None and arch in ("olmo2", "exaone4"):
        pattern = 4  # OLMo 3, EXAONE 4: every 4th layer global
    if pattern is None:
        return (True,) * n_layer
    if isinstance(pattern, list):
        return tuple(bool(x) for x in pattern)
    return tuple((i + 1) % int(pattern) != 0 for i in range(n_layer))


def yarn_parameters(base: float, n_rot: int, rope_scaling: dict,
                    max_position_embeddings: int) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023) for a config.json `rope_scaling` of type yarn, with the defaults
    transformers applies: returns (inv_freq [n_rot/2] float64, attention factor).

    Frequency pair i rotates base^(-2i/n_rot) radians per position; the dimension index d(r) at
    which a pair completes r rotations over the original context L is
    n_rot * ln(L / (2 pi r)) / (2 ln base). Pairs below d(beta_fast) (many rotations) keep their
    frequency, pairs above d(beta_slow) (few rotations) are slowed by `factor`, and a linear
    ramp blends the two in between. Cos and sin are scaled by the attention factor,
    0.1 ln(factor) + 1 unless given (or DeepSeek's mscale ratio)."""
    import math

    factor = float(rope_scaling["factor"])
    original = rope_scaling.get("original_max_position_embeddings") or max_position_embeddings
    beta_fast = rope_scaling.get("beta_fast") or 32.0
    beta_slow = rope_scaling.get("beta_slow") or 1.0

    def rotations_dim(rotations: float) -> float:
        return n_rot * math.log(original / (2 * math.pi * rotations)) / (2 * math.log(base))

    low, high = rotations_dim(beta_fast), rotations_dim(beta_slow)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, n_rot - 1)
    if low == high:
        high += 0.001
    pairs = np.arange(n_rot // 2, dtype=np.float64)
    ramp = np.clip((pairs - low) / (high - low), 0.0, 1.0)  # 0: keep, 1: slow by factor
    plain = base ** (-2.0 * pairs / n_rot)
    inv_freq = plain * (1.0 - ramp) + plain / factor * ramp

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rope_scaling.get("attention_factor")
    if attention is None:
        if rope_scaling.get("mscale") and rope_scaling.get("mscale_all_dim"):
            attention = mscale(factor, rope_scaling["mscale"]) / mscale(factor, rope_scaling["mscale_all_dim"])
        else:
            attention = mscale(factor)
    return inv_freq, float(attention)


def with_hf_rope_scaling(model: Model, rope_scaling: dict, max_position_embeddings: int) -> Model:
    """`model` with its RoPE replaced by a config.json `rope_scaling` of type yarn (for
    comparing a Hugging Face directory written from the model's GGUF)."""
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind != "yarn":
        raise NotImplementedError(f"rope_scaling {kind!r}")
    inv_freq, attention = yarn_parameters(model.rope_base, model.n_rot, rope_scaling,
                                          max_position_embeddings)
    return dataclasses.replace(model, rope_inv_freq=inv_freq, rope_position_scale=1.0,
                               rope_attention_factor=attention)


# ---------------------------------------------------------------------------------------------
# Building blocks (float64 unless Numerics.float32).

def _quantize_activations_int8(x: np.ndarray, block: int, f16_scale: bool = True) -> np.ndarray:
    """Rounds each block of `block` values (0: a whole row) to int8 as ggml's quantize_row_q8_0
    does: d = max|x| / 127, q = round(x / d), value = q * float16(d) (q8_K: d kept in float,
    f16_scale False)."""
    rows, cols = x.shape
    block = block or cols
    if cols % block:
        return x
    blocks = x.reshape(rows, cols // block, block)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / 127.0
    q = np.round(blocks / np.where(d == 0, 1.0, d)).clip(-127, 127)
    if f16_scale:
        d = d.astype(np.float16)
    return (q * d.astype(x.dtype)).reshape(rows, cols).astype(x.dtype)


BF16_KV_TILE = 32  # positions per tile of the CPU backend's AMX-BF16 attention (kAmxKvTile)


def _bf16_tile_weights(scores: np.ndarray, top: np.ndarray) -> np.ndarray:
    """The softmax weights exp(scores - top) ([..., T], -inf where masked) as the AMX-BF16
    attention forms them: exp(score - m) rounded to bfloat16, m the running max over the
    32-position tiles of absolute positions seen so far, then scaled by exp(m - top)."""
    t = scores.shape[-1]
    tiles = -(-t // BF16_KV_TILE)
    padded = np.full(scores.shape[:-1] + (tiles * BF16_KV_TILE,), -np.inf, dtype=scores.dtype)
    padded[..., :t] = scores
    running = np.maximum.accumulate(padded.reshape(scores.shape[:-1] + (tiles, BF16_KV_TILE)).max(axis=-1), axis=-1)
    running = np.repeat(running, BF16_KV_TILE, axis=-1)[..., :t]
    with np.errstate(invalid="ignore"):
        weights = round_bf16(np.exp(scores - running)).astype(scores.dtype) * np.exp(running - top)
    return np.where(np.isneginf(scores), 0.0, weights).astype(scores.dtype)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 as Intel's VCVTNEPS2BF16 does (from float32, to nearest even,
    subnormal inputs to zero), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    rounded = np.where((bits & np.uint32(0x7F800000)) == 0, bits & np.uint32(0x80000000), rounded)
    return rounded.astype(np.uint32).view(np.float32)


_BF16_WEIGHTS: dict = {}


def _rounded_bf16(weights: np.ndarray) -> np.ndarray:
    """round_bf16(weights), computed once per array (kept beside it, so its id stays taken)."""
    key = id(weights)
    if key not in _BF16_WEIGHTS:
        _BF16_WEIGHTS[key] = (weights, round_bf16(weights))
    return _BF16_WEIGHTS[key][1]


def _embedding_table(model: Model, numerics: Numerics) -> np.ndarray:
    """[n_vocab, n_embd]: under Numerics.bf16 an F16/F32 table is held rounded to bfloat16, as
    the CPU backend holds every F16/F32 matrix for --activations bf16 (quantized ones keep their
    values; the lookup is not a matmul, so they are not rounded)."""
    if numerics.bf16 and model.token_embd_type in (GGMLQuantizationType.F16, GGMLQuantizationType.F32):
        return _rounded_bf16(model.token_embd)
    return model.token_embd


def _linear(x: np.ndarray, layer: Linear, numerics: Numerics) -> np.ndarray:
    if numerics.bf16:
        y = round_bf16(x).astype(x.dtype) @ _rounded_bf16(layer.weight).T.astype(x.dtype)
        return y if layer.bias is None else y + layer.bias
    if numerics.int8_activations and layer.ggml_type in K_QUANT_TYPES:
        x = _quantize_activations_int8(x, 256, f16_scale=False)
    elif numerics.int8_activations and layer.ggml_type in INTEGER_WEIGHT_TYPES:
        x = _quantize_activations_int8(x, numerics.int8_block)
    y = x @ layer.weight.T.astype(x.dtype)
    if layer.bias is not None:
        y = y + layer.bias
    return y


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps)) * weight


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU with the tanh approximation (PyTorch's approximate="tanh", Gemma's hidden_act)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _mixture_of_experts(model: Model, layer: Layer, h: np.ndarray, numerics: Numerics) -> np.ndarray:
    """Mixtral's / Qwen3-MoE's sparse FFN (HF's definition): softmax over the router's
    logits, the top n_expert_used experts per token (renormalized when expert_norm), each
    a SwiGLU MLP, summed with those weights. GLM-4.5's (expert_gating "sigmoid"): the scores
    are sigmoid(logits), the top n_expert_used by score + the layer's selection bias, weighted
    by their unbiased scores (renormalized when expert_norm), times expert_weights_scale.
    DeepSeek's groups (expert_groups > 1): the choice is made among the experts of the
    expert_groups_used best groups of consecutive experts only, a group scored by its best key
    (softmax: DeepSeek-V2's group_limited_greedy) or its two best keys summed (sigmoid:
    DeepSeek-V3's noaux_tc)."""
    router_logits = _linear(h, layer.router, numerics)
    if model.expert_gating == "sigmoid":
        probs = 1.0 / (1.0 + np.exp(-router_logits))
    elif model.expert_gating == "softmax":
        probs = np.exp(router_logits - router_logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
    else:
        raise NotImplementedError(f"expert gating {model.expert_gating!r}")
    keys = probs if layer.selection_bias is None else probs + layer.selection_bias.astype(probs.dtype)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        candidates = range(len(keys[t]))
        if model.expert_groups > 1:
            size = len(keys[t]) // model.expert_groups
            groups = keys[t].reshape(model.expert_groups, size)
            top = np.sort(groups, axis=1)[:, ::-1]
            group_keys = top[:, :2].sum(axis=1) if model.expert_gating == "sigmoid" else top[:, 0]
            best = sorted(range(model.expert_groups), key=lambda g: (-group_keys[g], g))
            candidates = [e for g in best[:model.expert_groups_used] for e in range(g * size, (g + 1) * size)]
        # Largest first; equal keys: the lower index first.
        chosen = sorted(candidates, key=lambda e: (-keys[t][e], e))[:model.n_expert_used]
        weights = probs[t][chosen]
        if model.expert_norm:
            weights = weights / weights.sum()
        if model.expert_weights_scale != 1.0:
            weights = weights * probs.dtype.type(model.expert_weights_scale)
        for e, w in zip(chosen, weights):
            gate, up, down = layer.experts[e]
            x = h[t:t + 1]
            if model.swiglu_limit:
                # transformers' GptOssExperts: gate clamped above, up on both sides, (up + 1).
                g = np.minimum(_linear(x, gate, numerics), model.swiglu_limit)
                u = np.clip(_linear(x, up, numerics), -model.swiglu_limit, model.swiglu_limit)
                ff = g / (1.0 + np.exp(-GPT_OSS_SWIGLU_ALPHA * g)) * (u + 1.0)
            else:
                ff = _silu(_linear(x, gate, numerics)) * _linear(x, up, numerics)
            out[t] += w * _linear(ff, down, numerics)[0]
    if layer.shared is not None:
        gate, up, down = layer.shared
        shared = _linear(_silu(_linear(h, gate, numerics)) * _linear(h, up, numerics), down, numerics)
        if layer.shared_gate is not None:
            shared = shared / (1.0 + np.exp(-_linear(h, layer.shared_gate, numerics)))
        out += shared
    return out


def rope(model: Model, x: np.ndarray, positions: np.ndarray, local: bool = False) -> np.ndarray:
    """Rotates x [tokens, heads, head_dim] at the given positions (model's mode and scaling; a
    local layer of a model with local_rope_inv_freq takes those frequencies, unscaled)."""
    half = model.n_rot // 2
    inv_freq, position_scale, factor = model.rope_inv_freq, model.rope_position_scale, model.rope_attention_factor
    if local and model.local_rope_inv_freq is not None:
        inv_freq, position_scale, factor = model.local_rope_inv_freq, 1.0, 1.0
    theta = (positions.astype(np.float64) * position_scale)[:, None] * inv_freq[None, :]
    cos = (np.cos(theta) * factor)[:, None, :].astype(x.dtype)  # [tokens, 1, half]
    sin = (np.sin(theta) * factor)[:, None, :].astype(x.dtype)
    out = x.copy()
    if model.rope_mode == "normal":
        x0, x1 = x[..., 0:model.n_rot:2], x[..., 1:model.n_rot:2]
        out[..., 0:model.n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:model.n_rot:2] = x0 * sin + x1 * cos
    elif model.rope_mode == "neox":
        x0, x1 = x[..., :half], x[..., half:model.n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:model.n_rot] = x0 * sin + x1 * cos
    else:
        raise ValueError(f"unknown rope mode {model.rope_mode!r}")
    return out


class KVCache:
    """One sequence's keys and values, per layer: [n_head_kv, tokens, head_dim] float64."""

    def __init__(self, model: Model):
        empty = np.zeros((model.n_head_kv, 0, model.head_dim))
        self.k = [empty for _ in model.layers]
        empty_v = np.zeros((model.n_head_kv, 0, model.mla_value_dim or model.head_dim))
        self.v = [empty_v for _ in model.layers]

    @property
    def length(self) -> int:
        return self.k[0].shape[1] if self.k else 0


def _attention_qkv(model: Model, layer: Layer, h: np.ndarray, positions: np.ndarray, local: bool,
                   li: int, numerics: Numerics) -> tuple:
    """Query, key and value heads ([n, heads or kv_heads, head_dim]) for the normed hidden states
    h: the projections, any QK-norm, RoPE (unless layer li takes none)."""
    n = h.shape[0]
    q = _linear(h, layer.q, numerics)
    k = _linear(h, layer.k, numerics)
    if layer.q_norm is not None and len(layer.q_norm) != model.head_dim:
        q = _rms_norm(q, layer.q_norm, model.rms_eps)  # OLMo: over all heads
        k = _rms_norm(k, layer.k_norm, model.rms_eps)
    q = q.reshape(n, model.n_head, model.head_dim)
    k = k.reshape(n, model.n_head_kv, model.head_dim)
    v = _linear(h, layer.v, numerics).reshape(n, model.n_head_kv, model.head_dim)
    if layer.q_norm is not None and len(layer.q_norm) == model.head_dim:
        q = _rms_norm(q, layer.q_norm, model.rms_eps)
        k = _rms_norm(k, layer.k_norm, model.rms_eps)
    if not model.rope_layers or model.rope_layers[li]:
        q = rope(model, q, positions, local)
        k = rope(model, k, positions, local)
    return q, k, v


def forward(model: Model, token_ids: Sequence[int], cache: KVCache,
            numerics: Numerics = EXACT) -> np.ndarray:
    """Appends token_ids to one sequence (at positions cache.length, ...) and returns their logits
    [len(token_ids), n_vocab] float64."""
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 1 or len(ids) == 0:
        raise ValueError("token_ids must be a non-empty list")
    if ids.min() < 0 or ids.max() >= model.n_vocab:
        raise ValueError(f"token id out of range [0, {model.n_vocab})")
    start = cache.length
    n = len(ids)
    positions = np.arange(start, start + n)
    group = model.n_head // model.n_head_kv
    scale = model.attention_scale or 1.0 / np.sqrt(model.head_dim)
    # Causal mask over [new tokens, all cached + new keys].
    mask = np.arange(start + n)[None, :] > positions[:, None]

    dtype = np.float32 if numerics.float32 else np.float64
    x = _embedding_table(model, numerics)[ids].astype(dtype) * dtype(model.embedding_scale)
    for li, layer in enumerate(model.layers):
        local = bool(model.sliding_window and model.sliding_layers[li])
        h = x if layer.attn_norm is None else _rms_norm(x, layer.attn_norm, model.rms_eps)
        if layer.kv_a is not None:
            q, k, v = _latent_attention_qkv(model, layer, h, positions, numerics)
        else:
            q, k, v = _attention_qkv(model, layer, h, positions, local, li, numerics)
        if numerics.kv_f16:
            k = k.astype(np.float16).astype(dtype)
            v = v.astype(np.float16).astype(dtype)
        cache.k[li] = np.concatenate([cache.k[li].astype(dtype), k.transpose(1, 0, 2)], axis=1)
        cache.v[li] = np.concatenate([cache.v[li].astype(dtype), v.transpose(1, 0, 2)], axis=1)
        keys = np.repeat(cache.k[li], group, axis=0)  # [n_head, T, head_dim]; head h reads kv head h // group
        values = np.repeat(cache.v[li], group, axis=0)
        # Under Numerics.bf16 the CPU backend's attention rounds q, K, V and the softmax weights
        # to bfloat16 as well (its AMX tiles), except for soft-capped scores, latent attention
        # and head dims that are not a multiple of 16 (PagedAttentionParams::activations).
        bf16_attention = (numerics.bf16 and not model.attn_softcap and layer.kv_a is None
                          and model.head_dim % 16 == 0)
        if bf16_attention:
            q, keys, values = (round_bf16(a).astype(dtype) for a in (q, keys, values))
        scores = np.einsum("nhd,htd->hnt", q, keys) * dtype(scale)
        if model.attn_softcap:
            scores = dtype(model.attn_softcap) * np.tanh(scores / dtype(model.attn_softcap))
        layer_mask = mask
        if local:
            # Keys before the window: position - key >= window.
            layer_mask = mask | (positions[:, None] - np.arange(start + n)[None, :] >= model.sliding_window)
        scores = np.where(layer_mask[None], -np.inf, scores)
        top = scores.max(axis=-1, keepdims=True)
        if layer.sinks is not None:
            # transformers' GptOssAttention: the sink is one more logit in the softmax whose
            # probability is dropped.
            sinks = layer.sinks.astype(dtype)[:, None, None]
            top = np.maximum(top, sinks)
        probs = np.exp(scores - top)
        total = probs.sum(axis=-1, keepdims=True)
        if layer.sinks is not None:
            total = total + np.exp(sinks - top)
        if bf16_attention:
            probs = _bf16_tile_weights(scores, top)
        probs /= total
        attn = np.einsum("hnt,htd->nhd", probs, values).reshape(n, -1)
        out = _linear(attn, layer.o, numerics)
        if layer.post_attn_norm is not None:
            out = _rms_norm(out, layer.post_attn_norm, model.rms_eps)
        x = x + out * dtype(model.residual_scale)

        h = x if layer.ffn_norm is None else _rms_norm(x, layer.ffn_norm, model.rms_eps)
        if layer.router is not None:
            x = x + _mixture_of_experts(model, layer, h, numerics) * dtype(model.residual_scale)
            continue
        act = _gelu_tanh if model.activation == "gelu_tanh" else _silu
        ff = act(_linear(h, layer.gate, numerics)) * _linear(h, layer.up, numerics)
        out = _linear(ff, layer.down, numerics)
        if layer.post_ffw_norm is not None:
            out = _rms_norm(out, layer.post_ffw_norm, model.rms_eps)
        x = x + out * dtype(model.residual_scale)

    x = _rms_norm(x, model.output_norm, model.rms_eps)
    out = _linear(x, model.output, numerics) / model.logit_scale
    if model.final_softcap:
        out = out.dtype.type(model.final_softcap) * np.tanh(out / out.dtype.type(model.final_softcap))
    return out


def logits(model: Model, token_ids: Sequence[int], numerics: Numerics = EXACT) -> np.ndarray:
    """Logits [len(token_ids), n_vocab] (float64) of one sequence processed from position 0."""
    return forward(model, token_ids, KVCache(model), numerics)


def greedy(model: Model, prompt_ids: Sequence[int], n: int, numerics: Numerics = EXACT,
           return_margins: bool = False):
    """n greedily chosen tokens after the prompt (KV-cached). With return_margins, also the gap
    between the best and second-best logit at each choice (how robust the choice is)."""
    cache = KVCache(model)
    step_logits = forward(model, prompt_ids, cache, numerics)[-1]
    tokens, margins = [], []
    for i in range(n):
        best = int(np.argmax(step_logits))
        tokens.append(best)
        margins.append(top2_margin(step_logits))
        if i + 1 < n:
            step_logits = forward(model, [best], cache, numerics)[-1]
    return (tokens, margins) if return_margins else tokens


def greedy_recompute(model: Model, prompt_ids: Sequence[int], n: int) -> list[int]:
    """Same as greedy() but re-running the whole sequence each step (no KV cache)."""
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(np.argmax(logits(model, ids)[-1])))
    return ids[len(prompt_ids):]


def top2_margin(row: np.ndarray) -> float:
    top = np.partition(np.asarray(row), -2)[-2:]
    return float(top[1] - top[0])


def hf_tokenizer(model: Model):
    """A `tokenizers` byte-level BPE built from the GGUF vocab and merges (gpt2-style models),
    independent of Loom's tokenizer. Special tokens are not split out of text."""
    import tokenizers
    from tokenizers import models, pre_tokenizers, decoders
    vocab = {tok: i for i, tok in enumerate(model.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in model.merges]
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok
