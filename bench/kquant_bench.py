#!/usr/bin/env python3
"""The K-quants natively: Loom against llama.cpp on the same Q4_K_M file, in one run.

llama.cpp's own quantizer (llama_model_quantize from the llama-cpp-python build of
bench/setup_llamacpp.sh; bench only) writes a Q4_K_M file of the default model from an F32
GGUF of its values (the bundled Q4_1 weights dequantized). Then, on that one file:

* no tensor changed: every matrix as Loom's CPU backend packs it (tests/tools/
  gguf_dequant_tool --packed) against gguf's dequantization, bit for bit (value for value for
  Q3_K), and the type of every tensor llama.cpp chose;
* perplexity of the repository's docs/ARCHITECTURE.md (all of it, or its first --ppl-tokens
  tokens) under both engines, with the same windows (`loom perplexity`'s: --context tokens
  every context / 2, each token scored once, from the logits of the position before it):
  the ratio and the token counts each engine scored (the same count says the tokenizers
  agree); Loom with --activations int8 (llama.cpp's own arithmetic: Q8_0 activations for the
  legacy formats, Q8_K for the K-quants) and with float activations, on the Q4_K_M file and
  on the original Q4_1 one. The ratio comes with its 95% interval from the paired per-token
  differences (`loom perplexity --nll-out` against llama.cpp's logits, token by token):
  rounding activations to int8 perturbs each token's NLL by ~0.1 nats in a pattern that
  any difference in float order reshuffles, so two correct int8 engines differ by ~0.11%
  (one standard error) on 8,192 tokens, and "equal within 0.1%" needs a longer text (the
  whole file, ~49 k tokens, measured one standard error of ~0.056%: ±0.11% at 95%);
* speed: bench/cpu_vs_llamacpp.py on the Q4_K_M file (prefill pp512, decode tg128, batched
  decode, alternating passes, medians) and its ratios.

Writes bench/results/kquant_q4_k_m.json (and cpu_vs_llamacpp's own JSON beside it as
kquant_q4_k_m_speed_<isa>.json).

  LLAMACPP_BUILD_ROOT=/work/llamacpp bench/setup_llamacpp.sh native
  LLAMACPP_BUILD_ROOT=/work/llamacpp .venv/bin/python bench/kquant_bench.py --isa avx512
"""
from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import math
import os
import pathlib
import subprocess
import sys

from provenance import provenance

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD_DIR = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", ROOT / "build"))
LLAMACPP_ROOT = pathlib.Path(os.environ.get("LLAMACPP_BUILD_ROOT", ROOT / "build"))
CACHE = ROOT / "bench" / ".cache" / "kquant"
# The text both engines score: docs/ARCHITECTURE.md as it was when the run began (an edit
# during a run would give the engines different tokens).
TEXT = CACHE / "perplexity_text.md"
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15


def llama_quantize(source: str, out: str, threads: int) -> None:
    """Runs inside the llama.cpp build's PYTHONPATH."""
    import llama_cpp.llama_cpp as L

    L.llama_backend_init()
    params = L.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = threads
    if L.llama_model_quantize(source.encode(), out.encode(), params) != 0:
        raise SystemExit("llama_model_quantize failed")


