"""Loom serving Hugging Face model directories (config.json + safetensors + tokenizer.json +
tokenizer_config.json + generation_config.json), checked against the same model as GGUF.

The directories are written in a test step by tests/common/hf_checkpoint.py from GGUF files:
the default model (SmolLM2-135M Q4_1, dequantized to float32 in two shards and to bfloat16) and
the random models of random_model.py (Llama with GQA, Llama 3 with llama3 RoPE scaling given as
HF rope_scaling, Mistral = the GQA model as MistralForCausalLM, Qwen2 with Q/K/V biases and linear
scaling, Qwen3 with QK-norm and head_dim != hidden / heads, Qwen3-MoE and Mixtral mixtures of
experts, Qwen2-MoE's experts beside its gated shared expert, GLM-4.5 (sigmoid routing with a
selection bias, an ungated shared expert, a dense first layer, an MTP layer to skip), Gemma 1
and 3 (3 also as the Gemma3ForConditionalGeneration wrapper the 4B-27B checkpoints are), Llama
GQA as Mistral Small 3.1's text model (Mistral3ForConditionalGeneration), Qwen2 as Qwen2.5-VL's text
model, Qwen3-MoE as Qwen3-VL-MoE's (experts fused per layer), Phi-3 with longrope, SmolLM3 with a NoPE layer, Granite with its
multipliers, GLM-4, gpt-oss with MXFP4 experts;
DeepSeek-V2 and V3 with multi-head latent attention (V3: kv_b_proj joined from llama.cpp's split, grouped
sigmoid routing); Qwen2 and Llama with YaRN
rope_scaling, checked against llama_reference.yarn_parameters). Llama q/k rows are un-permuted back
to HF's rotate-half order, so these tests fail if Loom rotates HF checkpoints like GGUF ones.

Tolerances (max |Δ logit|):
  SmolLM2 float32 directory vs the Q4_1 GGUF run   <= 2e-2  (measured 3.3e-3: the same weight
      values, but F32 matmuls instead of the INT4 kernel's)
  SmolLM2 bfloat16 directory vs the GGUF run       <= 0.4   (measured 0.10: bf16 rounding of
      every weight, 8 bits of mantissa)
  random models' float32 directories vs the float64 numpy reference (llama_reference.py, an
      independent implementation, fed the GGUF)   <= 1e-3 (TOL_F32_KV of forward_pass_test.py)
Tensor parallelism (TP=2) of the directories is in tests/cluster/hf_tensor_parallel_test.py.
"""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))

from conftest import BUILD_DIR, tool_path  # noqa: E402
import hf_checkpoint  # noqa: E402
import llama_reference as ref  # noqa: E402
import forward_pass_test as mrt  # noqa: E402
import random_model  # noqa: E402
import tokenizer_test  # noqa: E402

TOL_F32_VS_GGUF = 2e-2
TOL_BF16_VS_GGUF = 0.4
TOL_REFERENCE = 1e-3
GREEDY_TOKENS = 24

# YaRN stretching a 64-token pre-training context 4x (the random models' context is 256).
YARN_SCALING = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}

