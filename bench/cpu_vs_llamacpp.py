#!/usr/bin/env python3
"""Loom's CPU engine against llama.cpp, same GGUF, same threads, same machine, same run.

llama.cpp is built from the PyPI package llama-cpp-python by bench/setup_llamacpp.sh
(bench-only; never in CI or the serving path) and driven through its ctypes bindings
(llama_decode on batches; no sampling, logits of the last position of each sequence).
Loom runs bench/engine_bench (build/bench/engine_bench) under LOOM_CPU_ISA=<isa>.

Figures (tokens/s): pp512 (one 512-token prompt in one step), tg128 (one sequence, 128
decode steps after an 8-token prompt), batched decode of 16 and 64 sequences (128 steps,
one token per sequence per step). llama.cpp is measured before and after Loom (the machine
may be shared); the JSON keeps both passes and compares against their mean.

usage: bench/cpu_vs_llamacpp.py --isa avx2|avx512 [--threads 2] [--model PATH]
writes bench/results/cpu_vs_llamacpp_<isa>.json
"""
import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def llama_worker(model: str, threads: int, tokens: int, batches: list) -> dict:
    """Runs inside the llama.cpp build's PYTHONPATH; prints one JSON line."""
    import ctypes
    import llama_cpp.llama_cpp as L

    L.llama_backend_init()
    model_params = L.llama_model_default_params()
    mdl = L.llama_model_load_from_file(model.encode(), model_params)
    if not mdl:
        raise SystemExit(f"llama.cpp could not load {model}")
    vocab = L.llama_model_get_vocab(mdl)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    max_seqs = max(batches + [1])

    def make_context(n_ctx, n_seq):
        params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = 512
        params.n_ubatch = 512
        params.n_seq_max = n_seq
        params.n_threads = threads
        params.n_threads_batch = threads
        params.kv_unified = True
        params.no_perf = True
        ctx = L.llama_init_from_model(mdl, params)
        if not ctx:
            raise SystemExit("llama.cpp could not create a context")
        return ctx

    def token_at(i, seed):
        state = (seed * 2654435761 + 1 + i * 1013904223) & 0xFFFFFFFF
        return (state >> 8) % n_vocab

    batch = L.llama_batch_init(512, 0, max_seqs)

    def fill(entries):
        """entries: (token, pos, seq, wants_logits)."""
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if logits else 0

    def decode(entries):
        fill(entries)
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        L.llama_synchronize(ctx)

    def clear():
        L.llama_memory_clear(L.llama_get_memory(ctx), True)

    result = {"system_info": L.llama_print_system_info().decode()}
    ctx = make_context(1024, 1)
    # Warm-up.
    decode([(token_at(i, 1), i, 0, i == 63) for i in range(64)])
    clear()
    pp = []
    for rep in range(3):
        entries = [(token_at(i, 99 + rep), i, 0, i == 511) for i in range(512)]
        start = time.perf_counter()
        decode(entries)
        pp.append(512 / (time.perf_counter() - start))
        clear()
    result["pp512"] = statistics.median(pp)
    tg = []
    for rep in range(3):
        decode([(token_at(i, 7 + rep), i, 0, i == 7) for i in range(8)])
        start = time.perf_counter()
        for step in range(tokens):
            decode([(token_at(step, 5), 8 + step, 0, True)])
        tg.append(tokens / (time.perf_counter() - start))
        clear()
    result[f"tg{tokens}"] = statistics.median(tg)
    L.llama_free(ctx)
    result["batched"] = {}
    for n in batches:
        ctx = make_context(n * (8 + tokens) + 256, n)
        prompt = [(token_at(i, 11 + s), i, s, i == 7) for s in range(n) for i in range(8)]
        for begin in range(0, len(prompt), 512):
            decode(prompt[begin:begin + 512])
        start = time.perf_counter()
        for step in range(tokens):
            decode([(token_at(step, 13 + s), 8 + step, s, True) for s in range(n)])
        result["batched"][str(n)] = n * tokens / (time.perf_counter() - start)
        L.llama_free(ctx)
    L.llama_batch_free(batch)
    L.llama_model_free(mdl)
    return result


