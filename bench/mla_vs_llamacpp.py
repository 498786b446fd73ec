#!/usr/bin/env python3
"""DeepSeek's multi-head latent attention on the CPU against llama.cpp: the same GGUF, the same
threads, the same run.

Writes a random deepseek2 GGUF with tests/worker/random_model.py: DeepSeek-V3's attention
shapes at V2-Lite's head count (hidden 2048, 16 heads, a 1536-wide query latent, a 512-wide
key-value latent, 64 rotary and 128 decompressed dims a key, values of 128; the key and value
decompressions split into attn_k_b / attn_v_b as llama.cpp's converter writes them for its
absorbed MLA), over 4 layers: the first dense (4,096 channels), then 8 experts of 1,408
channels, 6 per token, beside a shared one. Q8_0 weights (the INT8 kernels on both sides).
Then runs bench/cpu_vs_llamacpp.py on it (pp512, tg<N>, batched decode of 16 and 64; the
engines alternating, medians, the load recorded) and adds the KV bytes a token takes in each
form to its JSON: Loom's pool (the latent and the rotary key part once, read as key and value)
against the decompressed heads a non-absorbed server caches.

  LLAMACPP_BUILD_ROOT=/work/llamacpp bench/setup_llamacpp.sh avx2
  LLAMACPP_BUILD_ROOT=/work/llamacpp .venv/bin/python bench/mla_vs_llamacpp.py --isa avx2 \
      [--passes 2] [--tokens 64] [--wait-quiet 120] [--out bench/results/mla_vs_llamacpp_avx2.json]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "worker"))

import random_model  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

Q8 = {role: (T.Q8_0,) for role in (
    "token_embd", "output", "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_output", "ffn_gate",
    "ffn_up", "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")}
# llama.cpp reads attn_k_b / attn_v_b in F16 or F32 (their rows, 128 and 512 wide, are not
# what its absorbed kernels quantize); Loom widens them to F32 per head.
Q8.update({"attn_k_b": (T.F16,), "attn_v_b": (T.F16,)})
SPEC = random_model.ModelSpec(
    name="bench_deepseek2", arch="deepseek2", n_embd=2048, n_layer=4, n_head=16, n_head_kv=1,
    head_dim=192, rope_dims=64, n_ff=1408, dense_ff=4096, n_expert=8, n_expert_used=6,
    shared_experts=1, leading_dense=1, expert_norm=False, expert_weights_scale=1.0,
    mla_kv_lora=512, mla_q_lora=1536, mla_value_dim=128, mla_split_kv_b=True, n_ctx=4096,
    rms_eps=1e-6, tied_output=False, seed=31, types=Q8)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isa", choices=["avx2", "avx512"], required=True)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="")
    parser.add_argument("--wait-quiet", type=float, default=120, metavar="S",
                        help="before each pass, wait up to S seconds for a quiet machine")
    args = parser.parse_args()
    out = pathlib.Path(args.out or ROOT / "bench" / "results" / f"mla_vs_llamacpp_{args.isa}.json")
    with tempfile.TemporaryDirectory() as tmp:
        model = pathlib.Path(tmp) / "bench_deepseek2.gguf"
        random_model.write_model(SPEC, model)
        print(f"wrote {model} ({model.stat().st_size / 2**20:.0f} MiB)", flush=True)
        subprocess.run([sys.executable, str(ROOT / "bench" / "cpu_vs_llamacpp.py"), "--isa",
                        args.isa, "--model", str(model), "--passes", str(args.passes),
                        "--tokens", str(args.tokens), "--threads", str(args.threads),
                        "--wait-quiet", str(args.wait_quiet), "--out",
                        str(out), "--note", "bench/mla_vs_llamacpp.py: " + SPEC.name], check=True)
    result = json.loads(out.read_text())
    rope, latent = SPEC.rope_dims, SPEC.mla_kv_lora
    nope, value = SPEC.head_dim - SPEC.rope_dims, SPEC.mla_value_dim
    per_layer_latent = rope + latent  # values a token and layer, key and value at once
    per_layer_decompressed = SPEC.n_head * ((nope + rope) + value)  # each head's key and value
    result["benchmark"] = "mla_vs_llamacpp"
    result["kv_values_per_token_and_layer"] = {
        "loom_latent_pool": per_layer_latent,
        "decompressed_heads": per_layer_decompressed,
        "ratio": per_layer_decompressed / per_layer_latent,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"loom_over_llamacpp": result.get("loom_over_llamacpp"),
                      "kv_values_per_token_and_layer": result["kv_values_per_token_and_layer"]},
                     indent=2))


if __name__ == "__main__":
    main()
