"""Fixtures the OpenAI-API tests share: one `loom serve` cluster per test module (one CPU
worker, 2 threads, the default model), the official `openai` client for it, and the
served model's id. A module may set COORDINATOR_FLAGS (`loom serve` flags as keyword
arguments); one that needs another cluster (API keys, TLS) defines its own `rig`, which
overrides this one."""
import pathlib
import sys

import openai
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402


@pytest.fixture(scope="module")
def rig(request, tmp_path_factory):
    directory = h.cluster_log_dir(tmp_path_factory, pathlib.Path(request.module.__file__).stem)
    flags = getattr(request.module, "COORDINATOR_FLAGS", {})
    with h.running_cluster(directory, {"r0": {"threads": 2}}, **flags) as rig:
        yield rig


@pytest.fixture(scope="module")
def client(rig):
    return openai.OpenAI(base_url=rig.coordinator.http_url + "/v1", api_key="unused", max_retries=0,
                         timeout=600.0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id