# name -> (random_model spec, HF architecture, rope_scaling for config.json)
RANDOM_FAMILIES = {
    "llama": (random_model.SPECS["llama_gqa"], None, None),
    "llama3": (random_model.SPECS["llama3_rope"], None,
               {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": (random_model.SPECS["llama_gqa"], "mistral", None),
    "qwen2": (random_model.SPECS["qwen2_mqa"], None, None),
    "qwen3": (random_model.QWEN3_SPEC, None, None),
    # YaRN over the GGUF's linear scaling: the directory's config.json says yarn, and the
    # reference recomputes its RoPE from that rope_scaling (with_hf_rope_scaling).
    "qwen2_yarn": (random_model.SPECS["qwen2_mqa"], None, YARN_SCALING),
    "llama_yarn": (random_model.SPECS["llama_gqa"], None, {**YARN_SCALING, "beta_fast": 8.0,
                                                           "attention_factor": 1.3}),
    # Mixtures of experts: Qwen3MoeForCausalLM (mlp.experts.E.*_proj, norm_topk_prob) and
    # MixtralForCausalLM (block_sparse_moe.experts.E.w1/w3/w2), one tensor per expert.
    "qwen3moe": (random_model.SPECS["qwen3moe_top8"], None, None),
    "mixtral": (random_model.SPECS["mixtral_top2"], "mixtral", None),
    # Qwen2MoeForCausalLM: the experts beside mlp.shared_expert.*_proj and its [1, hidden]
    # mlp.shared_expert_gate, shared_expert_intermediate_size, norm_topk_prob false.
    "qwen2moe": (random_model.SPECS["qwen2moe_shared"], None, None),
    # Glm4MoeForCausalLM (GLM-4.5): first_k_dense_replace dense layers, then mlp.gate with its
    # e_score_correction_bias, mlp.experts.E.*_proj and mlp.shared_experts.*_proj (ungated),
    # routed_scaling_factor, partial_rotary_factor, and the MTP layer model.layers.3.* after
    # num_hidden_layers 3 (eh_proj, enorm, hnorm, shared_head.norm beside a whole layer).
    "glm4moe": (random_model.SPECS["glm4moe"], None, None),
    # DeepseekV2ForCausalLM (DeepSeek-V2-Lite's layout): multi-head latent attention
    # (self_attn.q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj), softmax routing not
    # renormalized (topk_method greedy), two shared experts, YaRN with mscale / mscale_all_dim.
    "deepseek2": (random_model.SPECS["deepseek2_lite"], None, None),
    # DeepseekV3ForCausalLM: queries through q_a_proj / q_a_layernorm / q_b_proj, kv_b_proj
    # joined from the GGUF's attn_k_b / attn_v_b, sigmoid scores with e_score_correction_bias
    # in the best topk_group of n_group groups (topk_method noaux_tc), norm_topk_prob.
    "deepseek3": (random_model.SPECS["deepseek2_qlora"], "deepseek3", None),
    # Olmo3ForCausalLM (OLMo 2's layout, whose GGUFs are olmo2 ones): no input_layernorm,
    # post_attention_layernorm / post_feedforward_layernorm after each sub-layer, q_norm and
    # k_norm over all heads, sliding_window with layer_types.
    "olmo3": (random_model.SPECS["olmo2_swa"], "olmo3", None),
    # OlmoeForCausalLM: llama's norms, the all-heads QK-norm, experts, norm_topk_prob false.
    "olmoe": (random_model.SPECS["olmoe"], None, None),
    # Ernie4_5ForCausalLM: llama's names, rows in interleaved-pair order (not permuted),
    # use_bias false.
    "ernie45": (random_model.SPECS["ernie45"], None, None),
    # Ernie4_5_MoeForCausalLM: moe_* fields, mlp.moe_statics.e_score_correction_bias [1, E],
    # mlp.shared_experts.*, and an MTP tensor (model.mtp_*) the loader skips.
    "ernie45_moe": (random_model.SPECS["ernie45_moe"], None, None),
    # Exaone4ForCausalLM: OLMo 2's norm names, per-head q_norm / k_norm, sliding_window with
    # its pattern as letters ("LLLG"), global layers without RoPE.
    "exaone4": (random_model.SPECS["exaone4_swa"], None, None),
    # Gemma3ForCausalLM: norms stored as w (scale 1 + w), sandwich norm names, GELU,
    # query_pre_attn_scalar, rope_local_base_freq, every 6th layer global.
    "gemma3": (random_model.SPECS["gemma3_swa"], None, None),
    # The same as Gemma3ForConditionalGeneration (Gemma 3 4B-27B as released): text_config
    # over transformers' defaults, language_model.* tensors beside a vision tower Loom skips,
    # the chat template in chat_template.json.
    "gemma3_mm": (random_model.SPECS["gemma3_swa"], "gemma3-mm", None),
    # Mistral3ForConditionalGeneration (Mistral Small 3.1): a Mistral text model under
    # language_model.*, its tied LM head named in text_config.
    "mistral3_mm": (random_model.SPECS["llama_gqa"], "mistral3-mm", None),
    # Qwen2_5_VLForConditionalGeneration: a Qwen2 text model beside visual.*, its M-RoPE
    # rope_scaling (text-only positions rotate as plain RoPE: the reference drops the GGUF's
    # linear factor).
    "qwen2_vl": (random_model.SPECS["qwen2_mqa"], "qwen2-vl", None),
    # Qwen3VLMoeForConditionalGeneration: Qwen3-MoE's text model with each layer's experts fused
    # into gate_up_proj / down_proj, model.language_model.* names, interleaved M-RoPE.
    "qwen3moe_vl": (random_model.SPECS["qwen3moe_top8"], "qwen3moe-vl", None),
    # Gemma2ForCausalLM: the same layout, soft-capped scores and logits, every other layer
    # global with no pattern key.
    "gemma2": (random_model.SPECS["gemma2_softcap"], None, None),
    # Phi3ForCausalLM: qkv_proj and gate_up_proj fused, longrope factors in rope_scaling.
    "phi3": (random_model.SPECS["phi3_longrope"], None, None),
    # SmolLM3ForCausalLM: llama's layout with no_rope_layers (every 4th layer without RoPE).
    "smollm3": (random_model.SPECS["smollm3_nope"], None, None),
    # GraniteForCausalLM: embedding_multiplier, attention_multiplier, residual_multiplier and
    # logits_scaling.
    "granite": (random_model.SPECS["granite_scaled"], None, None),
    # GraniteMoeSharedForCausalLM: Granite's multipliers, block_sparse_moe.router.layer and the
    # stacked input_linear [E, 2 ffn, hidden] / output_linear [E, hidden, ffn] experts, and
    # shared_mlp.input_linear / output_linear (shared_intermediate_size).
    "granitemoe": (random_model.SPECS["granitemoe_shared"], None, None),
    # Glm4ForCausalLM: post_self_attn_layernorm / post_mlp_layernorm, gate_up_proj, partial
    # rotary in interleaved pairs (the directory's rows are not permuted).
    "glm4": (random_model.SPECS["glm4_sandwich"], None, None),
    # GemmaForCausalLM (Gemma 1): hidden_act "gelu" meaning tanh GELU, 1 + w norms under
    # llama's input_layernorm / post_attention_layernorm names.
    "gemma": (random_model.SPECS["gemma1_gelu"], None, None),
    # GptOssForCausalLM: experts as MXFP4 blocks and exponents (U8), gate and up interleaved
    # in gate_up_proj, biases, sinks, the router, layer_types, swiglu_limit, and YaRN as
    # gpt-oss's config says it (truncate false).
    "gpt_oss": (random_model.SPECS["gpt_oss_sinks"], None,
                {**YARN_SCALING, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
    # The same with its experts dequantized, as fine-tunes are saved: gate_up_proj [E, hidden,
    # 2 ffn] and down_proj [E, ffn, hidden], transposed on load.
    "gpt_oss_dense": (random_model.SPECS["gpt_oss_sinks"], "gpt-oss-dense",
                      {**YARN_SCALING, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
}


def reference_model(family, gguf_path):
    """The numpy reference of a random family's directory."""
    model = ref.load(gguf_path)
    if family == "qwen2_vl":
        import dataclasses
        model = dataclasses.replace(model, rope_position_scale=1.0)
    rope_scaling = RANDOM_FAMILIES[family][2]
    if rope_scaling is not None and rope_scaling.get("rope_type") == "yarn":
        model = ref.with_hf_rope_scaling(model, rope_scaling, model.n_ctx)
    return model


@pytest.fixture(scope="module")
def smollm_dirs(tmp_path_factory, model_path):
    base = tmp_path_factory.mktemp("hf_smollm2")
    return {
        "f32": hf_checkpoint.write_hf_directory(model_path, base / "f32", dtype="float32", shards=2),
        "bf16": hf_checkpoint.write_hf_directory(model_path, base / "bf16", dtype="bfloat16"),
    }


@pytest.fixture(scope="module")
def passes(model_path, smollm_dirs):
    tools = {"gguf": mrt.ForwardPassTool(model_path)}
    tools.update({name: mrt.ForwardPassTool(path) for name, path in smollm_dirs.items()})
    yield tools
    for tool in tools.values():
        tool.close()


def test_written_files_read_back_with_the_safetensors_package(model_path, smollm_dirs):
    """Checks the test's own writer: the `safetensors` package reads the shards, and their values
    are the GGUF's dequantized weights (llama q rows un-permuted)."""
    from safetensors.numpy import load_file
    import gguf

    directory = smollm_dirs["f32"]
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.layers.0.mlp.down_proj.weight"]
    loaded = load_file(str(directory / shard))
    tensors = {t.name: t for t in gguf.GGUFReader(str(model_path)).tensors}
    np.testing.assert_array_equal(loaded["model.layers.0.mlp.down_proj.weight"],
                                  hf_checkpoint.dequantize(tensors["blk.0.ffn_down.weight"]))


def test_tokens_match_the_gguf_and_hugging_face_tokenizers_on_1000_strings(model_path, smollm_dirs):
    from tokenizers import Tokenizer

    texts = tokenizer_test.generated_strings(1000)
    from_dir = tokenizer_test.run_tool(smollm_dirs["bf16"], texts)
    from_gguf = tokenizer_test.run_tool(model_path, texts)
    hf = Tokenizer.from_file(str(smollm_dirs["bf16"] / "tokenizer.json"))
    expected = [hf.encode(text, add_special_tokens=False).ids for text in texts]
    got = [row["ids"] for row in from_dir]
    assert got == [row["ids"] for row in from_gguf], tokenizer_test.first_mismatches(
        texts, got, [row["ids"] for row in from_gguf])
    assert got == expected, tokenizer_test.first_mismatches(texts, got, expected)


def inspect(model):
    result = subprocess.run([str(BUILD_DIR / "coordinator" / "loom"), "inspect", "--model", str(model)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_chat_template_renders_as_from_the_gguf(model_path, smollm_dirs):
    """`loom inspect` renders a sample conversation with the model's chat template and tokenizes
    it: the directory (template from tokenizer_config.json) and the GGUF give the same text and
    ids."""
    from_dir = inspect(smollm_dirs["bf16"]).split("chat prompt", 1)
    from_gguf = inspect(model_path).split("chat prompt", 1)
    assert len(from_dir) == 2 and "<|im_start|>" in from_dir[1]
    assert from_dir[1] == from_gguf[1]


def test_float32_directory_logits_equal_the_gguf_run(passes):
    prompts = [passes["gguf"].tokenize(text) for text in mrt.TEXT_PROMPTS]
    expected = passes["gguf"].logits(prompts)
    got = passes["f32"].logits(prompts)
    assert np.abs(got - expected).max() <= TOL_F32_VS_GGUF, np.abs(got - expected).max()


def test_bfloat16_directory_logits_stay_within_bf16_rounding_of_the_gguf_run(passes):
    prompts = [passes["gguf"].tokenize(text) for text in mrt.TEXT_PROMPTS]
    expected = passes["gguf"].logits(prompts)
    diff = np.abs(passes["bf16"].logits(prompts) - expected)
    assert diff.max() <= TOL_BF16_VS_GGUF, diff.max()
    assert diff.max() > 0, "bf16 weights cannot give bit-identical logits: is the file bf16?"


def test_greedy_generation_from_the_directory_equals_the_gguf_run(passes):
    prompts = [passes["gguf"].tokenize(text) for text in mrt.TEXT_PROMPTS[:3]]
    expected = passes["gguf"].greedy(prompts, max_tokens=GREEDY_TOKENS)
    assert passes["f32"].greedy(prompts, max_tokens=GREEDY_TOKENS) == expected


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_random")
    models = {}
    for name, (spec, architecture, rope_scaling) in RANDOM_FAMILIES.items():
        gguf_path = random_model.write_model(spec, base / f"{name}.gguf")
        directory = hf_checkpoint.write_hf_directory(gguf_path, base / name, dtype="float32",
                                                     rope_scaling=rope_scaling,
                                                     architecture=architecture)
        models[name] = (gguf_path, directory)
    return models


@pytest.mark.parametrize("family", RANDOM_FAMILIES)
def test_random_model_directory_logits_match_the_numpy_reference(family_models, family):
    gguf_path, directory = family_models[family]
    model = reference_model(family, gguf_path)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, model.n_vocab, n).tolist() for n in (5, 37, 120)]
    expected = np.stack([ref.logits(model, prompt)[-1] for prompt in prompts])
    tool = mrt.ForwardPassTool(directory)
    try:
        got = tool.logits(prompts)
    finally:
        tool.close()
    diff = np.abs(got - expected).max()
    assert diff <= TOL_REFERENCE, f"{family}: max |Δ logit| {diff}"


def directory_logits(directory, prompt):
    """Loom's last-position logits of `prompt` on a model directory."""
    tool = mrt.ForwardPassTool(directory)
    try:
        return tool.logits([prompt])[0]
    finally:
        tool.close()


def test_qwen3_without_qk_norm_would_differ(family_models):
    """The QK-norm check can fail: the reference without it is far from Loom's logits."""
    gguf_path, directory = family_models["qwen3"]
    model = ref.load(gguf_path)
    plain = ref.Model(**{**model.__dict__, "layers": [
        ref.Layer(**{**layer.__dict__, "q_norm": None, "k_norm": None}) for layer in model.layers]})
    prompt = list(range(1, 40))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(plain, prompt)[-1]).max() > 100 * TOL_REFERENCE


def test_yarn_reference_differs_from_plain_rope(family_models):
    """The YaRN check can fail: Loom's logits are far from the reference with the GGUF's own
    RoPE, and from YaRN without its attention factor."""
    gguf_path, directory = family_models["qwen2_yarn"]
    yarn = reference_model("qwen2_yarn", gguf_path)
    assert yarn.rope_attention_factor > 1.1
    without_factor = ref.Model(**{**yarn.__dict__, "rope_attention_factor": 1.0})
    prompt = list(range(1, 90))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(yarn, prompt)[-1]).max() <= TOL_REFERENCE
    for other in (ref.load(gguf_path), without_factor):
        assert np.abs(got - ref.logits(other, prompt)[-1]).max() > 100 * TOL_REFERENCE


def test_longrope_is_checked(family_models):
    """The longrope check can fail: Loom's Phi-3 logits are far from the reference with the short
    factors, or without the attention factor."""
    gguf_path, directory = family_models["phi3"]
    model = ref.load(gguf_path)
    assert model.rope_attention_factor > 1.1
    prompt = list(range(3, 90))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(model, prompt)[-1]).max() <= TOL_REFERENCE
    short = np.asarray(random_model.SPECS["phi3_longrope"].longrope["short"], dtype=np.float64)
    plain = model.rope_base ** (-np.arange(0, model.n_rot, 2, dtype=np.float64) / model.n_rot)
    for changes in ({"rope_inv_freq": plain / short}, {"rope_attention_factor": 1.0}):
        other = ref.Model(**{**model.__dict__, **changes})
        assert np.abs(got - ref.logits(other, prompt)[-1]).max() > 100 * TOL_REFERENCE, list(changes)


def test_smollm3_nope_layers_are_checked(family_models):
    """The NoPE check can fail: Loom's SmolLM3 logits are far from the reference that rotates
    every layer."""
    gguf_path, directory = family_models["smollm3"]
    model = ref.load(gguf_path)
    assert model.rope_layers == (True, True, True, False)
    prompt = list(range(3, 70))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(model, prompt)[-1]).max() <= TOL_REFERENCE
    every_layer = ref.Model(**{**model.__dict__, "rope_layers": ()})
    assert np.abs(got - ref.logits(every_layer, prompt)[-1]).max() > 100 * TOL_REFERENCE


def test_smollm3_no_rope_layers_list_is_followed(family_models, tmp_path):
    """config.json's no_rope_layers decides which layers rotate, not only the every-4th rule; a
    list of the wrong length or with other values is refused by name."""
    import shutil

    _, source = family_models["smollm3"]
    directory = tmp_path / "smollm3_listed"
    shutil.copytree(source, directory)
    write_config(directory, no_rope_layers=[0, 1, 0, 1])
    model = ref.load(family_models["smollm3"][0])
    listed = ref.Model(**{**model.__dict__, "rope_layers": (False, True, False, True)})
    prompt = list(range(5, 60))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(listed, prompt)[-1]).max() <= TOL_REFERENCE
    assert np.abs(got - ref.logits(model, prompt)[-1]).max() > 100 * TOL_REFERENCE
    for bad in ([1, 1, 1], [1, 2, 1, 1]):
        write_config(directory, no_rope_layers=bad)
        error = load_error(directory)
        assert "no_rope_layers" in error, error


def test_granite_multipliers_are_checked(family_models):
    """The Granite check can fail: Loom's logits are far from the reference without any one of
    its four multipliers."""
    gguf_path, directory = family_models["granite"]
    model = ref.load(gguf_path)
    assert (model.embedding_scale, model.residual_scale, model.logit_scale) == (12.0, 0.5, 2.0)
    prompt = list(range(3, 60))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(model, prompt)[-1]).max() <= TOL_REFERENCE
    for changes in ({"embedding_scale": 1.0}, {"residual_scale": 1.0}, {"attention_scale": None},
                    {"logit_scale": 1.0}):
        other = ref.Model(**{**model.__dict__, **changes})
        assert np.abs(got - ref.logits(other, prompt)[-1]).max() > 100 * TOL_REFERENCE, changes


