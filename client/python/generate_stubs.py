"""Generates the Python stubs of proto/loom/v1 into a folder that is importable as
`loom_client._proto` (the package build calls it; run it by hand for a source checkout):

    python client/python/generate_stubs.py client/python/loom_client/_proto

grpc_tools.protoc writes modules that import each other as `loom.v1.*`; those imports are
rewritten to `loom_client._proto.loom.v1.*` so the package does not claim a top-level `loom`
module. The descriptors keep their file names (loom/v1/*.proto), so other copies of the same
stubs in one process (the test harness's) are the same files to protobuf, not duplicates.
"""
import pathlib
import re
import sys

PROTO_ROOT = pathlib.Path(__file__).resolve().parents[2] / "proto"
PROTOS = ("loom/v1/worker.proto", "loom/v1/inference.proto")
PACKAGE = "loom_client._proto"


def generate(out_dir: pathlib.Path) -> None:
    from grpc_tools import protoc  # grpcio-tools
    import grpc_tools

    if not all((PROTO_ROOT / p).exists() for p in PROTOS):
        raise SystemExit(f"generate_stubs: {PROTO_ROOT} lacks {PROTOS}: build from the Loom repository")
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}",
            *(str(PROTO_ROOT / p) for p in PROTOS)]
    if protoc.main(args) != 0:
        raise SystemExit(f"generate_stubs: grpc_tools.protoc failed on {PROTOS}")
    for folder in (out_dir, out_dir / "loom", out_dir / "loom" / "v1"):
        (folder / "__init__.py").touch()
    for module in (out_dir / "loom" / "v1").glob("*.py*"):
        text = module.read_text()
        module.write_text(re.sub(r"^from loom\.v1 import", f"from {PACKAGE}.loom.v1 import", text,
                                 flags=re.M))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: generate_stubs.py OUT_DIR")
    generate(pathlib.Path(sys.argv[1]))
