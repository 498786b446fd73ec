"""Builds loom_client with its protocol stubs generated from the repository's proto/ folder.

The stubs are never committed: `build_py` runs generate_stubs.py, so a wheel always matches
the .proto files it was built from. Install from the repository: `pip install ./client/python`
(a non-editable install; the proto/ folder must sit two levels up, as in the repository).
"""
import pathlib
import sys

import setuptools
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate_stubs  # noqa: E402


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs.generate(pathlib.Path(self.build_lib) / "loom_client" / "_proto")


setuptools.setup(cmdclass={"build_py": BuildPyWithStubs})