def test_glm4_interleaved_partial_rotary_and_post_norms_are_checked(family_models):
    """The GLM-4 check can fail: Loom's logits on the directory (whose rows, unlike llama's,
    stay in interleaved order) are far from the reference rotating rotate-half pairs, and from
    the reference without the norms after each sub-layer."""
    gguf_path, directory = family_models["glm4"]
    model = ref.load(gguf_path)
    assert model.n_rot == 16 and model.head_dim == 32
    prompt = list(range(3, 70))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(model, prompt)[-1]).max() <= TOL_REFERENCE
    neox = ref.Model(**{**model.__dict__, "rope_mode": "neox"})
    plain = ref.Model(**{**model.__dict__, "layers": [
        ref.Layer(**{**layer.__dict__, "post_attn_norm": None, "post_ffw_norm": None})
        for layer in model.layers]})
    for other in (neox, plain):
        assert np.abs(got - ref.logits(other, prompt)[-1]).max() > 100 * TOL_REFERENCE


def test_mixture_of_experts_routing_is_checked(family_models):
    """The routing check can fail: Loom's Mixtral logits are far from the reference routing to
    one expert, or to both without renormalizing their weights."""
    gguf_path, directory = family_models["mixtral"]
    model = ref.load(gguf_path)
    prompt = list(range(3, 60))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(model, prompt)[-1]).max() <= TOL_REFERENCE
    for changes in ({"n_expert_used": 1}, {"expert_norm": False}):
        other = ref.Model(**{**model.__dict__, **changes})
        assert np.abs(got - ref.logits(other, prompt)[-1]).max() > 100 * TOL_REFERENCE, changes