def llama_perplexity(model: str, text: str, context: int, max_tokens: int, threads: int) -> dict:
    """Runs inside the llama.cpp build's PYTHONPATH: loom perplexity's windows."""
    import llama_cpp.llama_cpp as L
    import numpy as np

    L.llama_backend_init()
    mdl = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    vocab = L.llama_model_get_vocab(mdl)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    raw = pathlib.Path(text).read_bytes()
    buffer = (L.llama_token * (len(raw) + 16))()
    count = L.llama_tokenize(vocab, raw, len(raw), buffer, len(buffer), False, False)
    tokens = list(buffer[:count])[:max_tokens or None]
    params = L.llama_context_default_params()
    params.n_ctx = context + 16
    params.n_batch = params.n_ubatch = context
    params.n_threads = params.n_threads_batch = threads
    ctx = L.llama_init_from_model(mdl, params)
    batch = L.llama_batch_init(context, 0, 1)
    stride = context // 2
    nll, scored, previous_end, token_nll = 0.0, 0, 0, []
    for begin in range(0, len(tokens), stride):
        end = min(begin + context, len(tokens))
        score_begin = max(previous_end, begin + 1)
        previous_end = end
        if score_begin >= end:
            continue
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        batch.n_tokens = end - begin
        for i in range(end - begin):
            batch.token[i] = tokens[begin + i]
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if score_begin - 1 <= begin + i < end - 1 else 0
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        for t in range(score_begin, end):
            row = L.llama_get_logits_ith(ctx, t - 1 - begin)
            logits = np.ctypeslib.as_array(row, shape=(n_vocab,)).astype(np.float64)
            top = logits.max()
            log_z = top + math.log(np.exp(logits - top).sum())
            nll += log_z - logits[tokens[t]]
            token_nll.append(float(log_z - logits[tokens[t]]))
            scored += 1
        if end == len(tokens):
            break
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(mdl)
    return {"perplexity": math.exp(nll / scored), "nll": nll / scored, "scored": scored,
            "tokens": len(tokens), "token_nll": token_nll}


def nll_stderr(token_nll) -> float:
    """The standard error of a mean NLL: the tokens' sample standard deviation / sqrt(n)."""
    import numpy as np

    return float(np.std(token_nll, ddof=1) / math.sqrt(len(token_nll)))


def paired(loom_nll: list, llama_nll: list) -> dict:
    """Loom over llama.cpp from the per-token NLL differences of the same scored tokens: the
    perplexity ratio exp(mean difference), its standard error and 95% interval."""
    import numpy as np

    if len(loom_nll) != len(llama_nll) or len(loom_nll) < 2:
        raise SystemExit(f"paired comparison needs the same tokens: {len(loom_nll)} vs {len(llama_nll)}")
    d = np.asarray(loom_nll) - np.asarray(llama_nll)
    se, mean = nll_stderr(d), float(d.mean())
    return {"tokens": len(d), "mean_nll_difference": mean, "stderr": se,
            "difference_std_per_token": se * math.sqrt(len(d)),
            "ratio": math.exp(mean), "ratio_ci95": [math.exp(mean - 1.96 * se), math.exp(mean + 1.96 * se)]}


def in_llama(args: list, **kwargs) -> subprocess.CompletedProcess:
    lib_dir = LLAMACPP_ROOT / f"llamacpp-{kwargs.pop('build')}" / "python"
    if not (lib_dir / "llama_cpp").is_dir():
        raise SystemExit(f"no llama.cpp build at {lib_dir}: run LLAMACPP_BUILD_ROOT={LLAMACPP_ROOT} "
                         "bench/setup_llamacpp.sh native")
    env = dict(os.environ, PYTHONPATH=str(lib_dir))
    return subprocess.run([sys.executable, __file__, *args], env=env, check=True,
                          capture_output=True, text=True, **kwargs)


