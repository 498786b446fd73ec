#!/usr/bin/env python3
"""Loom's CPU engine against llama.cpp, same GGUF, same threads, same machine, same run.

llama.cpp is built from the PyPI package llama-cpp-python by bench/setup_llamacpp.sh
(bench-only; never in CI or the serving path) and driven through its ctypes bindings
(llama_decode on batches; no sampling, logits of the last position of each sequence), with
llama.cpp's default context settings and environment (as its users run it: OpenMP threads
that spin at barriers, default flash-attention, KV types and KV layout: one KV stream per
sequence, `kv_unified = false`, which llama.h advises for sequences without a shared prefix,
as the batched sequences here are); the JSON records them. `--llama-kv-unified` adds a second,
labelled measurement of the batched figures with one unified KV buffer (`kv_unified = true`),
reported beside the default and never used for the ratios. Loom
runs bench/engine_bench under LOOM_CPU_ISA=<isa>.

Figures (tokens/s): pp512 (one 512-token prompt in one step), tg128 (one sequence, 128
decode steps after an 8-token prompt), batched decode of 16 and 64 sequences (128 steps,
one token per sequence per step). The two engines run alternately (llama.cpp, Loom,
llama.cpp, Loom, ... --passes times each) with the same thread count; the JSON keeps every
pass with the 1-minute load average before and after it, compares the medians, and sets
`machine_quiet` only if the load was below 0.5 per core before every pass (otherwise the
figures, llama.cpp's above all, are not credible: its spinning threads collapse when a
core is taken).

  --isa avx2:   Loom forced to AVX2 vs llama.cpp's avx2 build (AVX-512 off)
                -> bench/results/cpu_vs_llamacpp_avx2.json
  --isa avx512: Loom's AVX-512 path vs llama.cpp's native build (-march=native)
                -> bench/results/cpu_vs_llamacpp_avx512.json
  --isa amx --loom-activations bf16: Loom's BF16 activations on AMX tiles (Sapphire Rapids
                and later) vs the native build (--llama-build avx512 where its AMX matmul
                crashes, as on the Xeon of bench/results/cpu_vs_llamacpp_amx_bf16.json)
                -> bench/results/cpu_vs_llamacpp_amx_bf16.json (--loom-activations
                f32|int8|bf16, default f32, names any other mode so)

Commands (idle machine; LLAMACPP_BUILD_ROOT as given to setup_llamacpp.sh, default build/):
  LLAMACPP_BUILD_ROOT=/work/llamacpp bench/setup_llamacpp.sh avx2
  LLAMACPP_BUILD_ROOT=/work/llamacpp bench/setup_llamacpp.sh native
  LLAMACPP_BUILD_ROOT=/work/llamacpp .venv/bin/python bench/cpu_vs_llamacpp.py --isa avx2
  LLAMACPP_BUILD_ROOT=/work/llamacpp .venv/bin/python bench/cpu_vs_llamacpp.py --isa avx512

usage: bench/cpu_vs_llamacpp.py --isa avx2|avx512|amx [--loom-activations f32|int8|bf16]
       [--threads 2] [--tokens 128] [--passes 2]
       [--cpus 0-1] [--wait-quiet S] [--model PATH] [--llama-build avx2|avx512|native] [--out PATH]
Loom's binaries come from $LOOM_BUILD_DIR (default build/).
"""
import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from machine_load import load_1min, wait_quiet
from provenance import provenance

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD_DIR = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", ROOT / "build"))
LLAMACPP_ROOT = pathlib.Path(os.environ.get("LLAMACPP_BUILD_ROOT", ROOT / "build"))
BATCHES = [16, 64]
# The environment variables that change how llama.cpp's OpenMP threads wait or are placed.
OMP_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
           "GGML_NUMA")


