"""Small, seeded, randomly initialised llama-family GGUF models for the forward pass tests.

Each `ModelSpec` describes one variant; `write_model(spec, path)` writes it with
`gguf.GGUFWriter`, quantizing tensors with `gguf.quants.quantize`. The same spec and seed give
byte-identical files. Weights are scaled like a trained network's (1/sqrt(fan_in) projections,
norm weights near 1) so activations stay O(1) and different prompts get different argmaxes.

Variants (see SPECS):
  llama_gqa      llama arch, hidden 96, 6 query / 2 KV heads (GQA 3), head_dim 16, ffn 224,
                 3 layers, tied embeddings, F32/F16/Q8_0/Q4_0/Q4_1 mixed across tensors.
  qwen2_mqa      qwen2 arch (neox RoPE), Q/K/V biases, hidden 160, 5 query heads / 1 KV head
                 (MQA), head_dim 32, separate output.weight, linear RoPE scaling (factor 2).
  llama_swa      llama arch with sliding-window attention: a 16-token window on layers 0 and 2,
                 layer 1 global (`attention.sliding_window` and its bool-per-layer pattern).
  qwen3moe_top8  qwen3moe arch (mixture of experts): 16 experts of 32 channels, top 8, QK-norm.
  mixtral_top2   llama arch with 4 experts of 64 channels, top 2, one tensor per expert.
  moe_top1       llama arch with 4 experts, top 1, weights not renormalized.
  gemma3_swa     gemma3 arch: 5 local layers (16-token window) and a global one, GELU, sandwich
                 norms, QK-norm, scaled embeddings, RoPE scaling on the global layer.
  gemma2_softcap gemma2 arch: even layers local (16-token window), GELU, sandwich norms,
                 attention scores and final logits soft-capped (caps small enough to bend them).
  phi3_longrope  phi3 arch: fused QKV and gate/up, longrope factors (64-token original context).
  llama_q5       llama arch with Q5_0 and Q5_1 tensors (the fallbacks inside K-quant files).
  llama_k        llama arch with the K-quants (Q2_K .. Q6_K), hidden 256: fused QKV and
                 gate/up matrices mixing them (Q4_K Q/K beside a Q6_K V, as Q4_K_M files do).
  llama3_rope    llama arch with llama3 rope scaling stored as real llama3 GGUFs store it: a
                 `rope_freqs.weight` tensor of per-frequency divisors (no rope.scaling.* keys);
                 original context 64 so the divisors span 1..8 within the 256-token context.
  smollm3_nope   smollm3 arch (llama's layout): 4 layers, the 4th without RoPE (SmolLM3's NoPE
                 layers, a rule with no GGUF key), RoPE base 5,000,000 as SmolLM3's.
  granite_scaled granite arch (llama's layout) with Granite 3's multipliers: embeddings x 12,
                 attention scores x 1/64 (not 1/sqrt(16)), sub-layer outputs x 0.5, logits / 2.
  granitemoe_shared granitemoe arch: the same multipliers over 8 experts of 32 channels, top 2
                 renormalized, beside an ungated shared expert of 64 channels.
  glm4_sandwich  glm4 arch: norms before and after attention and FFN, gate/up fused in ffn_up,
                 Q/K/V biases, 16 of each head's 32 dims rotating in interleaved pairs.
  gemma1_gelu    gemma arch (Gemma 1, CodeGemma): scaled embeddings, GELU, head_dim 32 over hidden
                 64, llama's two norms per layer, no window or caps.
  gpt_oss_sinks  gpt-oss arch: 8 experts of 64 channels in MXFP4, top 4, biases on Q/K/V, the
                 attention output, the router and every expert matrix, attention sinks, the
                 clamped SwiGLU (limit 1.5 so it binds), YaRN (factor 4), even layers local.
  qwen2moe_shared qwen2moe arch: Q/K/V biases, 8 experts of 32 channels, top 2 not
                 renormalized, and a shared expert of 128 channels scaled by its sigmoid gate
                 (layer 0's gate [1, 64] as converters write it, layer 1's [64] as llama.cpp
                 declares it).
  glm4moe        glm4moe arch (GLM-4.5): layer 0 dense (96 channels), layers 1-2 8 experts of 32
                 channels, top 2 by sigmoid score + selection bias (exp_probs_b), weights the
                 unbiased scores renormalized x 2.5, an ungated shared expert of 32; Q/K/V
                 biases, QK-norm, partial NeoX rotary (8 of 16 dims), FFN norm named
                 post_attention_norm, and a 4th (MTP / nextn) block the forward pass skips.
  olmo2_swa      olmo2 arch as OLMo 3: no pre-norms, each sub-layer's output normalized, QK-norm
                 over all heads, a 16-token window on 3 of 4 layers (no pattern key: every 4th
                 layer global, llama.cpp's rule for the architecture).
  ernie45        ernie4_5 arch (ERNIE 4.5 dense): llama's layout, interleaved RoPE pairs in both the
                 GGUF and the HF form, tied embeddings, head_dim 32 over hidden 64.
  ernie45_moe    ernie4_5-moe arch: layer 0 dense (96 channels), layers 1-2 8 experts of 32, top 2
                 by softmax probability + a selection bias (+-0.05), renormalized, beside an
                 ungated shared expert of 32; interleaved RoPE.
  exaone4_swa    exaone4 arch (EXAONE 4.0 32B's layout): OLMo 2's norms (none before, RMSNorm of
                 each sub-layer's output), a per-head QK-norm, a 16-token window on 3 of 4 layers
                 (no pattern key) and no RoPE on the global ones.
  olmoe          olmoe arch: llama's norms, the all-heads QK-norm, 8 experts of 32 channels, top 2
                 not renormalized (the architecture's default).
  deepseek2_lite deepseek2 arch (DeepSeek-V2-Lite's layout): multi-head latent attention with
                 queries from x, layer 0 dense, top 2 of 8 experts by softmax not renormalized
                 beside two shared experts, DeepSeek's YaRN (the log multiplier on the softmax).
  deepseek2_qlora deepseek2 arch (DeepSeek-V3's layout): queries through a latent, the
                 decompression split into attn_k_b / attn_v_b as llama.cpp writes files for its
                 absorbed MLA, a sigmoid router with a selection bias inside the best 2 of 4
                 expert groups.

Every model carries a small byte-level BPE tokenizer (`tokenizer.ggml.model = "gpt2"`): the 256
GPT-2 byte tokens, merges learned from a fixed English corpus, and the special tokens
<|endoftext|>, <|im_start|>, <|im_end|> (vocab 384), unless `write_model(...,
vocabulary_from=PATH)` copies another GGUF's tokenizer instead: DRAFT_SPEC written that way is a
small random draft model for speculative decoding with a real model's vocabulary.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
from typing import Optional

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

import kquant_writer

VOCAB_SIZE = 384
# GLM-4.5's sigmoid router (the glm4moe spec): its gain and the selection bias's range.
SIGMOID_ROUTER_GAIN = 1.5
SELECTION_BIAS_RANGE = 0.15
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")

_CORPUS = """
The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
What is two plus two? Two plus two is four. The quick brown fox jumps over the lazy dog.
A model reads the tokens of a prompt and predicts the next token, one step at a time.
The cache keeps the keys and the values of every token that the model has already seen.
In the beginning there was the word, and the word was with the machine, and it was good.
Numbers like 1, 2, 3, 10, 42 and 2024 appear in text; so do questions, answers and lists.
She said that they would come to the station at seven, but the train was late again today.
""" * 3


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str  # "llama" or "qwen2"
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx: int = 256
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    tied_output: bool = True
    qkv_bias: bool = False
    rope_linear_factor: Optional[float] = None  # writes rope.scaling.type = linear
    llama3_rope: Optional[dict] = None  # factor, low_freq_factor, high_freq_factor, original_context_length
    qk_norm: bool = False  # writes attn_q_norm / attn_k_norm (qwen3's per-head RMSNorm of q, k)
    qk_norm_full: bool = False  # ... over all heads at once instead (OLMo's), when qk_norm
    pre_norms: bool = True  # attn_norm and the FFN norm (OLMo 2 has neither: post_norms only)
    # Sliding-window attention: the window and which layers are local (a bool per layer).
    sliding_window: int = 0
    sliding_pattern: Optional[tuple] = None
    # Mixture of experts: n_expert experts of n_ff channels, n_expert_used per token; the
    # dense feed_forward_length key then says dense_ff (Qwen3-MoE files carry both widths).
    n_expert: int = 0
    n_expert_used: int = 0
    expert_norm: Optional[bool] = None  # writes <arch>.expert_weights_norm when set
    per_expert_tensors: bool = False  # blk.L.ffn_gate.E.weight (older Mixtral files), else *_exps
    dense_ff: int = 0
    # Qwen2-MoE: a shared expert of shared_ff channels (ffn_*_shexp) and its sigmoid gate;
    # GraniteMoeShared's without the gate (shared_gated False).
    shared_ff: int = 0
    shared_gated: bool = True
    # GLM-4.5 (glm4moe): shared_experts ungated shared experts of n_ff channels each, fused into
    # one ffn_*_shexp of shared_experts * n_ff channels (<arch>.expert_shared_count, no gate);
    # the first leading_dense layers dense FFNs of dense_ff channels
    # (<arch>.leading_dense_block_count); a sigmoid router (<arch>.expert_gating_func 2) whose
    # top-k choice adds a per-expert selection bias (blk.L.exp_probs_b.bias) while the weights
    # stay the unbiased scores; the routed weights times expert_weights_scale when set
    # (<arch>.expert_weights_scale); nextn_layers multi-token-prediction blocks after the n_layer
    # that run (counted in <arch>.block_count, said by <arch>.nextn_predict_layers), which the
    # forward pass ignores.
    shared_experts: int = 0
    leading_dense: int = 0
    sigmoid_router: bool = False
    # A selection bias beside a softmax router (ERNIE 4.5): uniform in +-selection_bias.
    selection_bias: float = 0.0
    expert_weights_scale: Optional[float] = None
    nextn_layers: int = 0
    post_norms: bool = False  # Gemma's post_attention_norm / post_ffw_norm
    # Gemma 2's soft-capping: <arch>.attn_logit_softcapping / final_logit_softcapping.
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    # Phi-3: attn_qkv (Q, K, V rows) and ffn_up (gate rows, then up rows) fused; longrope's
    # per-frequency factors: {"original": context, "long": [...], "short": [...]}.
    fused: bool = False
    fused_ffn: bool = False  # gate/up fused into ffn_up alone (GLM-4), Q/K/V separate
    rope_dims: int = 0  # <arch>.rope.dimension_count (0: head_dim); GLM-4 rotates half of it
    longrope: Optional[dict] = None
    # Granite's multipliers as llama.cpp's keys: {"embedding_scale": ..., "residual_scale": ...,
    # "attention.scale": ..., "logit_scale": ...} written as <arch>.<key>.
    multipliers: Optional[dict] = None
    # gpt-oss: attention sinks, biases on the attention output, the router and the experts,
    # the clamped SwiGLU's limit (written as loom.swiglu_limit), YaRN scaling {"factor": ...,
    # "original": context}.
    sinks: bool = False
    output_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: Optional[float] = None
    yarn: Optional[dict] = None
    # DeepSeek-V2's multi-head latent attention (arch deepseek2): an mla_kv_lora-wide key-value
    # latent and a rope_dims-wide key part shared by every head (attn_kv_a_mqa), the latent's
    # norm (attn_kv_a_norm), and per head head_dim - rope_dims key rows and mla_value_dim value
    # rows decompressing it (attn_kv_b); queries from x (attn_q) or through an mla_q_lora-wide
    # normalized latent (attn_q_a, attn_q_a_norm, attn_q_b). A head's rotary dims are its last.
    # mla_split_kv_b: attn_k_b / attn_v_b and the *_mla lengths, as llama.cpp's converter writes
    # files for its absorbed MLA. yarn_log_multiplier: DeepSeek's YaRN softmax-scale key.
    mla_kv_lora: int = 0
    mla_q_lora: int = 0
    mla_value_dim: int = 0
    mla_split_kv_b: bool = False
    yarn_log_multiplier: Optional[float] = None
    # DeepSeek's grouped routing: the experts in expert_groups groups, the best
    # expert_groups_used of them searched (0: none).
    expert_groups: int = 0
    expert_groups_used: int = 0
    # Storage type per tensor role, cycled over layers: role -> tuple of types (layer i uses [i % len]).
    types: dict = dataclasses.field(default_factory=dict)
    seed: int = 0


# A small random draft for speculative decoding tests, written with a real model's vocabulary
# (write_model(..., vocabulary_from=...)); not in SPECS (it has no vocabulary of its own).
DRAFT_SPEC = ModelSpec(
    name="random_draft", arch="llama", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16,
    n_ff=128, n_ctx=2048, seed=4242, types={"token_embd": (T.Q8_0,)})

# Qwen3 (QK-norm, head_dim 32 with hidden 96 != 4 heads x 32): not in SPECS, used by
# hf_model_test.py (through a Hugging Face directory) rather than the GGUF forward pass tests.
QWEN3_SPEC = ModelSpec(
    name="qwen3_qknorm", arch="qwen3", n_embd=96, n_layer=2, n_head=4, n_head_kv=2, head_dim=32,
    n_ff=192, rope_base=1000000.0, rms_eps=1e-6, tied_output=True, qk_norm=True, seed=31,
    types={"token_embd": (T.F16,), "attn_q": (T.F16, T.Q8_0), "attn_k": (T.Q8_0, T.F16)})

SPECS = {
    "llama_gqa": ModelSpec(
        name="llama_gqa", arch="llama", n_embd=96, n_layer=3, n_head=6, n_head_kv=2, head_dim=16,
        n_ff=224, seed=1234,
        types={
            "token_embd": (T.Q8_0,),
            "attn_q": (T.Q4_0, T.F16, T.Q4_1), "attn_k": (T.Q4_1, T.Q8_0, T.F32),
            "attn_v": (T.Q8_0, T.Q4_0, T.F16), "attn_output": (T.F16, T.Q4_1, T.Q4_0),
            "ffn_gate": (T.Q4_1, T.Q4_0, T.Q8_0), "ffn_up": (T.Q4_0, T.F32, T.Q4_1),
            "ffn_down": (T.Q8_0, T.Q4_1, T.F16),
        }),
    "qwen2_mqa": ModelSpec(
        name="qwen2_mqa", arch="qwen2", n_embd=160, n_layer=2, n_head=5, n_head_kv=1, head_dim=32,
        n_ff=288, rope_base=1000000.0, rms_eps=1e-6, tied_output=False, qkv_bias=True,
        rope_linear_factor=2.0, seed=99,
        types={
            "token_embd": (T.F16,), "output": (T.Q8_0,),
            "attn_q": (T.Q4_1, T.Q8_0), "attn_k": (T.Q4_1, T.F16), "attn_v": (T.Q4_0, T.Q4_1),
            "attn_output": (T.Q8_0, T.Q4_0), "ffn_gate": (T.Q4_0, T.Q4_1),
            "ffn_up": (T.Q4_1, T.Q4_0), "ffn_down": (T.F16, T.Q8_0),
        }),
    # Local and global layers (Gemma 2's alternation, Mistral's window): a 16-token window,
    # smaller than most test prompts.
    "llama_swa": ModelSpec(
        name="llama_swa", arch="llama", n_embd=96, n_layer=3, n_head=6, n_head_kv=2, head_dim=16,
        n_ff=192, seed=77, sliding_window=16, sliding_pattern=(True, False, True),
        types={
            "token_embd": (T.Q8_0,), "attn_q": (T.F16, T.Q4_1), "attn_k": (T.Q8_0, T.F16),
            "attn_v": (T.Q4_0, T.Q8_0), "attn_output": (T.Q4_1, T.F16),
            "ffn_gate": (T.Q8_0,), "ffn_up": (T.Q4_1,), "ffn_down": (T.F16,),
        }),
    # Mixtures of experts: Qwen3-MoE (16 experts, top 8, QK-norm, stacked expert tensors, a
    # dense width beside the experts'), Mixtral (llama arch, 4 experts, top 2, one tensor per
    # expert as older Mixtral files hold them) and top 1 without renormalization.
    "qwen3moe_top8": ModelSpec(
        name="qwen3moe_top8", arch="qwen3moe", n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=32, dense_ff=96, n_expert=16, n_expert_used=8, qk_norm=True,
        rope_base=1000000.0, rms_eps=1e-6, seed=808,
        types={"token_embd": (T.F16,), "attn_q": (T.Q8_0, T.F16), "attn_k": (T.F16,),
               "attn_v": (T.Q8_0,), "attn_output": (T.F16,), "ffn_gate": (T.Q8_0, T.F16),
               "ffn_up": (T.Q4_1, T.Q8_0), "ffn_down": (T.F16, T.Q8_0)}),
    "mixtral_top2": ModelSpec(
        name="mixtral_top2", arch="llama", n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=64, n_expert=4, n_expert_used=2, per_expert_tensors=True, seed=8,
        types={"token_embd": (T.Q8_0,), "attn_q": (T.Q4_1,), "attn_k": (T.Q8_0,),
               "attn_v": (T.F16,), "attn_output": (T.Q4_0,), "ffn_gate": (T.Q4_0, T.Q8_0, T.F16),
               "ffn_up": (T.Q8_0, T.Q4_1), "ffn_down": (T.Q4_1, T.F16, T.Q8_0)}),
    # Qwen2-MoE: Qwen2's Q/K/V biases, top 2 of 8 experts without renormalization (the
    # architecture's default), a shared expert wider than feed_forward_length says.
    "qwen2moe_shared": ModelSpec(
        name="qwen2moe_shared", arch="qwen2moe", n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=32, dense_ff=96, n_expert=8, n_expert_used=2, shared_ff=128,
        qkv_bias=True, rope_base=1000000.0, rms_eps=1e-6, seed=909,
        types={"token_embd": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0), "attn_k": (T.Q8_0,),
               "attn_v": (T.F16,), "attn_output": (T.Q8_0,), "ffn_gate": (T.Q8_0,),
               "ffn_up": (T.F16, T.Q4_1), "ffn_down": (T.Q8_0,), "ffn_gate_shexp": (T.Q8_0,),
               "ffn_up_shexp": (T.Q4_1, T.F16), "ffn_down_shexp": (T.F16, T.Q8_0)}),
    "moe_top1": ModelSpec(
        name="moe_top1", arch="llama", n_embd=64, n_layer=2, n_head=4, n_head_kv=4,
        head_dim=16, n_ff=64, n_expert=4, n_expert_used=1, expert_norm=False, seed=81,
        types={"token_embd": (T.F16,), "ffn_gate": (T.Q8_0,), "ffn_up": (T.Q8_0,),
               "ffn_down": (T.Q4_1,)}),
    # Gemma 3: 6 layers of which the last is global (the architecture's default period, no
    # pattern key), a 16-token window, head_dim 32 over hidden 64, QK-norm, sandwich norms,
    # GELU, embeddings scaled by sqrt(64), linear RoPE scaling on the global layer only. A
    # separate LM head (Gemma ties it): with the scaled embedding as its head, a model this
    # small mostly repeats its last token, which would test little.
    # Gemma 2: no QK-norm, one RoPE base, every other layer local (llama.cpp's and
    # transformers. rule: even layers), and soft-capping. Caps of 1.5 (scores) and 10 (logits),
    # far below Gemma 2's 50 and 30, so that tanh bends this small model's values: a kernel
    # that skipped either would miss the reference by far more than the tolerance.
    "gemma2_softcap": ModelSpec(
        name="gemma2_softcap", arch="gemma2", n_embd=64, n_layer=4, n_head=4, n_head_kv=2,
        head_dim=32, n_ff=128, rms_eps=1e-6, post_norms=True, tied_output=False,
        sliding_window=16, attn_softcap=1.5, final_softcap=10.0, seed=5,
        types={"token_embd": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0), "attn_k": (T.Q8_0,),
               "attn_v": (T.Q8_0, T.F16), "attn_output": (T.Q4_1,), "ffn_gate": (T.Q8_0,),
               "ffn_up": (T.Q4_0, T.Q8_0), "ffn_down": (T.Q8_0,), "output": (T.Q8_0,)}),
    "gemma3_swa": ModelSpec(
        name="gemma3_swa", arch="gemma3", n_embd=64, n_layer=6, n_head=4, n_head_kv=2,
        head_dim=32, n_ff=128, rope_base=1000000.0, rms_eps=1e-6, qk_norm=True, post_norms=True,
        tied_output=False,
        sliding_window=16, rope_linear_factor=2.0, seed=3,
        types={"token_embd": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0), "attn_k": (T.Q8_0,),
               "attn_v": (T.F16,), "attn_output": (T.Q4_1, T.F16), "ffn_gate": (T.Q8_0,),
               "ffn_up": (T.Q4_0, T.F16), "ffn_down": (T.F16, T.Q8_0)}),
    # Phi-3: fused QKV and gate/up, a separate LM head, longrope factors for a 64-token
    # pre-training context stretched to 256 (so the long factors and sqrt(1 + ln 4 / ln 64)).
    "phi3_longrope": ModelSpec(
        name="phi3_longrope", arch="phi3", n_embd=96, n_layer=2, n_head=6, n_head_kv=2,
        head_dim=16, n_ff=160, tied_output=False, fused=True, seed=33,
        longrope={"original": 64, "long": [1.0, 1.3, 1.8, 2.5, 3.2, 4.0, 4.0, 4.0],
                  "short": [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5]},
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_qkv": (T.Q8_0, T.F16),
               "attn_output": (T.Q4_1, T.F16), "ffn_up": (T.Q8_0, T.Q4_0),
               "ffn_down": (T.F16, T.Q8_0)}),
    # The legacy 5-bit formats llama.cpp puts into K-quant files where a row is not a multiple
    # of 256 (Q5_0 in Q4_K_M, Q5_1 in Q5_K_M): Loom keeps both as 5-bit INT5, exactly.
    "llama_q5": ModelSpec(
        name="llama_q5", arch="llama", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16,
        n_ff=128, seed=55,
        types={"token_embd": (T.Q5_0,), "attn_q": (T.Q5_0, T.Q5_1), "attn_k": (T.Q5_1, T.Q5_0),
               "attn_v": (T.Q5_0,), "attn_output": (T.Q5_1, T.Q8_0), "ffn_gate": (T.Q5_0,),
               "ffn_up": (T.Q5_1,), "ffn_down": (T.Q5_0, T.Q4_1)}),
    # The K-quants as llama.cpp's mixes place them (Q4_K_M: Q4_K with Q6_K for V, the FFN
    # down projection and the output; Q3_K_M/Q2_K: Q3_K, Q2_K, Q5_K), each packed without loss;
    # mixed fused matrices widen to INT8 g16 with F32 scales. Blocks from kquant_writer.
    "llama_k": ModelSpec(
        name="llama_k", arch="llama", n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64,
        n_ff=512, tied_output=False, seed=61,
        types={"token_embd": (T.Q4_K, ), "output": (T.Q6_K, ), "attn_q": (T.Q4_K, T.Q3_K),
               "attn_k": (T.Q4_K, T.Q3_K), "attn_v": (T.Q6_K, T.Q5_K),
               "attn_output": (T.Q4_K, T.Q2_K), "ffn_gate": (T.Q4_K, T.Q5_K),
               "ffn_up": (T.Q4_K, T.Q3_K), "ffn_down": (T.Q6_K, T.Q2_K)}),
    "llama3_rope": ModelSpec(
        name="llama3_rope", arch="llama", n_embd=128, n_layer=2, n_head=4, n_head_kv=2, head_dim=32,
        n_ff=256, rope_base=500000.0, seed=7,
        llama3_rope={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_context_length": 64},
        types={
            "token_embd": (T.Q4_1,),
            "attn_q": (T.Q8_0, T.Q4_1), "attn_k": (T.Q8_0, T.Q4_0), "attn_v": (T.F16, T.Q8_0),
            "attn_output": (T.Q4_1, T.F16), "ffn_gate": (T.Q8_0, T.Q4_1),
            "ffn_up": (T.Q8_0, T.Q4_0), "ffn_down": (T.Q4_1, T.Q8_0),
        }),
    # SmolLM3: llama's layout with every 4th layer taking no RoPE; the GGUF says nothing of it
    # (llama.cpp's rule for the architecture).
    "smollm3_nope": ModelSpec(
        name="smollm3_nope", arch="smollm3", n_embd=64, n_layer=4, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=128, rope_base=5000000.0, rms_eps=1e-6, seed=303,
        types={"token_embd": (T.Q8_0,), "attn_q": (T.Q4_1, T.F16), "attn_k": (T.Q8_0, T.F16),
               "attn_v": (T.F16, T.Q8_0), "attn_output": (T.Q4_0, T.F16), "ffn_gate": (T.Q8_0,),
               "ffn_up": (T.Q4_1, T.Q8_0), "ffn_down": (T.F16, T.Q4_0)}),
    # Granite 3: llama's layout with multipliers (granite-3.1-8b's: embeddings x 12, sub-layer
    # outputs x 0.22, attention 1/128 for head_dim 128, logits / 16). Here 12, 0.5, 1/64 and
    # 2, so that each one moves this small model's logits far beyond the tests' tolerance
    # (measured: 5.1, 0.59, 0.65 and 6.8 logits when set to 1 / left at 1/sqrt(head_dim)).
    "granite_scaled": ModelSpec(
        name="granite_scaled", arch="granite", n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=128, rope_base=10000000.0, rms_eps=1e-5, tied_output=False, seed=404,
        multipliers={"embedding_scale": 12.0, "residual_scale": 0.5, "attention.scale": 1.0 / 64,
                     "logit_scale": 2.0},
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.F16, T.Q4_1),
               "attn_k": (T.Q8_0,), "attn_v": (T.Q4_0, T.F16), "attn_output": (T.F16, T.Q8_0),
               "ffn_gate": (T.Q4_1,), "ffn_up": (T.Q8_0,), "ffn_down": (T.F16, T.Q4_1)}),
    # GraniteMoeShared (llama.cpp's granitemoe): Granite's multipliers over 8 experts, top 2
    # renormalized (the architecture's default: no expert_weights_norm key), beside an ungated
    # shared expert of expert_shared_feed_forward_length channels.
    "granitemoe_shared": ModelSpec(
        name="granitemoe_shared", arch="granitemoe", n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=32, n_expert=8, n_expert_used=2, shared_ff=64, shared_gated=False,
        rope_base=10000000.0, rms_eps=1e-5, tied_output=False, seed=1531,
        multipliers={"embedding_scale": 12.0, "residual_scale": 0.5, "attention.scale": 1.0 / 64,
                     "logit_scale": 2.0},
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.Q4_1, T.Q8_0),
               "attn_k": (T.Q8_0,), "attn_v": (T.Q4_0, T.F16), "attn_output": (T.Q8_0, T.Q4_1),
               "ffn_gate": (T.Q8_0, T.Q4_1), "ffn_up": (T.Q4_1, T.Q8_0), "ffn_down": (T.Q8_0, T.Q4_0),
               "ffn_gate_shexp": (T.Q8_0,), "ffn_up_shexp": (T.Q4_1, T.F16),
               "ffn_down_shexp": (T.F16, T.Q8_0)}),
    # GLM-4-0414: sandwich norms with SiLU, fused gate/up, Q/K/V biases, partial rotary (0.5)
    # in interleaved pairs (llama.cpp's NORM mode; its converter does not permute GLM's rows).
    "glm4_sandwich": ModelSpec(
        name="glm4_sandwich", arch="glm4", n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=32, n_ff=128, rope_dims=16, rms_eps=1e-5, post_norms=True, qkv_bias=True,
        fused_ffn=True, tied_output=False, seed=505,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0),
               "attn_k": (T.Q8_0,), "attn_v": (T.F16,), "attn_output": (T.Q4_1, T.F16),
               "ffn_up": (T.Q8_0, T.Q4_0), "ffn_down": (T.F16, T.Q8_0)}),
    # Gemma 1: Gemma 3's embeddings, GELU and query scale without its post norms, windows or
    # QK-norm; a separate LM head as gemma3_swa has, for the same reason.
    "gemma1_gelu": ModelSpec(
        name="gemma1_gelu", arch="gemma", n_embd=64, n_layer=2, n_head=4, n_head_kv=4,
        head_dim=32, n_ff=128, rms_eps=1e-6, tied_output=False, seed=606,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0),
               "attn_k": (T.Q8_0,), "attn_v": (T.F16,), "attn_output": (T.Q4_1,),
               "ffn_gate": (T.Q8_0,), "ffn_up": (T.Q4_0, T.F16), "ffn_down": (T.F16,)}),
    # gpt-oss: its experts in MXFP4 as the released GGUFs hold them (the rest Q8_0/F16/F32;
    # 64 channels so that two tensor-parallel ranks split them on MXFP4's 32-wide blocks),
    # head_dim 32 over hidden 64, 2 layers (layer 0 local, a 16-token window), sinks and biases
    # drawn large enough to move the logits, and a SwiGLU limit of 1.5 (gpt-oss: 7) so that the
    # clamp binds on this small model's activations.
    "gpt_oss_sinks": ModelSpec(
        name="gpt_oss_sinks", arch="gpt-oss", n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=32, n_ff=64, n_expert=8, n_expert_used=4, rope_base=150000.0, rms_eps=1e-5,
        tied_output=False, qkv_bias=True, sinks=True, output_bias=True, expert_bias=True,
        swiglu_limit=1.5, yarn={"factor": 4.0, "original": 64}, sliding_window=16, seed=707,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0),
               "attn_k": (T.Q8_0,), "attn_v": (T.F16,), "attn_output": (T.Q8_0, T.F16),
               "ffn_gate": (T.MXFP4,), "ffn_up": (T.MXFP4,), "ffn_down": (T.MXFP4,)}),
    # GLM-4.5 / GLM-4.5-Air: layer 0 a dense FFN (96 channels), layers 1 and 2 8 experts of 32
    # channels, top 2 by sigmoid score plus selection bias, weighted by the unbiased scores
    # renormalized and times 2.5 (routed_scaling_factor), beside an ungated shared expert of 32;
    # Q/K/V biases, QK-norm, 8 of each head's 16 dims rotating in NeoX pairs; a 4th block, the
    # MTP (nextn) layer, that the forward pass skips; a separate LM head, as GLM-4.5's.
    "glm4moe": ModelSpec(
        name="glm4moe", arch="glm4moe", n_embd=64, n_layer=3, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=32, dense_ff=96, n_expert=8, n_expert_used=2, shared_experts=1,
        leading_dense=1, sigmoid_router=True, expert_norm=True, expert_weights_scale=2.5,
        nextn_layers=1, rope_dims=8, qkv_bias=True, qk_norm=True, rope_base=1000000.0,
        rms_eps=1e-5, tied_output=False, seed=1011,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0),
               "attn_k": (T.Q8_0,), "attn_v": (T.F16,), "attn_output": (T.Q8_0, T.F16),
               "ffn_gate": (T.Q8_0, T.F16), "ffn_up": (T.F16, T.Q4_1), "ffn_down": (T.Q8_0,),
               "ffn_gate_shexp": (T.Q8_0,), "ffn_up_shexp": (T.Q4_1, T.F16),
               "ffn_down_shexp": (T.F16, T.Q8_0), "nextn_eh_proj": (T.F16,)}),
    # OLMo 3 (OLMo 2's layout with windows): no norm before attention or the FFN, RMSNorm of
    # each sub-layer's output (post_attention_norm, post_ffw_norm), a QK-norm over all heads of
    # q and of k (64- and 32-wide), 3 of every 4 layers local with a 16-token window.
    "olmo2_swa": ModelSpec(
        name="olmo2_swa", arch="olmo2", n_embd=64, n_layer=4, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=128, rope_base=500000.0, rms_eps=1e-6, pre_norms=False,
        post_norms=True, qk_norm=True, qk_norm_full=True, sliding_window=16,
        tied_output=False, seed=1112,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0),
               "attn_k": (T.Q8_0,), "attn_v": (T.F16, T.Q4_1), "attn_output": (T.Q8_0, T.F16),
               "ffn_gate": (T.Q4_1, T.Q8_0), "ffn_up": (T.Q8_0,), "ffn_down": (T.F16, T.Q8_0)}),
    # ERNIE 4.5 dense: llama's layout whose checkpoints rotate interleaved pairs (no row
    # permutation between the formats), head_dim 32 over hidden 64 as 0.3B's 128 over 1024.
    "ernie45": ModelSpec(
        name="ernie45", arch="ernie4_5", n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=32, n_ff=128, rope_base=500000.0, rms_eps=1e-5, seed=1314,
        types={"token_embd": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0), "attn_k": (T.Q8_0,),
               "attn_v": (T.F16,), "attn_output": (T.Q4_1, T.F16), "ffn_gate": (T.Q8_0,),
               "ffn_up": (T.Q4_0, T.F16), "ffn_down": (T.F16, T.Q8_0)}),
    # ERNIE-4.5-21B-A3B's layout: the first layer dense, the others experts chosen by softmax
    # probability plus a selection bias (+-0.05, on probabilities of ~1/8: it changes some
    # choices), weighted by the unbiased probabilities renormalized, and ungated shared experts.
    # Seed 1417: with 1415 one test prompt's token sat on a near tie between two experts that
    # int8 activations flipped (max |Δlogit| 2.5, the routing's fragility rather than int8's
    # error; 1416 and 1418 measured 0.84 and 0.77).
    "ernie45_moe": ModelSpec(
        name="ernie45_moe", arch="ernie4_5-moe", n_embd=64, n_layer=3, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=32, dense_ff=96, n_expert=8, n_expert_used=2, shared_experts=1,
        leading_dense=1, selection_bias=0.05, rope_base=500000.0, rms_eps=1e-5,
        tied_output=False, seed=1417,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.F16, T.Q8_0),
               "attn_k": (T.Q8_0,), "attn_v": (T.F16,), "attn_output": (T.Q8_0, T.F16),
               "ffn_gate": (T.Q8_0, T.F16), "ffn_up": (T.F16, T.Q4_1), "ffn_down": (T.Q8_0,),
               "ffn_gate_shexp": (T.Q8_0,), "ffn_up_shexp": (T.Q4_1, T.F16),
               "ffn_down_shexp": (T.F16, T.Q8_0)}),
    # EXAONE 4.0 32B's layout: no pre-norms, post norms, a per-head QK-norm, three local layers
    # of four (16-token window), the global ones without RoPE.
    "exaone4_swa": ModelSpec(
        name="exaone4_swa", arch="exaone4", n_embd=64, n_layer=4, n_head=4, n_head_kv=2,
        head_dim=16, n_ff=128, rope_base=1000000.0, rms_eps=1e-5, pre_norms=False,
        post_norms=True, qk_norm=True, sliding_window=16, tied_output=False, seed=1516,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.Q8_0, T.F16),
               "attn_k": (T.F16,), "attn_v": (T.Q8_0,), "attn_output": (T.F16, T.Q4_1),
               "ffn_gate": (T.Q8_0,), "ffn_up": (T.Q4_1, T.F16), "ffn_down": (T.F16, T.Q8_0)}),
    # DeepSeek-V2-Lite's layout: multi-head latent attention with queries straight from x
    # (head_dim 32 = 24 decompressed + 8 rotary, values 16 wide, a 32-wide latent), layer 0
    # dense, then top 2 of 8 experts by softmax probability not renormalized (the
    # architecture's default) beside two ungated shared experts; YaRN (factor 4) whose log
    # multiplier scales the softmax. Outputs F16: Loom widens them to F32 at load.
    "deepseek2_lite": ModelSpec(
        name="deepseek2_lite", arch="deepseek2", n_embd=64, n_layer=3, n_head=4, n_head_kv=4,
        head_dim=32, rope_dims=8, n_ff=32, dense_ff=96, n_expert=8, n_expert_used=2,
        shared_experts=2, leading_dense=1, mla_kv_lora=32, mla_value_dim=16, rms_eps=1e-6,
        yarn={"factor": 4.0, "original": 64}, yarn_log_multiplier=0.0707, tied_output=False,
        seed=1622,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.Q8_0, T.F16),
               "attn_kv_a_mqa": (T.F16, T.Q8_0), "attn_kv_b": (T.F16,),
               "attn_output": (T.F16,), "ffn_gate": (T.Q8_0, T.F16), "ffn_up": (T.F16, T.Q4_1),
               "ffn_down": (T.Q8_0,), "ffn_gate_shexp": (T.Q8_0,), "ffn_up_shexp": (T.Q4_1,),
               "ffn_down_shexp": (T.F16,)}),
    # DeepSeek-V3's layout: queries through a 64-wide latent, the decompression split into
    # attn_k_b / attn_v_b with the *_mla lengths and one KV head (as llama.cpp's converter
    # writes files for its absorbed MLA), top 2 of 8 experts by sigmoid score plus a selection
    # bias inside the best 2 of 4 groups (V3's 4 of 8), renormalized x 2.5, beside one shared
    # expert.
    "deepseek2_qlora": ModelSpec(
        name="deepseek2_qlora", arch="deepseek2", n_embd=64, n_layer=2, n_head=4, n_head_kv=1,
        head_dim=32, rope_dims=8, n_ff=32, dense_ff=96, n_expert=8, n_expert_used=2,
        shared_experts=1, leading_dense=1, sigmoid_router=True, expert_norm=True,
        expert_weights_scale=2.5, expert_groups=4, expert_groups_used=2, mla_kv_lora=32,
        mla_q_lora=64, mla_value_dim=16,
        mla_split_kv_b=True, rms_eps=1e-6, tied_output=False, seed=1619,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q_a": (T.Q8_0,),
               "attn_q_b": (T.F16, T.Q8_0), "attn_kv_a_mqa": (T.Q8_0,), "attn_k_b": (T.F16,),
               "attn_v_b": (T.F32,), "attn_output": (T.F32,), "ffn_gate": (T.Q8_0,),
               "ffn_up": (T.F16,), "ffn_down": (T.Q8_0,), "ffn_gate_shexp": (T.Q8_0,),
               "ffn_up_shexp": (T.F16,), "ffn_down_shexp": (T.Q8_0,)}),
    # OLMoE: llama's norms, the all-heads QK-norm, top 2 of 8 experts not renormalized.
    "olmoe": ModelSpec(
        name="olmoe", arch="olmoe", n_embd=64, n_layer=2, n_head=4, n_head_kv=4,
        head_dim=16, n_ff=32, n_expert=8, n_expert_used=2, qk_norm=True, qk_norm_full=True,
        rope_base=10000.0, rms_eps=1e-5, tied_output=False, seed=1213,
        types={"token_embd": (T.Q8_0,), "output": (T.Q8_0,), "attn_q": (T.Q8_0, T.F16),
               "attn_k": (T.F16,), "attn_v": (T.Q8_0,), "attn_output": (T.F16, T.Q8_0),
               "ffn_gate": (T.Q8_0, T.F16), "ffn_up": (T.F16, T.Q4_1), "ffn_down": (T.Q8_0,)}),
}


# ---------------------------------------------------------------------------------------------
# Tokenizer.

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def train_bpe(corpus: str, num_merges: int) -> list[tuple[str, str]]:
    """Deterministic byte-level BPE: repeatedly merge the most frequent adjacent pair (ties broken
    by the pair's text)."""
    byte_map = bytes_to_unicode()
    words = collections.Counter(
        tuple(byte_map[b] for b in piece.encode("utf-8")) for piece in _PRETOKENIZE.findall(corpus))
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter = collections.Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = collections.Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def tokenizer_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the test tokenizer: bytes, merges, specials."""
    byte_map = bytes_to_unicode()
    tokens = [byte_map[b] for b in range(256)]
    merges = train_bpe(_CORPUS, VOCAB_SIZE - 256 - len(SPECIAL_TOKENS))
    for a, b in merges:
        tokens.append(a + b)
    if len(set(tokens)) != len(tokens):
        raise AssertionError("BPE produced a duplicate token")
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens += list(SPECIAL_TOKENS)
    types += [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
    if len(tokens) != VOCAB_SIZE:
        raise AssertionError(f"corpus too small for {VOCAB_SIZE} tokens: got {len(tokens)}")
    return tokens, [int(t) for t in types], [f"{a} {b}" for a, b in merges]


# ---------------------------------------------------------------------------------------------
# Weights.

def llama3_rope_factors(head_dim: int, base: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_context_length: int) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter writes as rope_freqs.weight for
    rope_type "llama3" (Llama 3.1)."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    low_freq_wavelen = original_context_length / low_freq_factor
    high_freq_wavelen = original_context_length / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (original_context_length / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _add(writer: gguf.GGUFWriter, name: str, values: np.ndarray, ggml_type: T) -> None:
    """Stores a float array (numpy shape (rows, cols) = ggml [cols, rows]) as ggml_type."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if ggml_type == T.F32:
        writer.add_tensor(name, values)
    elif ggml_type == T.F16:
        writer.add_tensor(name, values.astype(np.float16))
    elif ggml_type in kquant_writer.K_QUANTS:
        writer.add_tensor(name, kquant_writer.quantize(values, ggml_type), raw_dtype=ggml_type)
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, ggml_type), raw_dtype=ggml_type)


