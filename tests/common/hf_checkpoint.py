"""Writes a Hugging Face model directory from a llama-family GGUF file, as the tests' and
benchmarks' source of the same model in both formats (hf_model_test.py, bench/hf_load_bench.py).

What it writes is what `transformers`' `save_pretrained` writes for these models:
  config.json              LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM fields
                           (rope_scaling given by the caller where the GGUF holds only
                           precomputed rope_freqs);
  model.safetensors        every tensor dequantized (gguf.quants) to `dtype`, under its HF
                           name, norms in float32; or shards + model.safetensors.index.json;
                           llama q/k rows un-permuted back to the rotate-half order (the GGUF
                           converter permutes them for interleaved RoPE);
  tokenizer.json           the GGUF vocabulary as `tokenizers` BPE (hf_reference.build_reference);
  tokenizer_config.json    chat_template, bos/eos token texts, add_bos_token;
  generation_config.json   bos/eos ids.
architecture="mistral3-mm" writes a llama-layout model as Mistral Small 3.1 is released
(Mistral3ForConditionalGeneration, every text field in text_config, language_model.* tensors,
a dummy vision tower and projector); architecture="gemma3-mm" a Gemma 3 model as Google released
the 4B-27B ones: a
Gemma3ForConditionalGeneration wrapper whose text_config leaves out every field equal to
transformers' Gemma3TextConfig default, the text model's tensors under language_model.*, a
(dummy) vision tower and projector beside them, and the chat template in chat_template.json;
architecture="qwen2-vl" a Qwen2 model as Qwen2.5-VL is released: Qwen2_5_VLForConditionalGeneration
with the text fields at the top level, M-RoPE's rope_scaling (replacing the GGUF's), and a
(dummy) visual.* tower beside the text model's tensors; architecture="qwen3moe-vl" a Qwen3-MoE
model as Qwen3-VL-MoE: Qwen3VLMoeForConditionalGeneration with the text model in text_config
(no norm_topk_prob: its router always renormalizes), model.language_model.* tensors, each
layer's experts fused into mlp.experts.gate_up_proj [E, hidden, 2 ffn] (gate columns, then
up) and mlp.experts.down_proj [E, ffn, hidden], and a (dummy) model.visual.* tower.
A glm4moe GGUF (GLM-4.5) is written as Glm4MoeForCausalLM: model_type glm4_moe,
num_hidden_layers without the MTP (nextn) layers, whose tensors follow as model.layers.N.*
(eh_proj, enorm, hnorm, shared_head.norm beside a whole layer), first_k_dense_replace dense
layers, n_routed_experts, n_shared_experts (mlp.shared_experts.*, ungated),
routed_scaling_factor, the router's mlp.gate.e_score_correction_bias in float32; its Q/K rows
are not permuted (NeoX rotary in both formats). An olmo2 GGUF is written as
Olmo2ForCausalLM, or with architecture="olmo3" as Olmo3ForCausalLM (its window and layer_types):
no input_layernorm, post_attention_layernorm and post_feedforward_layernorm after each
sub-layer, q_norm / k_norm as wide as all heads; an olmoe one as OlmoeForCausalLM (experts as
Qwen3-MoE names them, norm_topk_prob false, clip_qkv null); a granitemoe one as
GraniteMoeForCausalLM, or GraniteMoeSharedForCausalLM with a shared expert (Granite's
multipliers, block_sparse_moe.router.layer, stacked input_linear / output_linear experts,
shared_mlp.*).
"""
from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np

import hf_reference

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
}
_HF_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "qwen3moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
            "qwen2moe": "Qwen2MoeForCausalLM", "glm4moe": "Glm4MoeForCausalLM",
            "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
            "phi3": "Phi3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
            "granite": "GraniteForCausalLM", "glm4": "Glm4ForCausalLM",
            "gemma": "GemmaForCausalLM", "gpt-oss": "GptOssForCausalLM",
            "olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM", "olmoe": "OlmoeForCausalLM",
            "ernie4_5": "Ernie4_5ForCausalLM", "ernie4_5-moe": "Ernie4_5_MoeForCausalLM",
            "exaone4": "Exaone4ForCausalLM", "granitemoe": "GraniteMoeForCausalLM",
            "deepseek2": "DeepseekV2ForCausalLM", "deepseek3": "DeepseekV3ForCausalLM",
            # gpt-oss with its experts dequantized (as fine-tunes are saved): gate_up_proj and
            # down_proj, input-major, instead of MXFP4 blocks.
            "gpt-oss-dense": "GptOssForCausalLM"}
# transformers' Gemma3TextConfig defaults (what Gemma 3's multimodal configs leave out).
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": False,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_local_base_freq": 10000.0,
    "sliding_window_pattern": 6, "tie_word_embeddings": True}
