"""The JSON-Schema-Test-Suite's draft 2020-12 schemas through Loom's structured output:
for each schema, `loom up` on the default model generates a reply constrained by it
(`response_format: json_schema`, the official `openai` client), and Python's `jsonschema`
validates the reply. Reports how many schemas Loom compiles, how many replies validate
(the pass count), which keywords it refuses by name, and every invalid reply (a bug).

The suite comes from PyPI: the `jsonschema` source distribution carries it under
`json/tests/` (the version installed in .venv, downloaded once into bench/.cache/). Only
the top-level draft2020-12 files are used (`optional/` covers formats and big numbers).

Outcomes per schema:
  valid      the reply parses and `jsonschema` accepts it (Draft 2020-12, formats off);
  invalid    the reply parses but fails validation, or does not parse (a grammar bug);
  length     the reply hit --max-tokens before the grammar let it end (cannot be judged);
  refused    HTTP 400 naming an unsupported keyword or an unsatisfiable schema;
  error      anything else (a 5xx, a timeout: a bug).
The pass rate is valid / (schemas - refused-as-unsatisfiable), and valid / compiled.

usage: .venv/bin/python bench/json_schema_suite_bench.py [--clients 16] [--max-tokens 96]
       [--limit N] [--threads N]
"""
import argparse
import collections
import concurrent.futures
import datetime
import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile

import jsonschema
import openai

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SOURCE_DIR / "tests" / "cluster"))
sys.path.insert(0, str(SOURCE_DIR / "bench"))
import cluster_harness as h  # noqa: E402
from provenance import provenance, write_record  # noqa: E402

MESSAGES = [{"role": "user", "content": "Reply with one JSON value."}]
SUITE_DIR = "json/tests/draft2020-12"


def suite_files(cache: pathlib.Path) -> tuple[str, list[tuple[str, bytes]]]:
    """(jsonschema version, [(file name, contents)]) of the suite's top-level draft 2020-12 files."""
    version = importlib.metadata.version("jsonschema")
    archive = cache / f"jsonschema-{version}.tar.gz"
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"jsonschema=={version}", "-d", str(cache)], check=True)
    files = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) == 2 and parts[1].startswith(SUITE_DIR + "/") and member.name.endswith(".json") \
                    and "/" not in parts[1][len(SUITE_DIR) + 1:]:
                files.append((pathlib.Path(member.name).name, tar.extractfile(member).read()))
    if not files:
        raise SystemExit(f"{archive} has no {SUITE_DIR}/*.json")
    return version, sorted(files)


def refusal_reason(message: str) -> str:
    """A short class for a 400's message: the keyword it names, or the start of its reason."""
    for pattern in (r"JSON Schema keyword '([$\w]+)", r"JSON Schema at \S+: '([$\w]+)'",
                    r"JSON Schema at \S+: (.{0,40})"):
        match = re.search(pattern, message)
        if match:
            return match.group(1)
    return message[:60]


def judge(client, model, schema, max_tokens: int, seed: int) -> dict:
    response_format = {"type": "json_schema", "json_schema": {"name": "suite", "schema": schema}}
    try:
        response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens,
                                                  temperature=0.7, seed=seed, response_format=response_format)
    except openai.BadRequestError as error:
        message = str(error.body.get("message", error)) if isinstance(error.body, dict) else str(error)
        return {"outcome": "refused", "reason": refusal_reason(message), "message": message[:300]}
    except Exception as error:  # noqa: BLE001 (anything else is a bug to report, not to hide)
        return {"outcome": "error", "message": f"{type(error).__name__}: {error}"[:300]}
    choice = response.choices[0]
    text = choice.message.content or ""
    if choice.finish_reason == "length":
        return {"outcome": "length", "reply": text[:200]}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return {"outcome": "invalid", "reply": text[:300], "why": f"not JSON: {error}"}
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    if errors:
        return {"outcome": "invalid", "reply": text[:300], "why": errors[0].message[:200]}
    return {"outcome": "valid"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--limit", type=int, default=0, help="first N schemas only (0: all)")
    parser.add_argument("--threads", type=int, default=0, help="worker threads (default: all cores)")
    parser.add_argument("--cache", default=str(SOURCE_DIR / "bench" / ".cache"))
    parser.add_argument("--out", default=str(SOURCE_DIR / "bench" / "results" / "json_schema_suite.json"))
    args = parser.parse_args()
    args.threads = args.threads or os.cpu_count() or 1
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        sys.exit(missing)

    version, files = suite_files(pathlib.Path(args.cache))
    cases = []
    for name, contents in files:
        for group in json.loads(contents):
            cases.append({"file": name, "description": group["description"], "schema": group["schema"]})
    if args.limit:
        cases = cases[:args.limit]
    print(f"{len(cases)} schemas from {len(files)} files of the JSON-Schema-Test-Suite "
          f"(jsonschema {version} sdist, {SUITE_DIR})", flush=True)

    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="loom_json_schema_suite_"))
    up = h.Up(log_dir, replicas=1, threads=args.threads)
    try:
        up.wait_healthy(["replica-0"], timeout=300)
        client = openai.OpenAI(base_url=up.http_url + "/v1", api_key="unused", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.clients) as pool:
            verdicts = list(pool.map(lambda ic: judge(client, model, ic[1]["schema"], args.max_tokens, ic[0]),
                                     enumerate(cases)))
        up.wait_idle(timeout=60)  # nothing leaked: every refused or finished request freed its blocks
    finally:
        rc = up.stop(timeout=30)
    if rc != 0:
        print(f"warning: loom up exited with {rc}\n{up.log_tail()}")

    for case, verdict in zip(cases, verdicts):
        case.update(verdict)
    counts = collections.Counter(c["outcome"] for c in cases)
    compiled = len(cases) - counts["refused"]
    reasons = collections.Counter(c["reason"] for c in cases if c["outcome"] == "refused")
    per_file = collections.defaultdict(collections.Counter)
    for c in cases:
        per_file[c["file"]][c["outcome"]] += 1
    print(f"schemas {len(cases)}: compiled {compiled}, valid {counts['valid']}, invalid {counts['invalid']}, "
          f"length {counts['length']}, refused {counts['refused']}, error {counts['error']}")
    print(f"pass rate over compiled schemas: {counts['valid'] / max(1, compiled):.3f} "
          f"({counts['valid']} of {compiled}); over all: {counts['valid'] / max(1, len(cases)):.3f}")
    print("refused by reason:", dict(reasons.most_common()))
    for c in cases:
        if c["outcome"] in ("invalid", "error"):
            print(f"  {c['outcome']}: {c['file']}: {c['description']}: {c.get('why', c.get('message'))} "
                  f"reply={c.get('reply', '')!r}")

    record = {
        "benchmark": "json_schema_suite",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "provenance": provenance(),
        "suite": {"source": f"jsonschema=={version} sdist from PyPI", "directory": SUITE_DIR,
                  "files": len(files), "schemas": len(cases)},
        "settings": {"clients": args.clients, "max_tokens": args.max_tokens, "temperature": 0.7,
                     "threads": args.threads, "messages": MESSAGES},
        "limit": "jsonschema.Draft202012Validator on every reply (the reference validator, same run)",
        "counts": dict(counts), "compiled": compiled,
        "pass_rate_compiled": round(counts["valid"] / max(1, compiled), 4),
        "pass_rate_all": round(counts["valid"] / max(1, len(cases)), 4),
        "refused_by_reason": dict(reasons.most_common()),
        "per_file": {name: dict(c) for name, c in sorted(per_file.items())},
        "cases": cases,
    }
    write_record(args.out, record)


if __name__ == "__main__":
    main()
