"""`--model org/name`: Hugging Face Hub ids resolved through the local Hub cache (cli/hf_hub.cc).

A local HTTP server plays the Hub (HF_ENDPOINT): the model-info API
(/api/models/ORG/NAME/revision/REV: the commit and the file list), file downloads
(/ORG/NAME/resolve/COMMIT/FILE, answered through a redirect to another path as the Hub's CDN
does), a gated repository that needs `Authorization: Bearer TOKEN`, and a GGUF-only repository.
The served model is a random model's Hugging Face directory (tests/common/hf_checkpoint.py), so:

* online, `loom generate --model testorg/tiny` downloads it into HF_HUB_CACHE as
  huggingface_hub lays it out (models--testorg--tiny/refs/main -> snapshots/COMMIT/...) and
  generates what the same directory gives from disk;
* offline (HF_HUB_OFFLINE=1, server gone) the cached snapshot serves; an uncached repository
  is refused naming HF_HUB_OFFLINE; with the Hub unreachable but a snapshot cached, that serves;
* a second online run downloads nothing (files already there);
* a gated repository without HF_TOKEN is refused naming HF_TOKEN, and works with it;
* an unknown repository is "not found"; a repository without config.json names its GGUF files,
  and `org/name/FILE.gguf` fetches that one file.
"""
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import BUILD_DIR

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "worker"))
sys.path.insert(0, str(TESTS / "common"))

import hf_checkpoint  # noqa: E402
import random_model  # noqa: E402

LOOM_BIN = BUILD_DIR / "coordinator" / "loom"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_test_token"
PROMPT = "the quick brown fox"


class FakeHub(http.server.ThreadingHTTPServer):
    """repos: "org/name" -> (directory, needs_token). Counts file downloads."""

    def __init__(self, repos):
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.repos = repos
        self.downloads = []


class HubHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _repo(self, org, name):
        entry = self.server.repos.get(f"{org}/{name}")
        if entry is None:
            self.send_error(404, "Repository not found")
            return None
        directory, gated = entry
        if gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_error(401, "Access to this model is restricted")
            return None
        return directory

    def do_GET(self):
        parts = self.path.split("/")
        if self.path.startswith("/api/models/") and len(parts) == 7 and parts[5] == "revision":
            directory = self._repo(parts[3], parts[4])
            if directory is None:
                return
            if parts[6] not in ("main", COMMIT):
                self.send_error(404, "Revision not found")
                return
            files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
            body = json.dumps({"id": f"{parts[3]}/{parts[4]}", "sha": COMMIT,
                               "siblings": [{"rfilename": f} for f in files]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif len(parts) >= 6 and parts[3] == "resolve":
            # The Hub answers large files with a redirect to its CDN: send one.
            directory = self._repo(parts[1], parts[2])
            if directory is None:
                return
            self.send_response(302)
            self.send_header("Location", "/cdn/" + "/".join(parts[1:3] + parts[5:]))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith("/cdn/"):
            org, name, *rest = parts[2:]
            directory = self.server.repos[f"{org}/{name}"][0]
            path = directory / "/".join(rest)
            if not path.is_file():
                self.send_error(404, "Entry not found")
                return
            data = path.read_bytes()
            self.server.downloads.append("/".join(rest))
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_error(404)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    gguf_path = random_model.write_model(random_model.SPECS["llama_gqa"], base / "tiny.gguf")
    directory = hf_checkpoint.write_hf_directory(gguf_path, base / "tiny", dtype="float32")
    gguf_only = base / "gguf_repo"
    gguf_only.mkdir()
    shutil.copy(gguf_path, gguf_only / "tiny-Q4_1.gguf")
    server = FakeHub({"testorg/tiny": (directory, False), "testorg/gated": (directory, True),
                      "testorg/tiny-gguf": (gguf_only, False)})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"server": server, "endpoint": f"http://127.0.0.1:{server.server_address[1]}",
           "directory": directory, "gguf": gguf_path}
    server.shutdown()


def generate(model, env_changes, max_tokens=8):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(env_changes)
    return subprocess.run([str(LOOM_BIN), "generate", "--model", str(model), "--prompt", PROMPT,
                           "--max-tokens", str(max_tokens), "--threads", "1"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_hub_id_downloads_into_the_cache_and_generates_what_the_directory_gives(hub, tmp_path):
    cache = tmp_path / "cache"
    online = {"HF_ENDPOINT": hub["endpoint"], "HF_HUB_CACHE": str(cache)}
    local = generate(hub["directory"], {})
    assert local.returncode == 0, local.stderr
    hub["server"].downloads.clear()
    fetched = generate("testorg/tiny", online)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout == local.stdout
    assert "downloaded testorg/tiny/model.safetensors" in fetched.stderr
    repo = cache / "models--testorg--tiny"
    assert (repo / "refs" / "main").read_text() == COMMIT
    snapshot = repo / "snapshots" / COMMIT
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        assert (snapshot / name).read_bytes() == (hub["directory"] / name).read_bytes(), name
    assert not list(snapshot.glob("*.incomplete"))
    assert "model.safetensors" in hub["server"].downloads

    # Online again: the files are there, nothing is downloaded.
    hub["server"].downloads.clear()
    again = generate("testorg/tiny", online)
    assert again.returncode == 0 and again.stdout == local.stdout, again.stderr
    assert hub["server"].downloads == []

    # Offline: the cache alone; an uncached repository is refused by name.
    offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": "http://127.0.0.1:9"}
    cached = generate("testorg/tiny", offline)
    assert cached.returncode == 0 and cached.stdout == local.stdout, cached.stderr
    missing = generate("testorg/other", offline)
    assert missing.returncode != 0 and "HF_HUB_OFFLINE" in missing.stderr, missing.stderr

    # The Hub unreachable but the snapshot cached: that serves, saying so.
    unreachable = generate("testorg/tiny", {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert unreachable.returncode == 0 and unreachable.stdout == local.stdout, unreachable.stderr
    assert "using the cached" in unreachable.stderr


def test_gated_unknown_and_gguf_repositories(hub, tmp_path):
    online = {"HF_ENDPOINT": hub["endpoint"], "HF_HUB_CACHE": str(tmp_path / "cache")}
    gated = generate("testorg/gated", online)
    assert gated.returncode != 0 and "HF_TOKEN" in gated.stderr, gated.stderr
    with_token = generate("testorg/gated", {**online, "HF_TOKEN": TOKEN})
    assert with_token.returncode == 0, with_token.stderr
    wrong_token = generate("testorg/gated", {**online, "HF_TOKEN": "hf_wrong"})
    assert wrong_token.returncode != 0 and "refused" in wrong_token.stderr, wrong_token.stderr

    unknown = generate("testorg/nothing-here", online)
    assert unknown.returncode != 0 and "404" in unknown.stderr, unknown.stderr

    no_config = generate("testorg/tiny-gguf", online)
    assert no_config.returncode != 0, no_config.stderr
    assert "testorg/tiny-gguf/tiny-Q4_1.gguf" in no_config.stderr, no_config.stderr
    one_file = generate("testorg/tiny-gguf/tiny-Q4_1.gguf", online)
    local = generate(hub["gguf"], {})
    assert one_file.returncode == 0 and one_file.stdout == local.stdout, one_file.stderr
    missing_file = generate("testorg/tiny-gguf/other.gguf", online)
    assert missing_file.returncode != 0 and "no file other.gguf" in missing_file.stderr


def test_a_name_that_is_neither_a_path_nor_a_hub_id_is_refused(tmp_path):
    result = generate(tmp_path / "missing.gguf", {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)})
    assert result.returncode != 0 and "missing.gguf" in result.stderr
    # A mistyped relative path is a missing file, not a Hub repository (nothing is asked of
    # the endpoint, which here cannot answer).
    (tmp_path / "models").mkdir()
    for name in ("models/typo.gguf", "models/sub/typo.gguf", "elsewhere/typo.gguf"):
        env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "cache")}
        result = subprocess.run([str(LOOM_BIN), "generate", "--model", name, "--prompt", "x"],
                                capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                env={**{k: v for k, v in os.environ.items() if not k.startswith("HF_")}, **env})
        assert result.returncode != 0 and "typo.gguf" in result.stderr, (name, result.stderr)
        assert "cannot reach" not in result.stderr, (name, result.stderr)


def test_loom_up_serves_a_hub_id_downloaded_once(hub, tmp_path, monkeypatch):
    """`loom up --model testorg/tiny -tp 2`: the coordinator and both ranks resolve the id (one
    download, the others wait on the repository's lock and find the files) and serve the
    directory's greedy text."""
    sys.path.insert(0, str(TESTS / "cluster"))
    import cluster_harness as h

    monkeypatch.setenv("HF_ENDPOINT", hub["endpoint"])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    hub["server"].downloads.clear()
    up = h.Up(tmp_path, model="testorg/tiny", tensor_parallel=2, threads=1,
              kv_cache_memory="16MiB", http_port=-1)
    try:
        up.wait_healthy(["replica-0"])
        outcome = h.generate_all(up.stub, [h.make_request(prompt=PROMPT, max_tokens=8)])[0]
        assert outcome.finished, outcome.describe()
        reference = h.loom_generate(PROMPT, 8, model=hub["directory"], threads=1)
        assert outcome.text == reference.text
    finally:
        up.stop()
    assert hub["server"].downloads.count("model.safetensors") == 1, hub["server"].downloads