# Architectures whose GGUF converter permutes q/k rows for interleaved RoPE.
_PERMUTED_ARCHS = ("llama", "mistral", "smollm3", "granite", "granitemoe")
# Granite's config.json multipliers and the GGUF keys llama.cpp's converter writes them to.
_GRANITE_MULTIPLIERS = {"embedding_multiplier": "embedding_scale",
                        "residual_multiplier": "residual_scale",
                        "attention_multiplier": "attention.scale", "logits_scaling": "logit_scale"}
# SmolLM3's config: every no_rope_layer_interval-th layer applies no RoPE (transformers' default
# for no_rope_layers, which its save_pretrained writes out as a list of 0/1 per layer).
SMOLLM3_NO_ROPE_INTERVAL = 4
# GLM-4's norms after each sub-layer: GGUF name -> HF name (its post_attention_layernorm is the
# pre-FFN norm, as everywhere).
_GLM4_NORMS = {"post_attention_norm.weight": "post_self_attn_layernorm.weight",
               "post_ffw_norm.weight": "post_mlp_layernorm.weight"}
# Gemma's norms: GGUF name -> HF name (the GGUF stores 1 + w, HF w).
_GEMMA_NORMS = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# OLMo 2's and 3's norms after each sub-layer (they have none before): GGUF name -> HF name.
_OLMO2_NORMS = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
# gpt-oss's tensors beside llama's: GGUF suffix -> HF suffix (its FFN norm is the GGUF's
# post_attention_norm, its experts are converted by _gpt_oss_experts).
_GPT_OSS_NAMES = {"attn_output.bias": "self_attn.o_proj.bias", "attn_sinks.weight": "self_attn.sinks",
                  "ffn_gate_inp.weight": "mlp.router.weight", "ffn_gate_inp.bias": "mlp.router.bias",
                  "post_attention_norm.weight": "post_attention_layernorm.weight"}
# GLM-4.5's tensors beside llama's and its experts (_MOE_NAMES): GGUF suffix -> HF suffix. Its
# FFN norm is the GGUF's post_attention_norm; the selection bias stays float32 as released; the
# multi-token-prediction layer (the last, numbered num_hidden_layers) adds eh_proj and its norms.
_GLM4MOE_NAMES = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                  "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
                  "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
                  "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
                  "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
                  "nextn.eh_proj.weight": "eh_proj.weight", "nextn.enorm.weight": "enorm.weight",
                  "nextn.hnorm.weight": "hnorm.weight",
                  "nextn.shared_head_norm.weight": "shared_head.norm.weight"}