def test_dense_layers_between_expert_layers_are_refused(family_models, tmp_path):
    import shutil

    _, source = family_models["qwen3moe"]
    for name, changes in {"dense": {"mlp_only_layers": [1]}, "step": {"decoder_sparse_step": 2}}.items():
        directory = tmp_path / name
        shutil.copytree(source, directory)
        write_config(directory, **changes)
        error = load_error(directory)
        assert "not supported" in error and ("experts" in error or "expert" in error), (name, error)
    # A shared expert's width without its tensors is a broken checkpoint, said by name.
    directory = tmp_path / "shared"
    shutil.copytree(source, directory)
    write_config(directory, shared_expert_intermediate_size=64)
    error = load_error(directory)
    assert "expert_shared_feed_forward_length" in error and "no shared expert" in error, error


def test_qwen2moe_shared_expert_and_its_gate_count(family_models):
    """Qwen2-MoE's directory within TOL_REFERENCE of the reference, and far from the same
    reference without the shared expert, without its gate, or with the routed weights
    renormalized (Qwen3-MoE's rule): each part is applied, and as the model defines it."""
    import dataclasses

    gguf_path, directory = family_models["qwen2moe"]
    model = ref.load(gguf_path)
    prompt = list(range(3, 60))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(model, prompt)[-1]).max() <= TOL_REFERENCE
    unshared = [dataclasses.replace(layer, shared=None, shared_gate=None) for layer in model.layers]
    ungated = [dataclasses.replace(layer, shared_gate=None) for layer in model.layers]
    for changes in ({"layers": unshared}, {"layers": ungated}, {"expert_norm": True}):
        other = ref.Model(**{**model.__dict__, **changes})
        assert np.abs(got - ref.logits(other, prompt)[-1]).max() > 100 * TOL_REFERENCE, list(changes)