def _copy_tokenizer(writer: gguf.GGUFWriter, source: str | os.PathLike) -> int:
    """Copies every tokenizer.* key of the GGUF at source; returns its vocabulary size."""
    reader = gguf.GGUFReader(str(source))
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, field.types[0])
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if n_vocab == 0:
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return n_vocab


def write_model(spec: ModelSpec, path: str | os.PathLike,
                vocabulary_from: Optional[str | os.PathLike] = None) -> str:
    """Writes spec as a GGUF file at path and returns the path. With vocabulary_from, the
    tokenizer (and so the vocabulary) is copied from that GGUF instead of the test tokenizer:
    a random model that can draft for a real one (speculative decoding)."""
    rng = np.random.default_rng(spec.seed)
    tokens, token_types, merges = tokenizer_vocab()
    n_vocab = len(tokens)
    d, hd = spec.n_embd, spec.head_dim

    def matrix(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return rng.normal(0.0, gain / math.sqrt(cols), size=(rows, cols))

    def norm_weight() -> np.ndarray:
        return 1.0 + rng.normal(0.0, 0.1, size=d)

    def type_of(role: str, layer: int = 0) -> T:
        choices = spec.types.get(role, (T.F32,))
        return choices[layer % len(choices)]

    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_name(f"loom-test-{spec.name}")
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(d)
    writer.add_block_count(spec.n_layer + spec.nextn_layers)
    writer.add_feed_forward_length(spec.dense_ff or spec.n_ff)
    if spec.n_expert:
        writer.add_expert_count(spec.n_expert)
        writer.add_expert_used_count(spec.n_expert_used)
        if spec.dense_ff:
            writer.add_expert_feed_forward_length(spec.n_ff)
        if spec.expert_norm is not None:
            writer.add_bool(f"{spec.arch}.expert_weights_norm", spec.expert_norm)
        if spec.shared_ff:
            writer.add_expert_shared_feed_forward_length(spec.shared_ff)
        if spec.shared_experts:
            writer.add_expert_shared_count(spec.shared_experts)
        if spec.leading_dense:
            writer.add_leading_dense_block_count(spec.leading_dense)
        if spec.sigmoid_router:
            writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if spec.expert_weights_scale is not None:
            writer.add_expert_weights_scale(spec.expert_weights_scale)
        if spec.expert_groups:
            writer.add_expert_group_count(spec.expert_groups)
            writer.add_expert_group_used_count(spec.expert_groups_used)
    if spec.nextn_layers:
        writer.add_nextn_predict_layers(spec.nextn_layers)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    # GLM-4.5's converter writes the head size whatever it is (its config.json says head_dim).
    if spec.mla_kv_lora:
        writer.add_kv_lora_rank(spec.mla_kv_lora)
        if spec.mla_q_lora:
            writer.add_q_lora_rank(spec.mla_q_lora)
        if spec.mla_split_kv_b:
            writer.add_key_length(spec.mla_kv_lora + spec.rope_dims)
            writer.add_value_length(spec.mla_kv_lora)
            writer.add_key_length_mla(hd)
            writer.add_value_length_mla(spec.mla_value_dim)
        else:
            writer.add_key_length(hd)
            writer.add_value_length(spec.mla_value_dim)
    elif spec.n_embd != spec.n_head * hd or spec.arch == "glm4moe":
        writer.add_key_length(hd)
        writer.add_value_length(hd)
    writer.add_rope_dimension_count(spec.rope_dims or hd)
    writer.add_rope_freq_base(spec.rope_base)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    if vocabulary_from is not None:
        n_vocab = _copy_tokenizer(writer, vocabulary_from)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1 if spec.arch == "llama" else gguf.LlamaFileType.MOSTLY_Q8_0)
    for key, value in (spec.multipliers or {}).items():
        writer.add_float32(f"{spec.arch}.{key}", value)
    if spec.attn_softcap:
        writer.add_float32(f"{spec.arch}.attn_logit_softcapping", spec.attn_softcap)
    if spec.final_softcap:
        writer.add_float32(f"{spec.arch}.final_logit_softcapping", spec.final_softcap)
    if spec.sliding_window:
        writer.add_uint32(f"{spec.arch}.attention.sliding_window", spec.sliding_window)
        if spec.sliding_pattern is not None:
            writer.add_array(f"{spec.arch}.attention.sliding_window_pattern", list(spec.sliding_pattern))
    if spec.longrope is not None:
        writer.add_uint32(f"{spec.arch}.rope.scaling.original_context_length", spec.longrope["original"])
    if spec.rope_linear_factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(spec.rope_linear_factor)
    if spec.yarn is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(spec.yarn["factor"])
        writer.add_uint32(f"{spec.arch}.rope.scaling.original_context_length", spec.yarn["original"])
    if spec.yarn_log_multiplier is not None:
        writer.add_rope_scaling_yarn_log_mul(spec.yarn_log_multiplier)
    if spec.swiglu_limit is not None:
        writer.add_float32("loom.swiglu_limit", spec.swiglu_limit)

    if vocabulary_from is None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(tokens)
        writer.add_token_types(token_types)
        writer.add_token_merges(merges)
        endoftext = tokens.index("<|endoftext|>")
        writer.add_bos_token_id(endoftext)
        writer.add_eos_token_id(endoftext)
        writer.add_add_bos_token(False)
        writer.add_chat_template(CHATML_TEMPLATE)

    # Embedding rows are small next to what each block adds, so a token's own embedding does not
    # dominate the final state (with tied output that would make the model echo its input).
    # Gemma scales embeddings by sqrt(n_embd) on the way in: smaller rows keep the same balance.
    token_embd = rng.normal(0.0, 0.1 if spec.arch.startswith("gemma") else 0.4, size=(n_vocab, d))
    _add(writer, "token_embd.weight", token_embd, type_of("token_embd"))
    if spec.llama3_rope is not None:
        factors = llama3_rope_factors(hd, spec.rope_base, **spec.llama3_rope)
        _add(writer, "rope_freqs.weight", factors, T.F32)
    if spec.longrope is not None:
        _add(writer, "rope_factors_long.weight", np.asarray(spec.longrope["long"]), T.F32)
        _add(writer, "rope_factors_short.weight", np.asarray(spec.longrope["short"]), T.F32)
    # Multi-token-prediction blocks (nextn_layers) follow the n_layer that run: a whole MoE layer
    # and the MTP head's own tensors, random like the rest (a forward pass that ran them, or
    # read the wrong block's tensors, would give other logits).
    for i in range(spec.n_layer + spec.nextn_layers):
        p = f"blk.{i}"
        if spec.pre_norms:
            _add(writer, f"{p}.attn_norm.weight", norm_weight(), T.F32)
        if spec.mla_kv_lora:
            _add_latent_attention(writer, spec, p, i, matrix, type_of)
        else:
            _add_attention(writer, spec, p, i, matrix, type_of)
        if spec.qkv_bias:
            _add(writer, f"{p}.attn_q.bias", rng.normal(0.0, 0.3, size=spec.n_head * hd), T.F32)
            _add(writer, f"{p}.attn_k.bias", rng.normal(0.0, 0.3, size=spec.n_head_kv * hd), T.F32)
            _add(writer, f"{p}.attn_v.bias", rng.normal(0.0, 0.3, size=spec.n_head_kv * hd), T.F32)
        if spec.qk_norm:
            q_width = spec.n_head * hd if spec.qk_norm_full else hd
            k_width = spec.n_head_kv * hd if spec.qk_norm_full else hd
            _add(writer, f"{p}.attn_q_norm.weight", 1.0 + rng.normal(0.0, 0.1, size=q_width), T.F32)
            _add(writer, f"{p}.attn_k_norm.weight", 1.0 + rng.normal(0.0, 0.1, size=k_width), T.F32)
        value_width = spec.mla_value_dim or hd
        _add(writer, f"{p}.attn_output.weight", matrix(d, spec.n_head * value_width),
             type_of("attn_output", i))
        if spec.output_bias:
            _add(writer, f"{p}.attn_output.bias", rng.normal(0.0, 0.3, size=d), T.F32)
        if spec.sinks:
            # Around the scores' scale: some heads' sinks take most of the weight, some little.
            _add(writer, f"{p}.attn_sinks.weight", rng.normal(1.0, 1.5, size=spec.n_head), T.F32)
        if spec.post_norms:
            _add(writer, f"{p}.post_attention_norm.weight", norm_weight(), T.F32)
            _add(writer, f"{p}.post_ffw_norm.weight", norm_weight(), T.F32)
        # gpt-oss's and GLM-4.5's FFN norm is named post_attention_norm (llama.cpp's
        # attn_post_norm; HF's post_attention_layernorm).
        ffn_norm = "post_attention_norm" if spec.arch in ("gpt-oss", "glm4moe") else "ffn_norm"
        if spec.pre_norms:
            _add(writer, f"{p}.{ffn_norm}.weight", norm_weight(), T.F32)
        if spec.n_expert and i >= spec.leading_dense:
            _add_experts(writer, spec, p, i, matrix, type_of)
            if i >= spec.n_layer:
                # GLM-4.5's MTP head: eh_proj [n_embd, 2 n_embd] over the normed embedding and
                # hidden state (enorm, hnorm), and the norm before its shared LM head.
                _add(writer, f"{p}.nextn.eh_proj.weight", matrix(d, 2 * d), type_of("nextn_eh_proj", i))
                for norm in ("enorm", "hnorm", "shared_head_norm"):
                    _add(writer, f"{p}.nextn.{norm}.weight", norm_weight(), T.F32)
            continue
        # The dense layers before a mixture of experts' first expert layer (GLM-4.5's
        # leading_dense) are dense_ff wide.
        n_ff = (spec.dense_ff or spec.n_ff) if spec.n_expert else spec.n_ff
        gate, up = matrix(n_ff, d), matrix(n_ff, d)
        if spec.fused or spec.fused_ffn:
            _add(writer, f"{p}.ffn_up.weight", np.concatenate([gate, up]), type_of("ffn_up", i))
        else:
            _add(writer, f"{p}.ffn_gate.weight", gate, type_of("ffn_gate", i))
            _add(writer, f"{p}.ffn_up.weight", up, type_of("ffn_up", i))
        _add(writer, f"{p}.ffn_down.weight", matrix(d, n_ff, 1.5), type_of("ffn_down", i))
    _add(writer, "output_norm.weight", norm_weight(), T.F32)
    if not spec.tied_output:
        _add(writer, "output.weight", matrix(n_vocab, d, 4.0), type_of("output"))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def _add_attention(writer: gguf.GGUFWriter, spec: ModelSpec, p: str, layer: int, matrix,
                   type_of) -> None:
    """Q, K and V (fused into attn_qkv for Phi-3), gain 2 on Q and K so that attention is neither
    uniform nor one-hot (scores ~ N(0, 1-4))."""
    d, hd = spec.n_embd, spec.head_dim
    q = matrix(spec.n_head * hd, d, 2.0)
    k = matrix(spec.n_head_kv * hd, d, 2.0)
    v = matrix(spec.n_head_kv * hd, d)
    if spec.fused:
        _add(writer, f"{p}.attn_qkv.weight", np.concatenate([q, k, v]), type_of("attn_qkv", layer))
    else:
        _add(writer, f"{p}.attn_q.weight", q, type_of("attn_q", layer))
        _add(writer, f"{p}.attn_k.weight", k, type_of("attn_k", layer))
        _add(writer, f"{p}.attn_v.weight", v, type_of("attn_v", layer))


