"""Shared pytest fixtures: where the build, the shared test data and the model are."""
import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("LOOM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[1]))
BUILD_DIR = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", SOURCE_DIR / "build"))
SHARED_DIR = pathlib.Path(os.environ.get("LOOM_SHARED_DIR", SOURCE_DIR.parent / "shared"))
MODEL_PATH = pathlib.Path(
    os.environ.get("LOOM_MODEL_PATH", SOURCE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def tool_path(name: str) -> pathlib.Path:
    """A driver built from tests/tools/<name>.cc."""
    path = BUILD_DIR / "tests" / "tools" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: build the project first")
    return path


@pytest.fixture(scope="session")
def model_path() -> pathlib.Path:
    if not MODEL_PATH.exists():
        pytest.fail(f"default model missing at {MODEL_PATH}: run scripts/fetch-model.sh")
    return MODEL_PATH


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    return SHARED_DIR
