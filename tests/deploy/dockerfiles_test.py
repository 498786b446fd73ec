"""deploy/docker/Dockerfile.{cpu,cuda}: they cannot be built here (no container runtime),
so check what can drift: the build stage installs every build package that
scripts/install-deps.sh installs (and nothing it does not), the runtime stage ships the
binaries under the names and the user the Helm chart runs them with."""
import pathlib
import re
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deploy_support import CHART_DIR, SOURCE_DIR  # noqa: E402

DOCKERFILES = [SOURCE_DIR / "deploy" / "docker" / name for name in ("Dockerfile.cpu", "Dockerfile.cuda")]
# install-deps.sh packages that only the tests, the fuzzer or tests/deploy (golang-*: the
# chart renderer) need.
TEST_ONLY = {"libgtest-dev", "libgmock-dev", "libbenchmark-dev", "clang", "libclang-rt-14-dev",
             "python3-venv"}


def install_deps_packages() -> set[str]:
    text = (SOURCE_DIR / "scripts" / "install-deps.sh").read_text()
    block = re.search(r"apt_packages=\((.*?)\n\)", text, re.S).group(1)
    block = re.sub(r"#[^\n]*", "", block)
    return set(block.split())


def instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [l for l in path.read_text().splitlines() if not l.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^(\w+)\s+(.*)$", text, re.M)]


def stages(path: pathlib.Path) -> dict[str, list[tuple[str, str]]]:
    out, current = {}, None
    for instruction, args in instructions(path):
        if instruction == "FROM":
            match = re.search(r"\bAS\s+(\S+)", args, re.I)
            current = match.group(1) if match else args
            out[current] = []
        elif current is not None:
            out[current].append((instruction, args))
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_build_stage_installs_the_projects_build_packages(dockerfile):
    build = stages(dockerfile)["build"]
    installed = set()
    for instruction, args in build:
        if instruction == "RUN" and "apt-get install" in args:
            command = args.split("apt-get install", 1)[1].split("&&")[0]
            installed |= {w for w in command.split() if not w.startswith("-")}
    # The libraries Loom builds against (-dev) and the build tools; test-only tools and
    # servers (pytest's, the fuzzer's, a metrics test's Prometheus) need not be there.
    build_tools = {"build-essential", "cmake", "ninja-build", "pkg-config",
                   "protobuf-compiler", "protobuf-compiler-grpc"}
    wanted = {p for p in install_deps_packages() - TEST_ONLY
              if (p.endswith("-dev") or p in build_tools) and not p.startswith("golang-")}
    assert len(wanted) > 10
    assert wanted - installed == set(), f"{dockerfile.name} lacks build packages"
    assert installed - install_deps_packages() <= {"ca-certificates"}, \
        f"{dockerfile.name} installs packages install-deps.sh does not"
    builds = " ".join(args for instruction, args in build if instruction == "RUN")
    assert "--target loom loom-worker" in builds and "-DLOOM_BUILD_TESTS=OFF" in builds


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_runtime_stage_ships_the_binaries_the_chart_runs(dockerfile):
    all_stages = stages(dockerfile)
    assert list(all_stages)[-1] == "runtime" and len(all_stages) >= 2
    runtime = all_stages["runtime"]
    copies = [args for instruction, args in runtime if instruction == "COPY"]
    assert any("--from=build" in c and "build/coordinator/loom " in c and
               "build/worker/loom-worker" in c and c.endswith("/usr/local/bin/") for c in copies)
    # Runtime libraries come from the list the build stage derives from ldd, nothing -dev.
    assert any("runtime-packages.txt" in args for instruction, args in runtime if instruction == "RUN")
    assert not any("-dev" in args for instruction, args in runtime if instruction == "RUN")
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    user = [args for instruction, args in runtime if instruction == "USER"]
    uid = str(values["podSecurityContext"]["runAsUser"])
    assert user and user[-1].split(":")[0] == uid
    base = next(args for instruction, args in instructions(dockerfile)
                if instruction == "FROM" and args.endswith("AS runtime"))
    assert "-slim" in base
