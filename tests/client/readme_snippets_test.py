"""Every ```python snippet of README.md, executed in order in one namespace (as a reader
pastes them into one session) against a real `loom serve` and CPU worker serving the default
model: the addresses are the test cluster's instead of the documented 127.0.0.1:8000 and
:50051. The TLS snippet only builds its client (in a folder holding a self-signed cert.pem)
and does so in a copy of the namespace, since the next snippets use the plain-HTTP client."""
import contextlib
import io
import json
import pathlib
import re
import sys

import pytest

from client_test_util import h, require_cluster_binaries

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def snippets():
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    require_cluster_binaries()
    with h.running_cluster(tmp_path_factory.mktemp("readme"), {"r0": {"threads": 1}}) as rig:
        yield rig


def test_readme_has_the_snippets_this_test_knows():
    found = snippets()
    assert len(found) == 7, [s.splitlines()[0] for s in found]
    assert sum("https://127.0.0.1:8000" in s for s in found) == 1


def test_every_python_snippet_runs(rig, tmp_path, monkeypatch):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "http"))
    from api_keys_test import make_certificate
    make_certificate(tmp_path)
    (tmp_path / "key.pem").unlink()
    monkeypatch.chdir(tmp_path)  # cert.pem, as the TLS snippet names it
    namespace = {"__name__": "__readme__"}
    outputs = []
    for snippet in snippets():
        code = (snippet.replace("http://127.0.0.1:8000", rig.coordinator.http_url)
                .replace("127.0.0.1:50051", rig.coordinator.address))
        target = dict(namespace) if "https://127.0.0.1:8000" in snippet else namespace
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "README.md", "exec"), target)  # noqa: S102 - the README's own code
        outputs.append(printed.getvalue())
    streamed, _, structured, tool_call, sdk_tool_call, sdk, async_sdk = outputs
    assert streamed.strip()
    city = json.loads(structured.splitlines()[0])
    assert set(city) == {"city", "population"} and isinstance(city["population"], int)
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", structured.splitlines()[1].strip())
    finish, name, arguments = tool_call.split(maxsplit=2)
    assert (finish, name) == ("tool_calls", "get_weather")
    assert set(json.loads(arguments)) == {"city", "unit"}
    assert sdk_tool_call.split(maxsplit=1)[0] == "get_weather"
    assert sdk.strip() and async_sdk.startswith("[")
    rig.coordinator.wait_idle(timeout=30)
