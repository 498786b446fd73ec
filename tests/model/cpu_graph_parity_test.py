"""The model graph on the CPU device reproduces the pre-model/ CPU forward pass bit for bit.

tests/tools/graph_parity_tool runs worker::CpuForwardPass (model::LlamaGraph over model::CpuDevice)
and a frozen copy of the CPU forward pass as it was before the model/ layer (the reference) on
the same steps (batched prefill across KV blocks, batched decodes, a mixed prefill + decode),
and counts logits whose bits differ. Covered: the random llama-family models (llama_gqa: GQA,
tied embeddings, mixed quantization; qwen2_mqa: MQA, biases, NeoX RoPE, linear scaling;
llama3_rope: rope_freqs; qwen3_qknorm: QK-norm) and the default model, with F32 and int8 activations, F16 and F32 KV,
under every ISA this CPU runs (LOOM_CPU_ISA). --perturb shows the comparison can fail.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "worker"))
import random_model  # noqa: E402

BUILD = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", "build"))
TOOL = BUILD / "tests" / "tools" / "graph_parity_tool"
MODEL = os.environ.get("LOOM_MODEL_PATH", "")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("random_models")
    files = {name: pathlib.Path(path) for name, path in random_model.write_all(directory).items()}
    files["qwen3_qknorm"] = directory / "qwen3_qknorm.gguf"
    random_model.write_model(random_model.QWEN3_SPEC, files["qwen3_qknorm"])
    files["default"] = pathlib.Path(MODEL)
    return files


def run_tool(model, *args, isa=None) -> dict:
    env = dict(os.environ)
    if isa is not None:
        env["LOOM_CPU_ISA"] = isa
    done = subprocess.run([str(TOOL), "--model", str(model), "--threads", "2", *args], env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "this CPU cannot run it" in done.stderr:
        pytest.skip(f"this CPU cannot run {isa}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("isa", [None, "avx2", "scalar"])
@pytest.mark.parametrize("activations,kv", [("f32", "f32"), ("f32", "f16"), ("int8", "f16")])
@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_mqa", "llama3_rope", "qwen3_qknorm",
                                  "default"])
def test_graph_on_cpu_device_matches_the_old_forward_pass_bit_for_bit(models, name, activations,
                                                                      kv, isa):
    if name == "default" and isa == "scalar":
        pytest.skip("the default model under the scalar ISA is slow; its other ISAs cover it")
    result = run_tool(models[name], "--activations", activations, "--kv-dtype", kv, isa=isa)
    assert result["floats"] > 0
    assert result["mismatched"] == 0, result


@pytest.mark.parametrize("name", ["qwen2_mqa", "default"])
def test_comparison_notices_a_doubled_norm_epsilon(models, name):
    result = run_tool(models[name], "--perturb")
    assert result["mismatched"] > result["floats"] // 2, result