def llama_worker(model: str, threads: int, tokens: int, batches: list,
                 also_unified: bool) -> dict:
    """Runs inside the llama.cpp build's PYTHONPATH; prints one JSON line."""
    import llama_cpp.llama_cpp as L

    L.llama_backend_init()
    model_params = L.llama_model_default_params()
    mdl = L.llama_model_load_from_file(model.encode(), model_params)
    if not mdl:
        raise SystemExit(f"llama.cpp could not load {model}")
    vocab = L.llama_model_get_vocab(mdl)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    max_seqs = max(batches + [1])

    def make_context(n_ctx, n_seq, kv_unified=None):
        """kv_unified None keeps llama.cpp's default."""
        params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = 512
        params.n_ubatch = 512
        params.n_seq_max = n_seq
        params.n_threads = threads
        params.n_threads_batch = threads
        if kv_unified is not None:
            params.kv_unified = kv_unified
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

    defaults = L.llama_context_default_params()
    result = {"system_info": L.llama_print_system_info().decode(),
              "settings": {"n_threads": threads, "n_threads_batch": threads, "n_batch": 512,
                           "n_ubatch": 512,
                           "kv_unified (default)": bool(defaults.kv_unified),
                           "flash_attn_type (default)": int(getattr(defaults, "flash_attn_type", -99)),
                           "type_k (default)": int(defaults.type_k),
                           "type_v (default)": int(defaults.type_v),
                           "env": {k: os.environ.get(k) for k in OMP_ENV}}}
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
    def batched(n, kv_unified):
        nonlocal ctx
        ctx = make_context(n * (8 + tokens) + 256, n, kv_unified)
        prompt = [(token_at(i, 11 + s), i, s, i == 7) for s in range(n) for i in range(8)]
        for begin in range(0, len(prompt), 512):
            decode(prompt[begin:begin + 512])
        start = time.perf_counter()
        for step in range(tokens):
            decode([(token_at(step, 13 + s), 8 + step, s, True) for s in range(n)])
        figure = n * tokens / (time.perf_counter() - start)
        L.llama_free(ctx)
        return figure

    result["batched"] = {str(n): batched(n, None) for n in batches}
    if also_unified:
        result["batched_kv_unified"] = {str(n): batched(n, True) for n in batches}
    L.llama_batch_free(batch)
    L.llama_model_free(mdl)
    return result


def parse_cpus(text: str) -> set:
    cpus = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def child_setup(args):
    """Pins a child process to --cpus (both engines alike); None when unset."""
    if not args.cpus:
        return None
    cpus = parse_cpus(args.cpus)
    return lambda: os.sched_setaffinity(0, cpus)


def run_llama(args) -> dict:
    lib_dir = LLAMACPP_ROOT / f"llamacpp-{args.llama_build}" / "python"
    if not (lib_dir / "llama_cpp").is_dir():
        raise SystemExit(f"no llama.cpp build at {lib_dir}: run LLAMACPP_BUILD_ROOT={LLAMACPP_ROOT} "
                         f"bench/setup_llamacpp.sh {args.llama_build}")
    # llama.cpp's own environment, unchanged (it passes n_threads to OpenMP itself).
    env = dict(os.environ, PYTHONPATH=str(lib_dir))
    out = subprocess.run(
        [sys.executable, __file__, "--llama-worker", "--model", args.model, "--threads",
         str(args.threads), "--tokens", str(args.tokens)]
        + (["--llama-kv-unified"] if args.llama_kv_unified else []),
        env=env, check=True, capture_output=True, text=True, preexec_fn=child_setup(args))
    return json.loads(out.stdout.strip().splitlines()[-1])