def _mxfp4_blocks(tensor) -> tuple[np.ndarray, np.ndarray]:
    """A GGUF MXFP4 tensor [E, rows, cols] as transformers' gpt-oss checkpoints store it:
    blocks uint8 [E, rows, cols / 32, 16] (element 2i in byte i's low nibble, 2i + 1 in its high
    one; GGUF puts j < 16 in low nibbles, j + 16 in high ones) and E8M0 scales [E, rows, cols / 32]:
    the same values, repacked."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    raw = np.asarray(tensor.data, dtype=np.uint8).reshape(shape[0], shape[1], shape[2] // 32, 17)
    scales = raw[..., 0].copy()
    nibbles = np.concatenate([raw[..., 1:] & 0x0F, raw[..., 1:] >> 4], axis=-1)  # element order
    blocks = (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).astype(np.uint8)
    return blocks, scales


def _gpt_oss_experts(reader, layer: int, dense: bool = False) -> dict:
    """HF gpt-oss expert tensors of GGUF layer `layer`: gate and up interleaved by rows into
    gate_up_proj (even rows gate, odd rows up), MXFP4 kept as stored, biases as F32; with
    `dense`, the dequantized layout of fine-tunes instead: gate_up_proj [E, hidden, 2 ffn] and
    down_proj [E, ffn, hidden] (x times them, as transformers multiplies), float32."""
    tensors = {t.name: t for t in reader.tensors}
    p, out = f"blk.{layer}.", {}
    hf = f"model.layers.{layer}.mlp.experts."
    if dense:
        gate, up = dequantize(tensors[p + "ffn_gate_exps.weight"]), dequantize(tensors[p + "ffn_up_exps.weight"])
        gate_up = np.empty((gate.shape[0], 2 * gate.shape[1], gate.shape[2]), dtype=np.float32)
        gate_up[:, 0::2], gate_up[:, 1::2] = gate, up
        out[hf + "gate_up_proj"] = np.ascontiguousarray(gate_up.transpose(0, 2, 1))
        out[hf + "down_proj"] = np.ascontiguousarray(
            dequantize(tensors[p + "ffn_down_exps.weight"]).transpose(0, 2, 1))
        bias = np.empty((gate.shape[0], 2 * gate.shape[1]), dtype=np.float32)
        bias[:, 0::2] = dequantize(tensors[p + "ffn_gate_exps.bias"])
        bias[:, 1::2] = dequantize(tensors[p + "ffn_up_exps.bias"])
        out[hf + "gate_up_proj_bias"] = bias
        out[hf + "down_proj_bias"] = dequantize(tensors[p + "ffn_down_exps.bias"])
        return out
    gate_blocks, gate_scales = _mxfp4_blocks(tensors[p + "ffn_gate_exps.weight"])
    up_blocks, up_scales = _mxfp4_blocks(tensors[p + "ffn_up_exps.weight"])
    down_blocks, down_scales = _mxfp4_blocks(tensors[p + "ffn_down_exps.weight"])

    def interleave(gate, up):
        both = np.empty((gate.shape[0], 2 * gate.shape[1]) + gate.shape[2:], dtype=gate.dtype)
        both[:, 0::2], both[:, 1::2] = gate, up
        return both

    hf = f"model.layers.{layer}.mlp.experts."
    out[hf + "gate_up_proj_blocks"] = interleave(gate_blocks, up_blocks)
    out[hf + "gate_up_proj_scales"] = interleave(gate_scales, up_scales)
    out[hf + "gate_up_proj_bias"] = interleave(dequantize(tensors[p + "ffn_gate_exps.bias"]),
                                               dequantize(tensors[p + "ffn_up_exps.bias"]))
    out[hf + "down_proj_blocks"], out[hf + "down_proj_scales"] = down_blocks, down_scales
    out[hf + "down_proj_bias"] = dequantize(tensors[p + "ffn_down_exps.bias"])
    return out


def _fused_experts(reader, layer: int) -> dict:
    """Qwen3-VL-MoE's expert tensors of GGUF layer `layer`: gate_up_proj [E, hidden, 2 ffn]
    (x times it: the gate's columns, then up's) and down_proj [E, ffn, hidden], float32."""
    tensors = {t.name: t for t in reader.tensors}
    p = f"blk.{layer}."
    gate, up, down = (dequantize(tensors[p + f"ffn_{role}_exps.weight"]) for role in ("gate", "up", "down"))
    hf = f"model.layers.{layer}.mlp.experts."
    return {hf + "gate_up_proj": np.ascontiguousarray(np.concatenate([gate, up], axis=1).transpose(0, 2, 1)),
            hf + "down_proj": np.ascontiguousarray(down.transpose(0, 2, 1))}


# DeepSeek-V2/V3's tensors beside llama's: GGUF suffix -> HF suffix (attn_k_b / attn_v_b, the
# split llama.cpp writes for its absorbed MLA, are joined back into kv_b_proj).
_DEEPSEEK_NAMES = {"attn_q_a.weight": "self_attn.q_a_proj.weight",
                   "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
                   "attn_q_b.weight": "self_attn.q_b_proj.weight",
                   "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
                   "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
                   "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
                   "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
                   "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
                   "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
                   "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight"}


def _deepseek_kv_b(reader, layer: int) -> np.ndarray:
    """kv_b_proj [heads * (nope + value), latent] (each head's key rows, then its value rows)
    from a GGUF's attn_k_b [heads, latent, nope] and attn_v_b [heads, value, latent]."""
    tensors = {t.name: t for t in reader.tensors}
    k_b = dequantize(tensors[f"blk.{layer}.attn_k_b.weight"]).transpose(0, 2, 1)
    v_b = dequantize(tensors[f"blk.{layer}.attn_v_b.weight"])
    return np.concatenate([k_b, v_b], axis=1).reshape(-1, v_b.shape[2])


# Mixture-of-experts names: (router, expert E's gate, up, down) per HF architecture.
_MOE_NAMES = {
    "mixtral": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.w1.weight",
                "block_sparse_moe.experts.{e}.w3.weight", "block_sparse_moe.experts.{e}.w2.weight"),
    "qwen3moe": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                 "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    "qwen2moe": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                 "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    "glm4moe": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    "deepseek2": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                  "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    "deepseek3": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                  "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    "olmoe": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
              "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    "ernie4_5-moe": ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                     "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
}
# ERNIE 4.5's selection bias ([1, experts], float32) and shared experts, by GGUF suffix.
_ERNIE_MOE_NAMES = {"exp_probs_b.bias": "mlp.moe_statics.e_score_correction_bias",
                    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
                    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
                    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight"}
# Qwen2-MoE's shared expert and its gate ([1, hidden] in HF checkpoints).
_SHARED_EXPERT_NAMES = {"ffn_gate_shexp": "mlp.shared_expert.gate_proj.weight",
                        "ffn_up_shexp": "mlp.shared_expert.up_proj.weight",
                        "ffn_down_shexp": "mlp.shared_expert.down_proj.weight",
                        "ffn_gate_inp_shexp": "mlp.shared_expert_gate.weight"}


def _expert_tensors(hf_arch: str, gguf_name: str, values: np.ndarray) -> dict:
    """HF tensors of a GGUF mixture-of-experts tensor (blk.L.ffn_gate_inp, a stacked
    blk.L.ffn_gate_exps or a per-expert blk.L.ffn_gate.E), or {} for another tensor."""
    parts = gguf_name.split(".")
    if hf_arch not in _MOE_NAMES or parts[0] != "blk":
        return {}
    router, *expert_names = _MOE_NAMES[hf_arch]
    prefix = f"model.layers.{parts[1]}."
    if parts[2] == "ffn_gate_inp":
        return {prefix + router: values}
    if parts[2] in _SHARED_EXPERT_NAMES:
        if parts[2] == "ffn_gate_inp_shexp":
            values = values.reshape(1, -1)
        return {prefix + _SHARED_EXPERT_NAMES[parts[2]]: values}
    roles = ("ffn_gate", "ffn_up", "ffn_down")
    role = parts[2].removesuffix("_exps")
    if role not in roles:
        return {}
    template = expert_names[roles.index(role)]
    if parts[2].endswith("_exps"):
        return {prefix + template.format(e=e): values[e] for e in range(values.shape[0])}
    return {prefix + template.format(e=int(parts[3])): values}


# GraniteMoe's fused tensors (transformers' GraniteMoeParallelExperts: [E, out, in] stacks; the
# gate's rows, then up's): GGUF suffix -> (HF suffix, the GGUF suffixes concatenated by rows).
_GRANITE_MOE = {
    "ffn_gate_inp.weight": ("block_sparse_moe.router.layer.weight", ("ffn_gate_inp.weight",)),
    "ffn_gate_exps.weight": ("block_sparse_moe.input_linear.weight",
                             ("ffn_gate_exps.weight", "ffn_up_exps.weight")),
    "ffn_up_exps.weight": (None, ()),
    "ffn_down_exps.weight": ("block_sparse_moe.output_linear.weight", ("ffn_down_exps.weight",)),
    "ffn_gate_shexp.weight": ("shared_mlp.input_linear.weight",
                              ("ffn_gate_shexp.weight", "ffn_up_shexp.weight")),
    "ffn_up_shexp.weight": (None, ()),
    "ffn_down_shexp.weight": ("shared_mlp.output_linear.weight", ("ffn_down_shexp.weight",)),
}


def _granite_moe_tensors(reader, layer: int, suffix: str) -> dict:
    """The HF tensor a GraniteMoe GGUF tensor becomes ({} for up, which joins gate's)."""
    hf, parts = _GRANITE_MOE[suffix]
    if hf is None:
        return {}
    tensors = {t.name: t for t in reader.tensors}
    values = [dequantize(tensors[f"blk.{layer}.{part}"]) for part in parts]
    return {f"model.layers.{layer}.{hf}": np.concatenate(values, axis=-2)}


def hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".", 2)
    if parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None  # rope_freqs.weight: HF recomputes it from rope_scaling


