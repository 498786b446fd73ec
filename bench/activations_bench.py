#!/usr/bin/env python3
"""The CPU backend's --activations modes on one model, in one run: what each costs in accuracy and
what it buys in speed.

* f32 (the default): every layer's input exact, weights dequantized to float;
* int8: INT8/INT4 layers' inputs quantized per 32 values (llama.cpp's Q8_0 arithmetic);
* bf16: every matmul's input and weight rounded to bfloat16 on Intel AMX tiles (Sapphire Rapids
  and later; skipped with the reason elsewhere).

Accuracy: `loom perplexity --nll-out` on the same text (docs/ARCHITECTURE.md as it is when the
run starts, copied to bench/.cache) with the same windows, each mode's per-token NLLs paired with
f32's: the mean difference and its standard error, and the perplexity ratio.
Speed: bench/engine_bench per mode (512-token prefill, single-stream decode, batched decode of
16 and 64 sequences), the modes alternating over --passes passes, medians; each figure beside f32's
as a ratio and beside the limits engine_bench measured in the same process (FMA peak, AMX BF16
peak, memory bandwidth).

  .venv/bin/python bench/activations_bench.py [--model PATH] [--passes 2] [--max-tokens N]
  -> bench/results/activations_cpu.json (activations_cpu_<model stem>.json for another model)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys

import cpu_vs_llamacpp
import kquant_bench
from provenance import provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", ROOT / "build"))
CACHE = ROOT / "bench" / ".cache"
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODES = ("f32", "int8", "bf16")


def bf16_runs() -> tuple[bool, str]:
    flags = pathlib.Path("/proc/cpuinfo").read_text().split()
    if "amx_bf16" not in flags or "avx512_bf16" not in flags:
        return False, "this CPU has no AMX-BF16"
    if os.environ.get("LOOM_CPU_ISA", "") not in ("", "amx"):
        return False, f"LOOM_CPU_ISA={os.environ['LOOM_CPU_ISA']} caps the kernels below amx"
    return True, ""


def perplexity(model: str, text: pathlib.Path, mode: str, args) -> tuple[dict, list]:
    nll_out = CACHE / f"activations_nll_{mode}.txt"
    command = [str(BUILD / "coordinator" / "loom"), "perplexity", "--model", model, "--text",
               str(text), "--context", str(args.context), "--stride", str(args.context // 2),
               "--activations", mode, "--json", "--nll-out", str(nll_out)]
    if args.max_tokens:
        command += ["--max-tokens", str(args.max_tokens)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    token_nll = [float(v) for v in nll_out.read_text().split()]
    nll_out.unlink()
    return result, token_nll


def paired_with_f32(nll: list, base: list) -> dict:
    """Mean per-token NLL difference against f32 on the same tokens, its standard error and the
    perplexity ratio with its 95% interval (kquant_bench's pairing)."""
    pair = kquant_bench.paired(nll, base)
    return {"tokens": pair["tokens"], "mean_nll_difference": pair["mean_nll_difference"],
            "stderr": pair["stderr"], "perplexity_ratio": pair["ratio"],
            "perplexity_ratio_95": pair["ratio_ci95"]}


def engine_speed(model: str, mode: str, args, env: dict | None = None,
                 extra_args: tuple = ()) -> dict:
    """One engine_bench run's figures (bf16_weights_bench.py uses it too, with LOOM_CPU_ISA, and
    bf16_attention_bench.py with --bf16-attention)."""
    result = cpu_vs_llamacpp.engine_bench_result(model, args.threads, args.tokens, mode, env=env,
                                                 extra_args=extra_args)
    batched = {str(b["sequences"]): b["tokens_per_s"] for b in result["batched_decode"]}
    return {"pp512": result["prefill_512"]["tokens_per_s"],
            "prefill_vs_fma_peak": result["prefill_512"]["vs_fma_peak"],
            "prefill_vs_amx_bf16_peak": result["prefill_512"].get("vs_amx_bf16_peak", 0.0),
            "tg": result["decode_single"]["tokens_per_s"],
            "decode_bytes_per_token": result["decode_single"]["bytes_per_token"],
            "decode_vs_read": result["decode_single"]["vs_read"],
            "batched_16": batched["16"], "batched_64": batched["64"],
            "limits": result["limits"], "matmul_isa": result["matmul_isa"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--passes", type=int, default=2, help="speed passes per mode, alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens per sequence")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=0, help="score the first N tokens (0: all)")
    parser.add_argument("--out", help="default bench/results/activations_cpu[_<model stem>].json")
    args = parser.parse_args()
    args.model = str(pathlib.Path(args.model).resolve())  # engine_bench runs in a scratch dir

    bf16_ok, bf16_reason = bf16_runs()
    modes = [m for m in MODES if m != "bf16" or bf16_ok]
    if not bf16_ok:
        print(f"bf16 skipped: {bf16_reason}")
    CACHE.mkdir(parents=True, exist_ok=True)
    text = CACHE / "activations_text.md"
    text.write_bytes((ROOT / "docs" / "ARCHITECTURE.md").read_bytes())

    accuracy, token_nll = {}, {}
    for mode in modes:
        result, token_nll[mode] = perplexity(args.model, text, mode, args)
        accuracy[mode] = {"perplexity": result["perplexity"],
                          "perplexity_stderr": result.get("perplexity_stderr"),
                          "scored_tokens": len(token_nll[mode])}
        print(f"{mode}: perplexity {result['perplexity']:.4f} over {len(token_nll[mode])} tokens",
              flush=True)
    for mode in modes:
        if mode != "f32":
            accuracy[mode]["vs_f32"] = pair = paired_with_f32(token_nll[mode], token_nll["f32"])
            print(f"{mode} vs f32: perplexity x{pair['perplexity_ratio']:.5f} (95% "
                  f"{pair['perplexity_ratio_95'][0]:.5f}-{pair['perplexity_ratio_95'][1]:.5f})")

    runs = {mode: [] for mode in modes}
    for index in range(args.passes):
        for mode in modes:
            runs[mode].append(engine_speed(args.model, mode, args))
            r = runs[mode][-1]
            print(f"pass {index + 1} {mode}: pp512 {r['pp512']:.1f}, tg {r['tg']:.1f}, batched 16 "
                  f"{r['batched_16']:.1f}, 64 {r['batched_64']:.1f} tok/s", flush=True)
    keys = ("pp512", "tg", "batched_16", "batched_64", "prefill_vs_fma_peak",
            "prefill_vs_amx_bf16_peak")
    speed = {mode: {k: statistics.median(r[k] for r in runs[mode]) for k in keys} for mode in modes}
    for mode in modes:
        speed[mode]["vs_f32"] = {k: speed[mode][k] / speed["f32"][k]
                                 for k in ("pp512", "tg", "batched_16", "batched_64")}
        print(f"{mode}: " + ", ".join(f"{k} {v:.2f}x" for k, v in speed[mode]["vs_f32"].items())
              + " of f32")

    result = {
        "benchmark": "activations_cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "provenance": provenance(),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "model": os.path.basename(args.model), "threads": args.threads,
        "text": "docs/ARCHITECTURE.md", "context": args.context, "stride": args.context // 2,
        "passes_per_mode": args.passes, "decode_tokens": args.tokens,
        "limits": runs["f32"][-1]["limits"],
        "matmul_isa": runs["f32"][-1]["matmul_isa"],
        "accuracy": accuracy,
        "speed_median": speed,
        "speed_runs": runs,
    }
    if not bf16_ok:
        result["bf16_skipped"] = bf16_reason
    stem = pathlib.Path(args.model).stem.lower()
    name = "activations_cpu" + ("" if pathlib.Path(args.model) == DEFAULT_MODEL else f"_{stem}")
    path = pathlib.Path(args.out) if args.out else ROOT / "bench" / "results" / f"{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
