"""Shared by the client tests: the cluster harness (tests/cluster) on the import path, the
installed loom_client package, and prompts long enough to keep a replica busy."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

try:
    import loom_client
except ImportError as error:  # pragma: no cover - setup problem, reported as a failure
    raise ImportError(f"loom_client is not installed ({error}): run scripts/install-deps.sh or "
                      f".venv/bin/pip install ./client/python") from error

PROMPT = "The capital of France is"
# Runs for many seconds on the CPU backend: long enough to cancel mid-stream or to outlive
# a short deadline.
LONG_RUN_TOKENS = 4000


def require_sdk_parameter(name: str):
    """Fails (never skips) when the installed loom_client predates the generate() keyword `name`
    (an SDK installed from an older checkout)."""
    import inspect
    if name not in inspect.signature(loom_client.client._generate_request).parameters:
        pytest.fail(f"the installed loom_client predates `{name}`: run scripts/install-deps.sh or "
                    ".venv/bin/pip install ./client/python")


def require_cluster_binaries():
    missing = h.require_binaries(h.LOOM_BIN, h.WORKER_BIN)
    if missing:
        pytest.fail(missing)


def blocks_in_use(coordinator) -> int:
    return sum(r.num_kv_blocks - r.num_free_blocks for r in coordinator.replicas().values())