def run_llama(args) -> dict:
    lib_dir = ROOT / "build" / f"llamacpp-{args.llama_build}" / "python"
    if not (lib_dir / "llama_cpp").is_dir():
        raise SystemExit(f"no llama.cpp build at {lib_dir}: run bench/setup_llamacpp.sh "
                         f"{args.llama_build}")
    env = dict(os.environ, PYTHONPATH=str(lib_dir), OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(
        [sys.executable, __file__, "--llama-worker", "--model", args.model, "--threads",
         str(args.threads), "--tokens", str(args.tokens)],
        env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_loom(args) -> dict:
    env = dict(os.environ, LOOM_CPU_ISA=args.isa)
    engine = ROOT / "build" / "bench" / "engine_bench"
    out = subprocess.run(
        [str(engine), "--model", args.model, "--threads", str(args.threads),
         "--decode-tokens", str(args.tokens)],
        env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    result = json.loads((ROOT / "bench" / "results" / f"engine_cpu_{args.isa}.json").read_text())
    batched = {str(b["sequences"]): b["tokens_per_s"] for b in result["batched_decode"]}
    return {
        "pp512": result["prefill_512"]["tokens_per_s"],
        f"tg{args.tokens}": result["decode_single"]["tokens_per_s"],
        "batched": batched,
        "cpu_isa": result["cpu_isa"],
        "matmul_isa": result["matmul_isa"],
        "limits": result["limits"],
        "prefill_vs_fma_peak": result["prefill_512"]["vs_fma_peak"],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--isa", choices=["avx2", "avx512"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--llama-build", help="build/llamacpp-<name> (default: avx2 for "
                        "--isa avx2, native for avx512)")
    parser.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_worker:
        print(json.dumps(llama_worker(args.model, args.threads, args.tokens, [16, 64])))
        return
    if args.isa is None:
        parser.error("--isa is required")
    args.llama_build = args.llama_build or ("avx2" if args.isa == "avx2" else "native")
    tg = f"tg{args.tokens}"
    load_before = os.getloadavg()[0]
    llama_first = run_llama(args)
    print("llama.cpp (first pass):", json.dumps(llama_first))
    loom = run_loom(args)
    llama_second = run_llama(args)
    print("llama.cpp (second pass):", json.dumps(llama_second))
    load_after = os.getloadavg()[0]

    def mean(key, sub=None):
        values = [p[key][sub] if sub else p[key] for p in (llama_first, llama_second)]
        return sum(values) / len(values)

    llama = {"pp512": mean("pp512"), tg: mean(tg),
             "batched": {n: mean("batched", n) for n in ("16", "64")}}
    ratios = {"pp512": loom["pp512"] / llama["pp512"], tg: loom[tg] / llama[tg]}
    for n in ("16", "64"):
        if n in loom["batched"]:
            ratios[f"batched_{n}"] = loom["batched"][n] / llama["batched"][n]
    targets = {
        "pp512_vs_llamacpp_ge_1.2": ratios["pp512"] >= 1.2,
        "prefill_vs_fma_peak_ge_0.5": loom["prefill_vs_fma_peak"] >= 0.5,
        "decode_vs_llamacpp_ge_1.2": ratios[tg] >= 1.2,
        "batched64_vs_single_ge_4": loom["batched"].get("64", 0) / loom[tg] >= 4,
    }
    result = {
        "benchmark": "cpu_vs_llamacpp",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "isa": args.isa, "threads": args.threads, "model": os.path.basename(args.model),
        "llamacpp": {"package": "llama-cpp-python 0.3.36 (source build, bench/setup_llamacpp.sh "
                                f"{args.llama_build})",
                     "system_info": llama_first.get("system_info", ""),
                     "passes": [llama_first, llama_second], "mean": llama},
        "loom": loom,
        "loom_over_llamacpp": ratios,
        "loom_batched64_over_single": loom["batched"].get("64", 0) / loom[tg],
        "targets_met": targets,
        "load_average_1min": [load_before, load_after],
    }
    path = ROOT / "bench" / "results" / f"cpu_vs_llamacpp_{args.isa}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"loom_over_llamacpp": ratios, "targets_met": targets}, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