def write_f32(source: pathlib.Path, out: pathlib.Path) -> None:
    """The model's values (its Q4_1 weights dequantized) as an F32 GGUF, llama.cpp's input."""
    import gguf
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests" / "worker"))
    from kquant_writer import copy_metadata

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    copy_metadata(reader, writer)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        writer.add_tensor(tensor.name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def check_unchanged(model: pathlib.Path) -> dict:
    """Every matrix as Loom packs it against gguf's dequantization."""
    import gguf
    import numpy as np

    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "common")]
    from ggml_type_test import read_tool_output

    out = CACHE / "packed.bin"
    done = subprocess.run([str(BUILD_DIR / "tests" / "tools" / "gguf_dequant_tool"), "--packed",
                           str(model), str(out)], capture_output=True, text=True, check=True)
    packings = collections.Counter(line.split(": ", 1)[1] for line in done.stderr.splitlines()
                                   if ": " in line)
    packed = read_tool_output(out)
    types, changed = collections.Counter(), []
    for tensor in gguf.GGUFReader(str(model)).tensors:
        types[tensor.tensor_type.name] += 1
        if len(tensor.shape) != 2:
            continue
        want = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(-1)
        got = packed[tensor.name]
        same = (np.array_equal(got, want) if tensor.tensor_type.name == "Q3_K"
                else np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)))
        if not same:
            changed.append(tensor.name)
    out.unlink()
    return {"tensor_types": dict(types), "loom_packings": dict(packings),
            "matrices_changed": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isa", choices=["avx2", "avx512"], default="avx512")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=2, help="speed passes per engine")
    parser.add_argument("--wait-quiet", type=float, default=300, metavar="S",
                        help="the speed passes wait up to S seconds for a quiet machine before "
                             "each part (cpu_vs_llamacpp.py's flag; the perplexity runs before "
                             "them load both cores)")
    parser.add_argument("--llama-build", help="$LLAMACPP_BUILD_ROOT/llamacpp-<name> (default: "
                                              "avx2 for --isa avx2, else native)")
    parser.add_argument("--ppl-tokens", type=int, default=0,
                        help="score the text's first N tokens (default 0: all of it)")
    parser.add_argument("--reuse-speed", action="store_true",
                        help="perplexity only: keep kquant_q4_k_m_speed_<isa>.json as it is")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "kquant_q4_k_m.json"))
    parser.add_argument("--llama-quantize", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--llama-perplexity", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_quantize:
        llama_quantize(*args.llama_quantize, args.threads)
        return
    if args.llama_perplexity:
        print(json.dumps(llama_perplexity(args.llama_perplexity, str(TEXT),
                                          args.context, args.ppl_tokens, args.threads)))
        return
    build = args.llama_build or ("avx2" if args.isa == "avx2" else "native")
    CACHE.mkdir(parents=True, exist_ok=True)
    TEXT.write_bytes((ROOT / "docs" / "ARCHITECTURE.md").read_bytes())
    text_sha256 = hashlib.sha256(TEXT.read_bytes()).hexdigest()
    f32 = CACHE / "default-f32.gguf"
    q4km = CACHE / "default-Q4_K_M.gguf"
    if not f32.exists():
        write_f32(pathlib.Path(args.model), f32)
    if not q4km.exists():
        in_llama(["--llama-quantize", str(f32), str(q4km), "--threads", str(args.threads)],
                 build=build)
    unchanged = check_unchanged(q4km)
    print(f"llama.cpp's Q4_K_M: {unchanged['tensor_types']}; Loom: {unchanged['loom_packings']}; "
          f"matrices changed: {len(unchanged['matrices_changed'])}", flush=True)

    def run_loom_perplexity(model, activations):
        nll_out = CACHE / "loom_nll.txt"
        limit = ["--max-tokens", str(args.ppl_tokens)] if args.ppl_tokens > 0 else []
        result = json.loads(subprocess.run(
            [str(BUILD_DIR / "coordinator" / "loom"), "perplexity", "--model", str(model), "--text",
             str(TEXT), "--context", str(args.context), "--json",
             *limit, "--threads", str(args.threads), "--activations", activations,
             "--nll-out", str(nll_out)],
            env=dict(os.environ, LOOM_CPU_ISA=args.isa), capture_output=True, text=True,
            check=True).stdout)
        token_nll = [float(v) for v in nll_out.read_text().split()]
        nll_out.unlink()
        return result, token_nll

    def run_llama_perplexity(model):
        return json.loads(in_llama(["--llama-perplexity", str(model), "--context", str(args.context),
                                    "--ppl-tokens", str(args.ppl_tokens), "--threads",
                                    str(args.threads)], build=build).stdout.strip().splitlines()[-1])

    # Loom with llama.cpp's arithmetic (--activations int8: Q8_0 activations for the legacy
    # formats, Q8_K for the K-quants) and with its exact default (float activations); the
    # original Q4_1 file beside, where both engines run the same formats.
    perplexity = {}
    for label, model in (("q4_k_m", q4km), ("q4_1_original", pathlib.Path(args.model))):
        llama = run_llama_perplexity(model)
        llama_nll = llama.pop("token_nll")
        llama["nll_stderr"] = nll_stderr(llama_nll)
        entry = {"llamacpp": llama}
        for activations in ("int8", "f32"):
            loom, loom_nll = run_loom_perplexity(model, activations)
            entry[f"loom_{activations}"] = loom
            entry[f"loom_{activations}_over_llamacpp"] = loom["perplexity"] / llama["perplexity"]
            pair = entry[f"loom_{activations}_paired"] = paired(loom_nll, llama_nll)
            print(f"{label} perplexity: loom --activations {activations} {loom['perplexity']:.4f} "
                  f"+/- {loom['perplexity_stderr']:.4f} ({loom['scored']} tokens), llama.cpp "
                  f"{llama['perplexity']:.4f} ({llama['scored']} tokens): ratio "
                  f"{pair['ratio']:.5f}, 95% interval {pair['ratio_ci95'][0]:.5f}-"
                  f"{pair['ratio_ci95'][1]:.5f} (target within 0.1%)", flush=True)
        perplexity[label] = entry
    ppl_ratio = perplexity["q4_k_m"]["loom_int8_over_llamacpp"]
    low, high = perplexity["q4_k_m"]["loom_int8_paired"]["ratio_ci95"]

    speed_json = pathlib.Path(args.out).with_name(f"kquant_q4_k_m_speed_{args.isa}.json")
    reuse_speed = args.reuse_speed and speed_json.exists()
    if not reuse_speed:
        subprocess.run([sys.executable, str(ROOT / "bench" / "cpu_vs_llamacpp.py"), "--isa", args.isa,
                        "--model", str(q4km), "--threads", str(args.threads), "--passes",
                        str(args.passes), "--llama-build", build, "--wait-quiet", str(args.wait_quiet),
                        "--out", str(speed_json), "--note",
                        "Q4_K_M made by llama.cpp's quantizer (bench/kquant_bench.py)"], check=True)
    speed = json.loads(speed_json.read_text())
    result = {
        "benchmark": "kquant_q4_k_m",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "provenance": provenance(),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "file": "SmolLM2-135M-Instruct as Q4_K_M by llama.cpp's llama_model_quantize "
                "(llama-cpp-python 0.3.36) from its Q4_1 values in F32",
        "no_tensor_changed": not unchanged["matrices_changed"],
        **unchanged,
        "perplexity": {"text": "docs/ARCHITECTURE.md", "text_sha256": text_sha256,
                       "context": args.context,
                       "stride": args.context // 2, **perplexity,
                       "q4_k_m_int8_within_0.1_percent": abs(ppl_ratio - 1) <= 1e-3,
                       # Equal as far as this text can tell, and whether it tells 0.1% apart.
                       "q4_k_m_int8_ci95_contains_1": low <= 1 <= high,
                       "q4_k_m_int8_ci95_inside_0.1_percent": 0.999 <= low and high <= 1.001},
        "speed": {"isa": args.isa, "json": speed_json.name, "reused": reuse_speed,
                  "date": speed.get("date"),
                  "loom_over_llamacpp": speed.get("loom_over_llamacpp"),
                  "machine_quiet": speed.get("machine_quiet"),
                  "targets_ge_1.2": {k: v >= 1.2 for k, v in (speed.get("loom_over_llamacpp") or {}).items()}},
    }
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"perplexity_ratio": ppl_ratio, "speed_ratios": speed.get("loom_over_llamacpp")}, indent=1))


if __name__ == "__main__":
    main()
