"""A build without CUDA (`-DLOOM_CUDA=OFF`, or a machine without nvcc) still compiles: every
source that switches on LOOM_HAVE_CUDA is compiled here as that build would compile it
(LOOM_HAVE_CUDA and LOOM_HAVE_NCCL 0, no CUDA include directory), syntax only, from the
commands of this build (build/compile_commands.json). CI builds with CUDA, so without this
a stub falling out of step with its header (it happened: CudaDevice's) breaks only the users
who build without it. A whole OFF build takes a 2-core machine 20 minutes; this takes seconds
per file."""
import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", ROOT / "build"))
FOLDERS = ("common", "model", "worker", "quant", "engine", "coordinator", "api", "kernels", "cli")


def sources_switching_on_cuda() -> list[pathlib.Path]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.cc")):
            if "LOOM_HAVE_CUDA" in path.read_text(errors="replace"):
                found.append(path)
    return found


def without_cuda(command: list[str]) -> list[str]:
    """The compile command as a LOOM_CUDA=OFF build would run it, syntax only."""
    out = []
    skip_next = False
    for i, arg in enumerate(command):
        if skip_next:
            skip_next = False
            continue
        if arg in ("-o", "-c"):
            skip_next = arg == "-o"
            continue
        if arg in ("-isystem", "-I") and i + 1 < len(command) and "cuda" in command[i + 1].lower():
            skip_next = True
            continue
        if re.match(r"-(I|isystem).*cuda", arg, re.IGNORECASE):
            continue
        arg = re.sub(r"^-DLOOM_HAVE_(CUDA|NCCL)=1$", r"-DLOOM_HAVE_\1=0", arg)
        out.append(arg)
    return out + ["-fsyntax-only"]


def test_sources_compile_without_cuda():
    database = BUILD / "compile_commands.json"
    if not database.exists():
        pytest.fail(f"{database} is missing: configure the build first (scripts/build.sh)")
    commands = {}
    for entry in json.loads(database.read_text()):
        argv = entry.get("arguments") or shlex.split(entry["command"])
        commands[str(pathlib.Path(entry["directory"], entry["file"]).resolve())] = (entry["directory"], argv)
    sources = sources_switching_on_cuda()
    assert len(sources) >= 10, sources  # the CUDA backend's host sides and their stubs
    compiled = [s for s in sources if str(s.resolve()) in commands]
    # Tests and tools are compiled only where they are configured; every library source is.
    assert all(str(s.resolve()) in commands for s in sources if "tests" not in s.parts), \
        [str(s) for s in sources if str(s.resolve()) not in commands]

    def check(source: pathlib.Path):
        directory, argv = commands[str(source.resolve())]
        argv = without_cuda(argv)
        assert any(a == "-DLOOM_HAVE_CUDA=0" for a in argv), argv
        done = subprocess.run(argv, cwd=directory, capture_output=True, text=True, timeout=600)
        return source, done.returncode, done.stderr

    with concurrent.futures.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        failures = [f"{source.relative_to(ROOT)}:\n{stderr[-3000:]}"
                    for source, code, stderr in pool.map(check, compiled) if code != 0]
    assert not failures, "without CUDA these do not compile:\n" + "\n".join(failures)