def _add_latent_attention(writer: gguf.GGUFWriter, spec: ModelSpec, p: str, layer: int, matrix,
                          type_of) -> None:
    """Multi-head latent attention's tensors (DeepSeek-V2's, as llama.cpp names them): gain 2 on
    the query and key paths as for standard attention, each head's rows [no-RoPE part, RoPE
    part]."""
    d, hd, heads = spec.n_embd, spec.head_dim, spec.n_head
    rope, latent, value_dim = spec.rope_dims, spec.mla_kv_lora, spec.mla_value_dim
    nope = hd - rope
    if spec.mla_q_lora:
        _add(writer, f"{p}.attn_q_a.weight", matrix(spec.mla_q_lora, d), type_of("attn_q_a", layer))
        _add(writer, f"{p}.attn_q_a_norm.weight", 1.0 + 0.1 * np.sin(np.arange(spec.mla_q_lora)),
             T.F32)
        _add(writer, f"{p}.attn_q_b.weight", matrix(heads * hd, spec.mla_q_lora, 2.0),
             type_of("attn_q_b", layer))
    else:
        _add(writer, f"{p}.attn_q.weight", matrix(heads * hd, d, 2.0), type_of("attn_q", layer))
    _add(writer, f"{p}.attn_kv_a_mqa.weight", matrix(latent + rope, d, 2.0),
         type_of("attn_kv_a_mqa", layer))
    _add(writer, f"{p}.attn_kv_a_norm.weight", 1.0 + 0.1 * np.cos(np.arange(latent)), T.F32)
    keys = np.stack([matrix(nope, latent, 2.0) for _ in range(heads)])  # [heads, nope, latent]
    values = np.stack([matrix(value_dim, latent) for _ in range(heads)])  # [heads, value, latent]
    if spec.mla_split_kv_b:
        _add(writer, f"{p}.attn_k_b.weight", keys.transpose(0, 2, 1), type_of("attn_k_b", layer))
        _add(writer, f"{p}.attn_v_b.weight", values, type_of("attn_v_b", layer))
    else:
        kv_b = np.concatenate([keys, values], axis=1).reshape(heads * (nope + value_dim), latent)
        _add(writer, f"{p}.attn_kv_b.weight", kv_b, type_of("attn_kv_b", layer))


