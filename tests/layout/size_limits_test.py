"""Sizes the layout promises (docs/ARCHITECTURE.md, "Layout"): no source file over 800 lines
and no function over 150 lines, outside kernels/ (whose launch files hold one kernel and its
variants) and tests/. A long function mixes concerns; a long file holds more than one concept.

Functions are found by brace matching on the source with comments and literals blanked: a
block opened at namespace or class scope whose header has a parameter list is a function
body, and everything up to its matching brace (lambdas included) counts toward it."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("common", "model", "worker", "quant", "engine", "coordinator", "api", "client",
           "cli", "bench")
SOURCES = ("*.h", "*.cc", "*.cu", "*.cuh")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 150
# Issue 33's splits still to make. The list may only shrink: a listed file or function
# back under its limit fails the test until it is taken off.
KNOWN_LONG_FILES = {"common/jinja/jinja_parser.cc"}
KNOWN_LONG_FUNCTIONS = {
    "common/formats/gguf_file.cc GgufFile::Parse",
    "common/formats/model_config.cc ModelConfigFromGguf",
    "common/jinja/jinja_filters.cc ApplyFilter",
    "common/tokenizer/hf_tokenizer.cc HfTokenizerToGguf",
    "worker/step_executor.cc StepExecutor::Prepare",
    "quant/model_quantizer.cc QuantizeModel",
    "api/openai_service.cc OpenAiService::Handle",
    "cli/worker_command.cc RunWorkerCommand",
    "bench/cpu_kernels_bench.cc main",
    "bench/engine_bench.cc main",
    "bench/quantized_gemm_bench.cu Run",
}

_LITERAL_OR_COMMENT = re.compile(
    r'//[^\n]*|/\*.*?\*/|R"([^(]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    r'|^[ \t]*#(?:\\\n|[^\n])*',
    re.DOTALL | re.MULTILINE)
_SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b")


def _blank(match: re.Match) -> str:
    """Keeps a literal's or comment's newlines (so line numbers hold) and drops its text."""
    return re.sub(r"[^\n]", " ", match.group(0))


def sources():
    for folder in FOLDERS:
        for pattern in SOURCES:
            yield from sorted((ROOT / folder).rglob(pattern))


def functions(text: str):
    """Yields (name, first line, line count) for every function body at namespace or class
    scope in C++ source `text`."""
    code = _LITERAL_OR_COMMENT.sub(_blank, text)
    stack = []  # per open brace: "scope", "function" or "block"
    header_start = 0
    for index, char in enumerate(code):
        if char in ";}":
            if char == "}" and stack:
                kind, start, name = stack.pop()
                if kind == "function" and "function" not in (k for k, _, _ in stack):
                    first = code.count("\n", 0, start) + 1
                    last = code.count("\n", 0, index) + 1
                    yield name, first, last - first + 1
            header_start = index + 1
        elif char == "{":
            inside_function = any(kind == "function" for kind, _, _ in stack)
            header = code[header_start:index]
            if inside_function:
                stack.append(("block", index, ""))
            elif ")" in header and not _SCOPE.match(header.strip()):
                name = re.findall(r"([~\w:]+)\s*\(", header)
                stack.append(("function", index, name[0] if name else "?"))
            elif _SCOPE.search(header) or header.strip().startswith("extern"):
                stack.append(("scope", index, ""))
            else:
                stack.append(("block", index, ""))
            header_start = index + 1


def test_no_file_over_the_limit():
    long_files, fixed = [], set(KNOWN_LONG_FILES)
    for path in sources():
        lines = path.read_text(errors="replace").count("\n")
        name = str(path.relative_to(ROOT))
        if lines > MAX_FILE_LINES:
            if name in KNOWN_LONG_FILES:
                fixed.discard(name)
            else:
                long_files.append(f"{name}: {lines} lines")
    assert not long_files, "\n".join(long_files)
    assert not fixed, f"under the limit now: take them off KNOWN_LONG_FILES: {sorted(fixed)}"


def test_no_function_over_the_limit():
    long_functions, fixed = [], set(KNOWN_LONG_FUNCTIONS)
    for path in sources():
        for name, first, count in functions(path.read_text(errors="replace")):
            if count > MAX_FUNCTION_LINES:
                key = f"{path.relative_to(ROOT)} {name}"
                if key in KNOWN_LONG_FUNCTIONS:
                    fixed.discard(key)
                else:
                    long_functions.append(f"{path.relative_to(ROOT)}:{first} {name}: {count} lines")
    assert not long_functions, "\n".join(long_functions)
    assert not fixed, f"under the limit now: take them off KNOWN_LONG_FUNCTIONS: {sorted(fixed)}"


def test_the_function_finder_measures_what_it_should():
    source = """#include "a.h"
#if defined(X)
#pragma once
#endif
namespace a {
int Short(int x) { return x; }
class C {
 public:
  void Inline() {
    auto f = [] { return "}"; };
  }
};
void C::Long(
    int y) {
  if (y) {
    // } not a brace
  }
}
}  // namespace a
"""
    found = {name: (first, count) for name, first, count in functions(source)}
    assert found == {"Short": (6, 1), "Inline": (9, 3), "C::Long": (14, 5)}
