"""Tokenizer encode throughput: Loom (build/bench/tokenizer_bench) against Hugging Face
`tokenizers` on the same ~4 MB of mixed text with the same vocabulary (SmolLM2's), in
the same run. Prints MB/s of each, the ratio, and whether the ids agree; writes
bench/results/tokenizer.json.

usage: .venv/bin/python bench/tokenizer_bench.py [--model PATH] [--build-dir DIR] [--mb N]
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

import tokenizers

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "common"))
from hf_reference import build_reference  # noqa: E402
from provenance import provenance  # noqa: E402

WORDS = ("the of and to in is that for it as was with be by on not he I this are or his from "
         "at which but have an had they you were their one all we can her has there been if "
         "more when will would who so no tokenizer throughput inference scheduler attention "
         "Transformer GPU don't it's we'll they're I've naïve café Straße über").split()
OTHER = ["привет мир", "Καλημέρα κόσμε", "你好，世界", "我想在apple工作", "こんにちは世界",
         "안녕하세요", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Cửa Việt", "😀", "🚀🚀",
         "👩\u200d💻", "🦙", "✅", "→", "€100", "±0.5°C", "<|im_start|>", "<|im_end|>"]
CODE = ["def forward(self, x):\n    return self.proj(x) + x\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
        '{"model": "smollm2", "max_tokens": 256, "stream": true}\n',
        "SELECT id, name FROM users WHERE age > 30 ORDER BY name;\n",
        '<div class="row"><span>42</span></div>\n', "x = [i ** 2 for i in range(10)]\n"]


def generate_documents(total_bytes, seed=2024):
    """Deterministic mixed text: prose, numbers, other scripts, emoji, code, whitespace."""
    rng = random.Random(seed)
    documents, produced = [], 0
    while produced < total_bytes:
        target = rng.randrange(1024, 8192)
        parts, size = [], 0
        while size < target:
            kind = rng.randrange(20)
            if kind < 14:
                part = rng.choice(WORDS) + (", " if rng.randrange(12) == 0 else " ")
            elif kind < 16:
                part = f"{rng.randrange(100000)} "
            elif kind < 17:
                part = rng.choice(OTHER) + " "
            elif kind < 18:
                part = rng.choice(CODE)
            elif kind < 19:
                part = ". "
            else:
                part = rng.choice(["\n\n", "\n", "    ", "\t", "  "])
            parts.append(part)
            size += len(part.encode("utf-8"))
        doc = "".join(parts)
        documents.append(doc)
        produced += len(doc.encode("utf-8"))
    return documents


def fnv1a(ids_lists):
    value = 1469598103934665603
    for ids in ids_lists:
        for token in ids:
            value = ((value ^ (token & 0xFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def median_seconds(fn, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get(
        "LOOM_MODEL_PATH", str(SOURCE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")))
    parser.add_argument("--build-dir", default=os.environ.get("LOOM_BUILD_DIR", str(SOURCE_DIR / "build")))
    parser.add_argument("--mb", type=float, default=4.0, help="MB of text to encode")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    bench_binary = pathlib.Path(args.build_dir) / "bench" / "tokenizer_bench"
    if not bench_binary.exists():
        sys.exit(f"{bench_binary} is missing: build the tokenizer_bench target first")
    documents = generate_documents(int(args.mb * 1e6))
    total_bytes = sum(len(doc.encode("utf-8")) for doc in documents)

    reference = build_reference(args.model, individual_digits=True)
    hf_ids = [e.ids for e in reference.encode_batch(documents, add_special_tokens=False)]
    hf_single = median_seconds(
        lambda: [reference.encode(doc, add_special_tokens=False) for doc in documents], args.runs)
    hf_batch = median_seconds(
        lambda: reference.encode_batch(documents, add_special_tokens=False), args.runs)

    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as text_file:
        text_file.write("\0".join(documents).encode("utf-8"))
    try:
        result = subprocess.run([str(bench_binary), "--model", args.model, "--text", text_file.name,
                                 "--runs", str(max(args.runs, 7)), "--json"],
                                capture_output=True, text=True, check=True)
    finally:
        os.unlink(text_file.name)
    loom = json.loads(result.stdout)
    if loom["bytes"] != total_bytes:
        sys.exit(f"byte counts differ: loom {loom['bytes']}, python {total_bytes}")

    hf_single_mbs = total_bytes / 1e6 / hf_single
    hf_batch_mbs = total_bytes / 1e6 / hf_batch
    ids_match = loom["ids_fnv1a"] == fnv1a(hf_ids) and loom["tokens"] == sum(map(len, hf_ids))
    threads = os.cpu_count()
    print(f"text: {total_bytes / 1e6:.2f} MB in {len(documents)} documents, "
          f"{sum(map(len, hf_ids))} tokens (SmolLM2 vocabulary)")
    print(f"loom            {loom['mb_per_s']:8.2f} MB/s  (1 thread)")
    print(f"HF tokenizers   {hf_single_mbs:8.2f} MB/s  (encode, 1 thread)   "
          f"ratio loom/HF = {loom['mb_per_s'] / hf_single_mbs:.2f}")
    print(f"HF tokenizers   {hf_batch_mbs:8.2f} MB/s  (encode_batch, {threads} threads)  "
          f"ratio loom/HF = {loom['mb_per_s'] / hf_batch_mbs:.2f}")
    print(f"ids identical to HF: {ids_match}")

    record = {
        "benchmark": "tokenizer_encode",
        "provenance": provenance(),
        "machine": {"threads": threads, "host": platform.node(),
                    "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": pathlib.Path(args.model).name,
        "text_bytes": total_bytes,
        "documents": len(documents),
        "tokens": sum(map(len, hf_ids)),
        "loom_mb_per_s": round(loom["mb_per_s"], 3),
        "hf_single_thread_mb_per_s": round(hf_single_mbs, 3),
        "hf_batch_mb_per_s": round(hf_batch_mbs, 3),
        "hf_batch_threads": threads,
        "ratio_loom_vs_hf_single_thread": round(loom["mb_per_s"] / hf_single_mbs, 3),
        "ratio_loom_vs_hf_batch": round(loom["mb_per_s"] / hf_batch_mbs, 3),
        "ids_identical": ids_match,
        "tokenizers_version": tokenizers.__version__,
    }
    out_path = SOURCE_DIR / "bench" / "results" / "tokenizer.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out_path}")
    return 0 if ids_match else 1


if __name__ == "__main__":
    sys.exit(main())