def _add_experts(writer: gguf.GGUFWriter, spec: ModelSpec, p: str, layer: int, matrix, type_of) -> None:
    """A mixture-of-experts layer: the router (gain 4, so the top-k choice is rarely a near
    tie that float rounding could flip) and each expert's gate, up and down, stacked into
    3-D tensors as llama.cpp writes them or one matrix per expert."""
    d, e = spec.n_embd, spec.n_expert
    # A sigmoid router (GLM-4.5) takes gain SIGMOID_ROUTER_GAIN: each logit varies over the
    # tokens by ~1-1.5, so the scores spread over (0.15, 0.85) rather than saturating at 0 and
    # 1, and the selection bias (uniform in +-SELECTION_BIAS_RANGE, drawn from its own
    # generator) changes the experts chosen for 34% / 46% of random tokens in glm4moe's two
    # expert layers (measured), while every expert still takes some. A range of 0.3 changed
    # more, but left one test prompt's token with a near tie that int8 activations flipped
    # (max |Δlogit| 11 against the reference, whatever the gain): 0.15 keeps the flips away.
    gain = SIGMOID_ROUTER_GAIN if spec.sigmoid_router else 4.0
    _add(writer, f"{p}.ffn_gate_inp.weight", matrix(e, d, gain), T.F32)
    if spec.sigmoid_router or spec.selection_bias:
        rng = np.random.default_rng([spec.seed, layer, 1])
        bias_range = spec.selection_bias or SELECTION_BIAS_RANGE
        _add(writer, f"{p}.exp_probs_b.bias", rng.uniform(-bias_range, bias_range, size=e), T.F32)
    if spec.expert_bias:
        # gpt-oss: the router's and every expert matrix's biases, stacked one row per expert.
        rng = np.random.default_rng(spec.seed * 1000 + layer)
        _add(writer, f"{p}.ffn_gate_inp.bias", rng.normal(0.0, 1.0, size=e), T.F32)
        _add(writer, f"{p}.ffn_gate_exps.bias", rng.normal(0.0, 0.5, size=(e, spec.n_ff)), T.F32)
        _add(writer, f"{p}.ffn_up_exps.bias", rng.normal(0.0, 0.5, size=(e, spec.n_ff)), T.F32)
        _add(writer, f"{p}.ffn_down_exps.bias", rng.normal(0.0, 0.3, size=(e, d)), T.F32)
    experts = {"ffn_gate": [matrix(spec.n_ff, d) for _ in range(e)],
               "ffn_up": [matrix(spec.n_ff, d) for _ in range(e)],
               "ffn_down": [matrix(d, spec.n_ff, 1.5 * math.sqrt(spec.n_expert_used)) for _ in range(e)]}
    for role, matrices in experts.items():
        if spec.per_expert_tensors:
            for index, values in enumerate(matrices):
                _add(writer, f"{p}.{role}.{index}.weight", values, type_of(role, layer + index))
        else:
            _add(writer, f"{p}.{role}_exps.weight", np.stack(matrices), type_of(role, layer))
    if spec.shared_ff or spec.shared_experts:
        # Qwen2-MoE's shared expert, and its sigmoid gate (gain 4: the sigmoids spread over
        # most of (0, 1)), [1, n_embd] on even layers as converters write it, [n_embd] on odd
        # ones as llama.cpp declares it; GLM-4.5's shared experts, fused and ungated.
        width = spec.shared_ff or spec.shared_experts * spec.n_ff
        shared = {"ffn_gate_shexp": matrix(width, d), "ffn_up_shexp": matrix(width, d),
                  "ffn_down_shexp": matrix(d, width, 1.5)}
        for role, values in shared.items():
            _add(writer, f"{p}.{role}.weight", values, type_of(role, layer))
        if not spec.shared_ff or not spec.shared_gated:
            return
        gate = matrix(1, d, 4.0)
        _add(writer, f"{p}.ffn_gate_inp_shexp.weight", gate if layer % 2 == 0 else gate.reshape(-1), T.F32)


def write_all(directory: str | os.PathLike) -> dict[str, str]:
    """Writes every variant in SPECS into directory; returns name -> path."""
    return {name: write_model(spec, os.path.join(directory, f"{name}.gguf")) for name, spec in SPECS.items()}
