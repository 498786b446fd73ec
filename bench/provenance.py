"""Where a bench figure came from: every bench/results JSON carries provenance() under the key
"provenance" (the C++ benches write the same fields through bench/machine_limits.cc):

  revision       `git rev-parse HEAD` of the source checkout (LOOM_SOURCE_DIR, else this repo)
  dirty          true when `git status --porcelain` shows changed tracked files
  cpu            the model name from /proc/cpuinfo
  cpu_isa        the best of amx_int8 / avx512_vnni / avx512f / avx2 / scalar this CPU has
  cpu_isa_forced LOOM_CPU_ISA when set (the kernels then run that ISA), else null
  gpu            the first `nvidia-smi` GPU name, null without one
  cpus           logical CPUs
  load_1min      the 1-minute load average when the record was made
  machine_quiet  load_1min < 0.5 per logical CPU

A bench that checks the load before every pass (cpu_vs_llamacpp, serving_vs_llamacpp) keeps its
own stricter machine_quiet beside this one, which is only the load at the end.
"""
import os
import pathlib
import platform
import subprocess

from machine_load import load_1min

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
QUIET_LOAD_PER_CPU = 0.5


def _run(command: list) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_isa() -> str:
    flags = set()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return next((isa for isa in ("amx_int8", "avx512_vnni", "avx512f", "avx2") if isa in flags), "scalar")


def git_revision() -> str:
    return _run(["git", "-C", str(SOURCE_DIR), "rev-parse", "HEAD"]) or "unknown"


def provenance() -> dict:
    status = _run(["git", "-C", str(SOURCE_DIR), "status", "--porcelain", "--untracked-files=no"])
    gpus = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    load, cpus = load_1min(), os.cpu_count() or 1
    return {
        "revision": git_revision(),
        "dirty": bool(status),
        "cpu": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpu_isa_forced": os.environ.get("LOOM_CPU_ISA") or None,
        "gpu": gpus.splitlines()[0] if gpus else None,
        "cpus": cpus,
        "load_1min": load,
        "machine_quiet": load < QUIET_LOAD_PER_CPU * cpus,
    }


def write_record(path, record: dict) -> None:
    """Writes a bench's JSON record to `path` (its folders made), with provenance() under
    "provenance" unless the record has it already, and says so on stdout."""
    import json
    record.setdefault("provenance", provenance())
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    import json
    print(json.dumps(provenance(), indent=2))
