"""Helpers of the deployment tests: render the Helm chart, read the binaries' flags.

Helm cannot be installed here, so charts are rendered by tests/deploy/helm_render, a small
Go program on the engine Helm itself uses (text/template + sprig, from Debian's
golang-go and golang-github-masterminds-sprig-dev; values.schema.json through
golang-github-xeipuuv-gojsonschema-dev, as Helm 3 does), built once per source version.
"""
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
from cluster_harness import require_binaries  # noqa: E402

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", SOURCE_DIR / "build"))
CHART_DIR = SOURCE_DIR / "deploy" / "helm" / "loom"
RENDERER_SOURCE = SOURCE_DIR / "tests" / "deploy" / "helm_render" / "main.go"
# Where Loom registers its Prometheus metrics.
METRIC_SOURCES = [SOURCE_DIR / "coordinator" / "metrics.cc",
                  SOURCE_DIR / "worker" / "worker_metrics.cc"]
# Debian's Go libraries (GOPATH layout).
DEBIAN_GOPATH = pathlib.Path("/usr/share/gocode")


def build_renderer() -> pathlib.Path:
    """Builds helm_render into the build tree (cached by source hash); fails if Go or sprig
    is missing, since scripts/install-deps.sh installs both."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("`go` is missing: run scripts/install-deps.sh (Debian package golang-go)")
    for library, package in [("github.com/Masterminds/sprig", "golang-github-masterminds-sprig-dev"),
                             ("github.com/xeipuuv/gojsonschema", "golang-github-xeipuuv-gojsonschema-dev"),
                             ("gopkg.in/yaml.v2", "golang-gopkg-yaml.v2-dev"),
                             ("gopkg.in/yaml.v3", "golang-gopkg-yaml.v3-dev")]:
        if not (DEBIAN_GOPATH / "src" / library).is_dir():
            pytest.fail(f"{library} is missing: run scripts/install-deps.sh (Debian package {package})")
    out_dir = BUILD_DIR / "tests" / "deploy"
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(RENDERER_SOURCE.read_bytes()).hexdigest()[:16]
    binary = out_dir / f"helm_render-{digest}"
    if binary.exists():
        return binary
    env = dict(os.environ, GO111MODULE="off", GOPATH=str(DEBIAN_GOPATH),
               GOCACHE=str(out_dir / "go-cache"), GOFLAGS="")
    # Test files run side by side (ctest -j): build to a private name, rename atomically.
    tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
    result = subprocess.run([go, "build", "-o", str(tmp), str(RENDERER_SOURCE)], env=env,
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        pytest.fail(f"building helm_render failed:\n{result.stderr}")
    tmp.rename(binary)
    return binary


def render(renderer: pathlib.Path, values: dict | None = None, values_files=(),
           tmp_path: pathlib.Path | None = None, namespace: str = "serving"):
    """`helm template` of the chart: returns (returncode, manifests, stderr)."""
    args = [str(renderer), str(CHART_DIR), "--namespace", namespace, "--release", "loom"]
    for path in values_files:
        args += ["-f", str(path)]
    if values:
        assert tmp_path is not None
        extra = tmp_path / f"values-{hashlib.sha256(repr(values).encode()).hexdigest()[:8]}.yaml"
        extra.write_text(yaml.safe_dump(values))
        args += ["-f", str(extra)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return result.returncode, [], result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return 0, docs, result.stderr


def binary_flags(binary: pathlib.Path, *args: str) -> set[str]:
    """Every `--flag` that `binary args --help` mentions."""
    missing = require_binaries(binary)  # an unbuilt binary fails, as in the rest of the suite
    if missing:
        pytest.fail(missing)
    result = subprocess.run([str(binary), *args, "--help"], capture_output=True, text=True,
                            timeout=30)
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", result.stdout + result.stderr))
    assert flags, f"{binary} {' '.join(args)} --help printed no flags:\n{result.stdout}{result.stderr}"
    return flags


def http_routes(source: pathlib.Path) -> set[str]:
    """The GET routes the coordinator's HTTP server registers."""
    return set(re.findall(r'(?:router\.Add|add)\(\s*"GET", "(/[^"]*)"', source.read_text()))


def exported_metrics(sources=METRIC_SOURCES) -> dict[str, str]:
    """Series name -> type, from the Build*().Name("...") registrations in the sources."""
    metrics = {}
    for source in sources:
        if not source.exists():
            continue
        text = source.read_text()
        for kind, name in re.findall(r'Build(Counter|Gauge|Histogram|Summary)\(\)\s*\.Name\("([^"]+)"\)',
                                     text):
            if kind == "Histogram":
                for suffix in ("_bucket", "_sum", "_count"):
                    metrics[name + suffix] = "histogram"
            elif kind == "Summary":
                for suffix in ("", "_sum", "_count"):
                    metrics[name + suffix] = "summary"
            else:
                metrics[name] = kind.lower()
    return metrics