def test_glm4moe_routing_shared_expert_and_mtp_layer_count(family_models, tmp_path):
    """GLM-4.5's directory within TOL_REFERENCE of the reference, and far from the same
    reference choosing experts without the selection bias, with softmax scores, without
    renormalizing or routed_scaling_factor, without the shared expert, or running the MTP
    layer as a 4th layer: each part applied as the model defines it, the MTP layer skipped.
    The MTP layer's tensors are in the directory, and changing them changes nothing."""
    import dataclasses
    import shutil
    from safetensors.numpy import load_file

    gguf_path, directory = family_models["glm4moe"]
    model = ref.load(gguf_path)
    config = json.loads((directory / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_nextn_predict_layers"]) == (len(model.layers), 1)
    prompt = list(range(3, 60))
    got = directory_logits(directory, prompt)
    assert np.abs(got - ref.logits(model, prompt)[-1]).max() <= TOL_REFERENCE
    unbiased = [dataclasses.replace(layer, selection_bias=None) for layer in model.layers]
    unshared = [dataclasses.replace(layer, shared=None) for layer in model.layers]
    for changes in ({"layers": unbiased}, {"layers": unshared}, {"expert_gating": "softmax"},
                    {"expert_norm": False}, {"expert_weights_scale": 1.0}):
        other = ref.Model(**{**model.__dict__, **changes})
        assert np.abs(got - ref.logits(other, prompt)[-1]).max() > 100 * TOL_REFERENCE, list(changes)
    with_mtp = ref.load(gguf_path, run_nextn=True)
    assert len(with_mtp.layers) == len(model.layers) + 1
    assert np.abs(got - ref.logits(with_mtp, prompt)[-1]).max() > 100 * TOL_REFERENCE

    mtp = f"model.layers.{len(model.layers)}."
    tensors = load_file(str(directory / "model.safetensors"))
    assert {mtp + name for name in ("eh_proj.weight", "enorm.weight", "hnorm.weight",
                                    "shared_head.norm.weight", "self_attn.q_proj.weight",
                                    "mlp.gate.e_score_correction_bias",
                                    "mlp.experts.7.down_proj.weight")} <= set(tensors)
    changed = tmp_path / "glm4moe_other_mtp"
    shutil.copytree(directory, changed)
    rng = np.random.default_rng(3)
    for name in tensors:
        if name.startswith(mtp):
            tensors[name] = rng.normal(0.0, 1.0, tensors[name].shape).astype(tensors[name].dtype)
    hf_checkpoint.write_safetensors(changed / "model.safetensors", tensors)
    assert np.array_equal(directory_logits(changed, prompt), got)

    # `loom inspect` says so, from either format; the GGUF counts the MTP layer it skips.
    routing = ("routing         sigmoid scores chosen with a per-expert bias, weights x 2.5",
               "dense layers    the first 1 (ffn 96)", "shared expert   ffn 32")
    from_gguf, from_dir = inspect(gguf_path), inspect(directory)
    for line in routing:
        assert line in from_gguf and line in from_dir, (line, from_gguf, from_dir)
    assert "layers          3 (and 1 multi-token-prediction, not run)" in from_gguf, from_gguf


def write_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def load_error(directory) -> str:
    result = subprocess.run([str(tool_path("forward_pass_tool")), "--model", str(directory)],
                            input="", capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    return result.stderr


def test_unsupported_architecture_and_field_values_are_refused_by_name(family_models, tmp_path):
    import shutil

    _, source = family_models["llama"]
    cases = {
        "arch": ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
        "act": ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        "rope": ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        "window": ({"use_sliding_window": True, "max_window_layers": 0, "sliding_window": None},
                   "without a sliding_window size"),
    }
    for name, (changes, needle) in cases.items():
        directory = tmp_path / name
        shutil.copytree(source, directory)
        write_config(directory, **changes)
        assert needle in load_error(directory), name


def test_a_truncated_shard_is_refused_with_the_file_name(family_models, tmp_path):
    import shutil

    _, source = family_models["qwen2"]
    directory = tmp_path / "truncated"
    shutil.copytree(source, directory)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    error = load_error(directory)
    assert "model.safetensors" in error and "truncated" in error, error
