"""The C++ client as another project uses it: `cmake --install` of the build into a fresh
prefix, then client/examples (a standalone CMake project) configured with
find_package(LoomClient) against that prefix, built, and run against a port where nothing
listens (it must report UNAVAILABLE, having linked and started)."""
import os
import shutil
import socket
import subprocess

import pytest

from client_test_util import h


def run(args, **kwargs):
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_installed_client_builds_and_runs_an_external_project(tmp_path):
    if not (h.BUILD_DIR / "cmake_install.cmake").exists():
        pytest.fail(f"{h.BUILD_DIR} is not a configured build")
    prefix = tmp_path / "prefix"
    run(["cmake", "--install", h.BUILD_DIR, "--prefix", prefix], timeout=300)
    assert (prefix / "include" / "loom" / "client" / "client.h").exists()
    assert (prefix / "lib" / "cmake" / "LoomClient" / "LoomClientConfig.cmake").exists()

    example_build = tmp_path / "example"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", h.SOURCE_DIR / "client" / "examples", "-B", example_build, *generator,
         f"-DCMAKE_PREFIX_PATH={prefix}"], timeout=300)
    run(["cmake", "--build", example_build, "-j", str(min(os.cpu_count() or 1, 4))], timeout=600)

    with socket.socket() as s:  # a free port: connections to it are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([str(example_build / "generate"), "--address", f"127.0.0.1:{port}", "Hello"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "UNAVAILABLE" in done.stderr