def engine_bench_result(model: str, threads: int, tokens: int, activations: str,
                        env: dict | None = None, preexec_fn=None, echo: bool = False,
                        extra_args: tuple = ()) -> dict:
    """One bench/engine_bench run (its full figures), its JSON parsed. engine_bench writes
    bench/results/engine_cpu*.json under LOOM_SOURCE_DIR: a scratch directory here, so the
    committed engine_cpu*.json stay as they are. `model` must be absolute (it runs there)."""
    engine = BUILD_DIR / "bench" / "engine_bench"
    if not engine.exists():
        raise SystemExit(f"no {engine}: cmake --build build --target engine_bench")
    with tempfile.TemporaryDirectory(prefix="engine_bench_") as tmp:
        (pathlib.Path(tmp) / "bench" / "results").mkdir(parents=True)
        out = subprocess.run(
            [str(engine), "--model", model, "--threads", str(threads), "--decode-tokens",
             str(tokens), "--activations", activations, *extra_args],
            env=dict(env or os.environ, LOOM_SOURCE_DIR=tmp), cwd=tmp, capture_output=True,
            text=True, preexec_fn=preexec_fn)
        if out.returncode != 0:
            raise SystemExit(f"engine_bench failed ({out.returncode}):\n{out.stderr[-3000:]}")
        if echo:
            sys.stdout.write(out.stdout)
        written = list((pathlib.Path(tmp) / "bench" / "results").glob("engine_cpu*.json"))
        if len(written) != 1:
            raise SystemExit(f"engine_bench wrote {written}, expected one engine_cpu*.json")
        return json.loads(written[0].read_text())


def run_loom(args) -> dict:
    result = engine_bench_result(str(pathlib.Path(args.model).resolve()), args.threads,
                                 args.tokens, args.loom_activations,
                                 env=dict(os.environ, LOOM_CPU_ISA=args.isa),
                                 preexec_fn=child_setup(args), echo=True)
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


def has_avx512() -> bool:
    try:
        return " avx512f " in pathlib.Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