def _field(reader, key, default=None):
    field = reader.get_field(key)
    return default if field is None else field.contents()


def dequantize(tensor) -> np.ndarray:
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return np.asarray(values, dtype=np.float32).reshape(shape)


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of the GGUF converter's llama q/k permutation."""
    head_dim = weight.shape[0] // heads
    return weight.reshape(heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def _deepseek_config(reader, arch: str, config: dict, n_expert: int, hf_arch: str) -> dict:
    """DeepseekV2Config / DeepseekV3Config fields of a deepseek2 GGUF: the latent attention's
    widths, its experts and routing (topk_method noaux_tc for a sigmoid router, greedy without
    groups, group_limited_greedy with), YaRN's mscales from yarn_log_multiplier."""
    key = int(_field(reader, f"{arch}.attention.key_length_mla", 0) or
              _field(reader, f"{arch}.attention.key_length"))
    value = int(_field(reader, f"{arch}.attention.value_length_mla", 0) or
                _field(reader, f"{arch}.attention.value_length"))
    rope = int(_field(reader, f"{arch}.rope.dimension_count"))
    groups = int(_field(reader, f"{arch}.expert_group_count", 1) or 1)
    sigmoid = int(_field(reader, f"{arch}.expert_gating_func", 1) or 1) == 2
    config.pop("num_experts", None)
    config.pop("head_dim", None)
    fields = {
        "model_type": "deepseek_v3" if hf_arch == "deepseek3" else "deepseek_v2",
        "num_key_value_heads": config["num_attention_heads"],
        "q_lora_rank": _field(reader, f"{arch}.attention.q_lora_rank"),
        "kv_lora_rank": int(_field(reader, f"{arch}.attention.kv_lora_rank")),
        "qk_nope_head_dim": key - rope, "qk_rope_head_dim": rope, "v_head_dim": value,
        "first_k_dense_replace": int(_field(reader, f"{arch}.leading_dense_block_count", 0) or 0),
        "n_routed_experts": n_expert,
        "n_shared_experts": int(_field(reader, f"{arch}.expert_shared_count", 0) or 0),
        "routed_scaling_factor": float(_field(reader, f"{arch}.expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(_field(reader, f"{arch}.expert_weights_norm", False)),
        "scoring_func": "sigmoid" if sigmoid else "softmax",
        "topk_method": "noaux_tc" if sigmoid else ("group_limited_greedy" if groups > 1 else "greedy"),
        "n_group": groups, "topk_group": int(_field(reader, f"{arch}.expert_group_used_count", 1) or 1),
        "moe_layer_freq": 1,
    }
    if _field(reader, f"{arch}.rope.scaling.type") == "yarn":
        mscale = float(_field(reader, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        fields["rope_scaling"] = {
            "type": "yarn", "factor": float(_field(reader, f"{arch}.rope.scaling.factor")),
            "original_max_position_embeddings": int(_field(reader, f"{arch}.rope.scaling.original_context_length")),
            "beta_fast": 32, "beta_slow": 1, "mscale": mscale, "mscale_all_dim": mscale}
    return fields


def write_hf_directory(gguf_path, out_dir, dtype="float16", shards=1, rope_scaling=None,
                       architecture=None) -> pathlib.Path:
    """Writes the HF directory of the GGUF at `gguf_path` into `out_dir` (created)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(gguf_path))
    arch = _field(reader, "general.architecture")
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_head_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_head))
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head))

    multimodal = architecture in ("gemma3-mm", "mistral3-mm")
    wrapper = {"gemma3-mm": ("Gemma3ForConditionalGeneration", "gemma3", "gemma3_text"),
               "mistral3-mm": ("Mistral3ForConditionalGeneration", "mistral3", "mistral")}.get(architecture)
    if multimodal:
        architecture = {"gemma3-mm": "gemma3", "mistral3-mm": "mistral"}[architecture]
    qwen_vl = architecture == "qwen2-vl"
    if qwen_vl:
        architecture = "qwen2"
    qwen3_vl_moe = architecture == "qwen3moe-vl"
    if qwen3_vl_moe:
        architecture = "qwen3moe"
    hf_arch = architecture or arch
    gemma = hf_arch in ("gemma2", "gemma3")  # four norms per layer, Gemma's names
    gemma1 = hf_arch == "gemma"  # Gemma's 1 + w norms under llama's two names
    tensors = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        suffix = tensor.name.split(".", 2)[-1]
        if hf_arch in ("phi3", "glm4") and suffix == "ffn_up.weight":
            name = f"model.layers.{tensor.name.split('.')[1]}.mlp.gate_up_proj.weight"
        if hf_arch == "glm4" and suffix in _GLM4_NORMS:
            name = f"model.layers.{tensor.name.split('.')[1]}.{_GLM4_NORMS[suffix]}"
        if hf_arch in ("olmo2", "olmo3", "exaone4") and suffix in _OLMO2_NORMS:
            name = f"model.layers.{tensor.name.split('.')[1]}.{_OLMO2_NORMS[suffix]}"
        if gemma and tensor.name.startswith("blk.") and suffix in _GEMMA_NORMS:
            name = f"model.layers.{tensor.name.split('.')[1]}.{_GEMMA_NORMS[suffix]}"
        if qwen3_vl_moe and suffix.endswith("_exps.weight"):
            if suffix == "ffn_gate_exps.weight":
                tensors.update(_fused_experts(reader, int(tensor.name.split(".")[1])))
            continue
        if hf_arch in ("gpt-oss", "gpt-oss-dense") and tensor.name.startswith("blk."):
            if suffix == "ffn_gate_exps.weight":
                tensors.update(_gpt_oss_experts(reader, int(tensor.name.split(".")[1]),
                                                dense=hf_arch == "gpt-oss-dense"))
            if "_exps." in suffix:
                continue
            if suffix in _GPT_OSS_NAMES:
                name = f"model.layers.{tensor.name.split('.')[1]}.{_GPT_OSS_NAMES[suffix]}"
        if hf_arch == "glm4moe" and tensor.name.startswith("blk.") and suffix in _GLM4MOE_NAMES:
            name = f"model.layers.{tensor.name.split('.')[1]}.{_GLM4MOE_NAMES[suffix]}"
        if hf_arch in ("deepseek2", "deepseek3") and tensor.name.startswith("blk."):
            if suffix in _DEEPSEEK_NAMES:
                name = f"model.layers.{tensor.name.split('.')[1]}.{_DEEPSEEK_NAMES[suffix]}"
            elif suffix == "attn_k_b.weight":
                layer = int(tensor.name.split(".")[1])
                tensors[f"model.layers.{layer}.{_DEEPSEEK_NAMES['attn_kv_b.weight']}"] = (
                    _deepseek_kv_b(reader, layer).astype(np.float32 if dtype == "float32" else np.float16))
                continue
            elif suffix == "attn_v_b.weight":
                continue
        if hf_arch == "ernie4_5-moe" and tensor.name.startswith("blk.") and suffix in _ERNIE_MOE_NAMES:
            name = f"model.layers.{tensor.name.split('.')[1]}.{_ERNIE_MOE_NAMES[suffix]}"
        if hf_arch == "granitemoe" and tensor.name.startswith("blk.") and suffix in _GRANITE_MOE:
            experts = _granite_moe_tensors(reader, int(tensor.name.split(".")[1]), suffix)
        else:
            experts = {} if name is not None else _expert_tensors(hf_arch, tensor.name, dequantize(tensor))
        if hf_arch == "granitemoe" and suffix in _GRANITE_MOE:
            for expert_name, values in experts.items():
                tensors[expert_name] = values.astype(np.float32 if dtype == "float32" else np.float16)
            continue
        if experts:
            for expert_name, values in experts.items():
                tensors[expert_name] = values.astype(np.float32 if dtype == "float32" else np.float16)
            continue
        if name is None:
            continue
        values = dequantize(tensor)
        if arch in _PERMUTED_ARCHS and tensor.name.endswith("attn_q.weight"):
            values = unpermute(values, n_head)
        elif arch in _PERMUTED_ARCHS and tensor.name.endswith("attn_k.weight"):
            values = unpermute(values, n_head_kv)
        if (gemma or gemma1) and tensor.name.endswith("norm.weight"):
            values = values - 1.0  # Gemma's RMSNorm scales by 1 + w
        keep_f32 = values.ndim == 1 or dtype == "float32"
        if dtype == "bfloat16" and not keep_f32:
            # numpy has no bfloat16: round to nearest even in the top 16 bits of float32.
            bits = values.astype(np.float32).view(np.uint32)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            tensors[name] = bits  # written with dtype BF16 below
        else:
            tensors[name] = values.astype(np.float32 if keep_f32 else np.float16)
        if suffix == "exp_probs_b.bias" and hf_arch == "ernie4_5-moe":
            tensors[name] = values.astype(np.float32).reshape(1, -1)  # [1, experts], float32
    tied = "lm_head.weight" not in tensors
    if multimodal:
        tensors = {("language_model." + name if name.startswith(("model.", "lm_head.")) else name): values
                   for name, values in tensors.items()}
        tensors["vision_tower.vision_model.embeddings.patch_embedding.weight"] = np.zeros((8, 3, 2, 2), np.float32)
        tensors["multi_modal_projector.mm_input_projection_weight"] = np.zeros((8, n_embd), np.float32)
    if qwen3_vl_moe:
        tensors = {("model.language_model." + name[len("model."):] if name.startswith("model.") else name): values
                   for name, values in tensors.items()}
        tensors["model.visual.patch_embed.proj.weight"] = np.zeros((8, 3, 2, 2, 2), np.float32)
    if qwen_vl:
        tensors["visual.patch_embed.proj.weight"] = np.zeros((8, 3, 2, 2, 2), np.float32)
        tensors["visual.merger.mlp.0.weight"] = np.zeros((8, 8), np.float32)
    if hf_arch == "ernie4_5-moe":
        tensors["model.mtp_emb_norm.0.weight"] = np.ones(n_embd, np.float32)  # skipped by loaders
    _save(tensors, out, shards, bf16=dtype == "bfloat16")

    vocab_rows = tensors["model.language_model.embed_tokens.weight" if qwen3_vl_moe else
                         ("language_model." if multimodal else "") + "model.embed_tokens.weight"].shape[0]
    config = {
        "architectures": [_HF_ARCH[architecture or arch]],
        "model_type": architecture or arch,
        "hidden_size": n_embd,
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "head_dim": head_dim,
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length")),
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": tied,
        "vocab_size": vocab_rows,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in tensors,
        "torch_dtype": dtype,
    }
    if gemma1:
        config["hidden_act"] = "gelu"  # gemma-7b's config: transformers runs tanh GELU for it
    if gemma:
        config.pop("hidden_act")
        config.update({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": head_dim,
                       "sliding_window": int(_field(reader, f"{arch}.attention.sliding_window"))})
    if hf_arch == "gemma3":
        config.update({"rope_local_base_freq": 10000.0, "sliding_window_pattern": 6})
    if hf_arch == "gemma2":
        # Gemma 2's config.json has no layer pattern (every other layer local) and says its caps.
        config.update({"attn_logit_softcapping": float(_field(reader, f"{arch}.attn_logit_softcapping")),
                       "final_logit_softcapping": float(_field(reader, f"{arch}.final_logit_softcapping")),
                       "cache_implementation": "hybrid"})
    if hf_arch == "smollm3":
        layers = config["num_hidden_layers"]
        config.update({"no_rope_layer_interval": SMOLLM3_NO_ROPE_INTERVAL,
                       "no_rope_layers": [int((i + 1) % SMOLLM3_NO_ROPE_INTERVAL != 0)
                                          for i in range(layers)],
                       "use_sliding_window": False, "sliding_window": None,
                       "layer_types": ["full_attention"] * layers})
    if hf_arch == "olmo3":
        layers = config["num_hidden_layers"]
        config.update({"sliding_window": int(_field(reader, f"{arch}.attention.sliding_window")),
                       "layer_types": ["sliding_attention" if (i + 1) % 4 else "full_attention"
                                       for i in range(layers)]})
    if hf_arch == "olmoe":
        config.update({"norm_topk_prob": False, "clip_qkv": None})
    if hf_arch == "exaone4":
        # EXAONE-4.0-32B's config: the window and its pattern as letters (no layer_types).
        config.update({"sliding_window": int(_field(reader, f"{arch}.attention.sliding_window")),
                       "sliding_window_pattern": "LLLG"})
    if hf_arch == "ernie4_5":
        config.update({"use_bias": False, "model_type": "ernie4_5"})
    if hf_arch == "ernie4_5-moe":
        # Ernie4_5_MoeConfig: moe_* fields; the MTP layer's tensors (model.mtp_*) beside the
        # model's, which a loader skips.
        layers = config["num_hidden_layers"]
        config.update({
            "model_type": "ernie4_5_moe", "use_bias": False,
            "moe_num_experts": int(_field(reader, f"{arch}.expert_count")),
            "moe_k": int(_field(reader, f"{arch}.expert_used_count")),
            "moe_intermediate_size": int(_field(reader, f"{arch}.expert_feed_forward_length")),
            "moe_num_shared_experts": int(_field(reader, f"{arch}.expert_shared_count", 0)),
            "moe_layer_start_index": int(_field(reader, f"{arch}.leading_dense_block_count", 0)),
            "moe_layer_end_index": layers - 1, "moe_layer_interval": 1,
            "moe_norm_min": 1e-12, "num_nextn_predict_layers": 1})
    if hf_arch == "glm4":
        rotated = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
        config["partial_rotary_factor"] = rotated / head_dim
    if hf_arch in ("granite", "granitemoe"):
        config.update({field: float(_field(reader, f"{arch}.{key}"))
                       for field, key in _GRANITE_MULTIPLIERS.items()})
    if hf_arch == "granitemoe":
        # GraniteMoeConfig: intermediate_size is each expert's width; GraniteMoeSharedConfig
        # adds the shared expert's (shared_intermediate_size).
        shared = _field(reader, f"{arch}.expert_shared_feed_forward_length")
        if shared:
            config.update({"architectures": ["GraniteMoeSharedForCausalLM"],
                           "model_type": "granitemoeshared", "shared_intermediate_size": int(shared)})
    if hf_arch in ("gpt-oss", "gpt-oss-dense"):
        layers = config["num_hidden_layers"]
        config.update({"sliding_window": int(_field(reader, f"{arch}.attention.sliding_window")),
                       "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                                       for i in range(layers)],
                       "swiglu_limit": float(_field(reader, "loom.swiglu_limit", 7.0)),
                       "experts_per_token": int(_field(reader, f"{arch}.expert_used_count")),
                       "model_type": "gpt_oss"})
        if hf_arch == "gpt-oss":
            config["quantization_config"] = {"quant_method": "mxfp4"}
    if any(t.name == "rope_factors_long.weight" for t in reader.tensors):
        factors = {t.name: dequantize(t).tolist() for t in reader.tensors if t.name.startswith("rope_factors")}
        config["original_max_position_embeddings"] = int(
            _field(reader, f"{arch}.rope.scaling.original_context_length"))
        config["rope_scaling"] = {"type": "longrope", "long_factor": factors["rope_factors_long.weight"],
                                  "short_factor": factors["rope_factors_short.weight"]}
    n_expert = _field(reader, f"{arch}.expert_count")
    if n_expert and hf_arch != "ernie4_5-moe":
        config["num_local_experts" if hf_arch in ("mixtral", "gpt-oss", "gpt-oss-dense", "granitemoe")
               else "num_experts"] = int(n_expert)
        config["num_experts_per_tok"] = int(_field(reader, f"{arch}.expert_used_count"))
        if _field(reader, f"{arch}.expert_feed_forward_length") is not None:
            config["moe_intermediate_size"] = int(_field(reader, f"{arch}.expert_feed_forward_length"))
        if hf_arch in ("qwen3moe", "qwen2moe"):
            config["norm_topk_prob"] = bool(_field(reader, f"{arch}.expert_weights_norm",
                                                   hf_arch == "qwen3moe"))
            config["decoder_sparse_step"] = 1
            config["mlp_only_layers"] = []
        if (hf_arch != "granitemoe" and
                _field(reader, f"{arch}.expert_shared_feed_forward_length") is not None):
            config["shared_expert_intermediate_size"] = int(
                _field(reader, f"{arch}.expert_shared_feed_forward_length"))
    if hf_arch == "glm4moe":
        # Glm4MoeConfig: num_hidden_layers leaves out the MTP layers the GGUF's block_count
        # counts; one expert group (n_group, topk_group 1: no group-limited routing).
        nextn = int(_field(reader, f"{arch}.nextn_predict_layers", 0) or 0)
        rotated = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
        config.pop("num_experts", None)
        config.update({
            "model_type": "glm4_moe",
            "num_hidden_layers": config["num_hidden_layers"] - nextn,
            "num_nextn_predict_layers": nextn,
            "first_k_dense_replace": int(_field(reader, f"{arch}.leading_dense_block_count", 0) or 0),
            "n_routed_experts": int(n_expert),
            "n_shared_experts": int(_field(reader, f"{arch}.expert_shared_count", 1)),
            "routed_scaling_factor": float(_field(reader, f"{arch}.expert_weights_scale", 1.0)),
            "norm_topk_prob": bool(_field(reader, f"{arch}.expert_weights_norm", True)),
            "n_group": 1, "topk_group": 1,
            "partial_rotary_factor": rotated / head_dim,
            "use_qk_norm": "model.layers.0.self_attn.q_norm.weight" in tensors,
        })
    if hf_arch in ("deepseek2", "deepseek3"):
        config.update(_deepseek_config(reader, arch, config, int(n_expert or 0), hf_arch))
    scaling_type = _field(reader, f"{arch}.rope.scaling.type")
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    elif scaling_type == "linear":
        config["rope_scaling"] = {"rope_type": "linear",
                                  "factor": float(_field(reader, f"{arch}.rope.scaling.factor"))}
    if multimodal:
        defaults = GEMMA3_TEXT_DEFAULTS if wrapper[2] == "gemma3_text" else {}
        text = {key: value for key, value in config.items()
                if key not in ("architectures", "model_type", "torch_dtype")
                and not (key in defaults and defaults[key] == value)}
        config = {"architectures": [wrapper[0]], "model_type": wrapper[1],
                  "text_config": {**text, "model_type": wrapper[2]},
                  "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8},
                  "image_token_index": vocab_rows - 1, "torch_dtype": dtype}
    if qwen3_vl_moe:
        half = head_dim // 2
        text = {key: value for key, value in config.items()
                if key not in ("architectures", "model_type", "torch_dtype", "norm_topk_prob")}
        text.update({"model_type": "qwen3_vl_moe_text",
                     "rope_scaling": {"mrope_interleaved": True, "rope_type": "default",
                                      "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8]}})
        config = {"architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
                  "text_config": text, "vision_config": {"model_type": "qwen3_vl_moe", "depth": 1},
                  "tie_word_embeddings": config["tie_word_embeddings"], "torch_dtype": dtype}
    if qwen_vl:
        half = head_dim // 2
        config.update({"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
                       "rope_scaling": {"type": "mrope", "mrope_section": [half // 4, 3 * half // 8,
                                                                           3 * half // 8]},
                       "vision_config": {"model_type": "qwen2_5_vl", "hidden_size": 8},
                       "vision_start_token_id": vocab_rows - 1})
    (out / "config.json").write_text(json.dumps(config, indent=2))

    tokens, types, _ = hf_reference.read_vocab(gguf_path)
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in ("smollm", "gpt-2"):
        raise NotImplementedError(f"tokenizer.ggml.pre {pre!r}")
    tokenizer = hf_reference.build_reference(gguf_path, individual_digits=pre == "smollm")
    tokenizer.save(str(out / "tokenizer.json"))
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    tokenizer_config = {
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "chat_template": _field(reader, "tokenizer.chat_template"),
    }
    if bos is not None:
        tokenizer_config["bos_token"] = tokens[int(bos)]
    if eos is not None:
        tokenizer_config["eos_token"] = tokens[int(eos)]
    if multimodal:
        chat = {"chat_template": tokenizer_config.pop("chat_template")}
        (out / "chat_template.json").write_text(json.dumps(chat, indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    generation = {"bos_token_id": None if bos is None else int(bos),
                  "eos_token_id": None if eos is None else int(eos)}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out


def _save(tensors: dict, out: pathlib.Path, shards: int, bf16: bool):
    names = list(tensors)
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for index, group in enumerate(groups):
        file = "model.safetensors" if shards == 1 else f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(out / file, {name: tensors[name] for name in group}, bf16)
        weight_map.update({name: file for name in group})
    if shards > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))


def write_safetensors(path: pathlib.Path, tensors: dict, bf16: bool = False):
    """The safetensors layout (8-byte header length, JSON header padded to 8 bytes, data).
    Written here rather than with safetensors.numpy because numpy has no bfloat16: with
    `bf16`, uint16 arrays hold bfloat16 bit patterns. The tests read the files back with the
    `safetensors` package as a check of this writer."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(np.uint16): "BF16" if bf16 else "U16", np.dtype(np.int32): "I32",
             np.dtype(np.uint8): "F8_E4M3"}
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, array in tensors.items():
        size = array.nbytes
        dtype = names[array.dtype]
        if name.endswith(("_blocks", "_scales")):
            dtype = "U8"  # MXFP4 nibbles and exponents (gpt-oss)
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array).tobytes())
