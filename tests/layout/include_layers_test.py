"""Each top-level folder includes only itself and the folders below it (docs/ARCHITECTURE.md,
"Layout"). The link-closure tests (tests/CMakeLists.txt) check what each library links;
this checks what each source file includes, which also catches a header-only use upward."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Folder -> the project folders its sources may include (besides itself). Third-party
# headers (absl/, grpcpp/, prometheus/, ...) and the generated protocol (loom/v1/) are not
# project folders and are not checked.
LAYERS = {
    "common": [],
    "kernels": ["common"],
    "model": ["kernels", "common"],
    "worker": ["model", "kernels", "common"],
    "quant": ["worker", "model", "kernels", "common"],
    "engine": ["common"],
    "coordinator": ["engine", "common"],
    "api": ["coordinator", "engine", "common"],
    "client": [],
    "cli": ["api", "coordinator", "engine", "quant", "worker", "model", "kernels", "common",
            "client"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/', re.MULTILINE)
SOURCES = ("*.h", "*.cc", "*.cu", "*.cuh")


def includes_of(folder: str):
    for pattern in SOURCES:
        for path in sorted((ROOT / folder).rglob(pattern)):
            for match in INCLUDE.finditer(path.read_text(errors="replace")):
                yield path.relative_to(ROOT), match.group(1)


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_folder_includes_only_downward(folder):
    project = set(LAYERS)
    allowed = {folder, *LAYERS[folder]}
    upward = [f"{path} includes {target}/" for path, target in includes_of(folder)
              if target in project and target not in allowed]
    assert not upward, "\n".join(upward)


def test_every_library_folder_is_layered():
    folders = {path.parent.name for path in ROOT.glob("*/CMakeLists.txt")}
    unlayered = folders - set(LAYERS) - {"proto", "bench", "tests", "deploy", "docs", "scripts"}
    assert not unlayered, f"folders with no layer in {__file__}: {sorted(unlayered)}"