def medians(passes: list, tg: str) -> dict:
    return {"pp512": statistics.median(p["pp512"] for p in passes),
            tg: statistics.median(p[tg] for p in passes),
            "batched": {str(n): statistics.median(p["batched"][str(n)] for p in passes)
                        for n in BATCHES}}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isa", choices=["avx2", "avx512", "amx"])
    parser.add_argument("--loom-activations", choices=["f32", "int8", "bf16"], default="f32",
                        help="Loom's --activations (default f32, the worker's default)")
    parser.add_argument("--threads", type=int, default=2, help="both engines (default 2)")
    parser.add_argument("--tokens", type=int, default=128, help="decode steps (tg<N>, batched)")
    parser.add_argument("--passes", type=int, default=2, help="alternating passes per engine")
    parser.add_argument("--cpus", default="", help="pin both engines to these CPUs (e.g. 0-1)")
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--llama-build", help="$LLAMACPP_BUILD_ROOT/llamacpp-<name> (default: "
                        "avx2 for --isa avx2, native for avx512)")
    parser.add_argument("--out", help="default bench/results/cpu_vs_llamacpp_<isa>.json")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                        help="before each pass, wait up to S seconds for a quiet machine")
    parser.add_argument("--note", default="", help="a note stored in the JSON")
    parser.add_argument("--llama-kv-unified", action="store_true",
                        help="also measure llama.cpp's batched decode with kv_unified = true "
                        "(reported beside the default, labelled; not used for the ratios)")
    parser.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_worker:
        print(json.dumps(llama_worker(args.model, args.threads, args.tokens, BATCHES,
                                      args.llama_kv_unified)))
        return
    if args.isa is None:
        parser.error("--isa is required")
    if args.isa in ("avx512", "amx") and not has_avx512():
        raise SystemExit(f"--isa {args.isa}: this CPU has no AVX-512 (/proc/cpuinfo lacks avx512f)")
    args.llama_build = args.llama_build or ("avx2" if args.isa == "avx2" else "native")
    tg = f"tg{args.tokens}"
    cores = len(os.sched_getaffinity(0))
    quiet_limit = 0.5 * cores

    runs = {"llamacpp": [], "loom": []}
    log = []
    for index in range(args.passes):
        for engine, run in (("llamacpp", run_llama), ("loom", run_loom)):
            before = wait_quiet(quiet_limit, args.wait_quiet)
            started = time.monotonic()
            figures = run(args)
            entry = {"engine": engine, "pass": index + 1, "load_1min_before": before,
                     "load_1min_after": load_1min(), "seconds": round(time.monotonic() - started, 1),
                     "quiet": before < quiet_limit}
            runs[engine].append(figures)
            log.append(entry)
            print(f"{engine} pass {index + 1}: pp512 {figures['pp512']:.1f}, {tg} {figures[tg]:.1f}, "
                  f"batched {json.dumps(figures['batched'])} tok/s; load {before} -> "
                  f"{entry['load_1min_after']}", flush=True)

    llama = medians(runs["llamacpp"], tg)
    if args.llama_kv_unified:
        llama["batched_kv_unified (labelled variant, not in the ratios)"] = {
            str(n): statistics.median(p["batched_kv_unified"][str(n)] for p in runs["llamacpp"])
            for n in BATCHES}
    loom = medians(runs["loom"], tg)
    ratios = {"pp512": loom["pp512"] / llama["pp512"], tg: loom[tg] / llama[tg]}
    for n in BATCHES:
        ratios[f"batched_{n}"] = loom["batched"][str(n)] / llama["batched"][str(n)]
    last_loom = runs["loom"][-1]
    prefill_vs_peak = statistics.median(p["prefill_vs_fma_peak"] for p in runs["loom"])
    batched64_over_single = loom["batched"]["64"] / loom[tg]
    targets = {
        "pp512_vs_llamacpp_ge_1.2": ratios["pp512"] >= 1.2,
        "prefill_vs_fma_peak_ge_0.5": prefill_vs_peak >= 0.5,
        "decode_vs_llamacpp_ge_1.2": ratios[tg] >= 1.2,
        "batched64_vs_single_ge_4": batched64_over_single >= 4,
    }
    machine_quiet = all(entry["quiet"] for entry in log)
    result = {
        "benchmark": "cpu_vs_llamacpp",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "provenance": provenance(),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "isa": args.isa, "loom_activations": args.loom_activations, "threads": args.threads, "cpus": args.cpus or "all", "cores": cores,
        "decode_tokens": args.tokens, "passes_per_engine": args.passes,
        "model": os.path.basename(args.model),
        "machine_quiet": machine_quiet,
        "machine_quiet_rule": f"1-minute load average < 0.5 per core ({quiet_limit:g}) before every pass",
        "passes": log,
        "llamacpp": {"package": "llama-cpp-python 0.3.36 (source build, bench/setup_llamacpp.sh "
                                f"{args.llama_build})",
                     "system_info": runs["llamacpp"][0].get("system_info", ""),
                     "settings": runs["llamacpp"][0].get("settings", {}),
                     "runs": [{k: v for k, v in p.items() if k not in ("system_info", "settings")}
                              for p in runs["llamacpp"]],
                     "median": llama},
        "loom": {"cpu_isa": last_loom["cpu_isa"], "matmul_isa": last_loom["matmul_isa"],
                 "limits": last_loom["limits"], "prefill_vs_fma_peak": prefill_vs_peak,
                 "runs": runs["loom"], "median": loom},
        "loom_over_llamacpp": ratios,
        "loom_batched64_over_single": batched64_over_single,
        "targets_met": targets,
    }
    notes = [args.note] if args.note else []
    if not machine_quiet:
        loads = [e["load_1min_before"] for e in log]
        notes.append(f"machine not quiet: 1-minute load average {min(loads)}-{max(loads)} before "
                     f"the passes on {cores} cores (limit {quiet_limit:g}); llama.cpp's "
                     "figures, above all, are not credible: rerun on an idle machine")
    if notes:
        result["note"] = " ".join(notes)
    suffix = "" if args.loom_activations == "f32" else f"_{args.loom_activations}"
    path = (pathlib.Path(args.out) if args.out
            else ROOT / "bench" / "results" / f"cpu_vs_llamacpp_{args.isa}{suffix}.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"loom_over_llamacpp": ratios, "targets_met": targets,
                      "machine_quiet": machine_quiet}, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
