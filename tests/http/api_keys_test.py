"""API keys and TLS against a real `loom up` (the no-op backend: only control flow matters).

* HTTP through the official `openai` client: the right key (either of two, one from
  --api-key-file) works, a wrong or missing key raises openai.AuthenticationError (401 with an
  OpenAI error body); /health, /ready and /metrics answer without a key.
* The HTTP port speaks TLS with a self-signed certificate made here (`openssl req -x509`): the
  openai client trusts it as its CA; plain HTTP to that port gets no answer.
* The gRPC Inference service through both SDKs (Python LoomClient, C++ loom::client via
  tests/client/client_tool): UNAUTHENTICATED without a key or with a wrong one, OK with the
  right one. The workers registered without a client key (they present the cluster secret
  `loom up` made: tests/cluster/cluster_secret_test.py), and grpc.health.v1 answers
  without one.
* No key (right or wrong) appears in the processes' logs.
* LOOM_API_KEY alone turns keys on.
"""
import json
import pathlib
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import openai
import pytest

try:  # the HTTP client the installed openai package is built on
    import httpx2 as httpx
except ImportError:
    import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

KEY = "sk-loom-test-7f3a9c2e5b8d41f6"
FILE_KEY = "sk-loom-file-1e6b0d94c7a25f83"
WRONG_KEY = "sk-loom-wrong-4c1d8e7f2a9b3065"
ENV_KEY = "sk-loom-env-9d2c6a1f0e7b4835"
CLIENT_TOOL = h.BUILD_DIR / "tests" / "client" / "client_tool"


def make_certificate(directory: pathlib.Path):
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    directory = h.cluster_log_dir(tmp_path_factory, "api_keys")
    cert, key = make_certificate(directory)
    key_file = directory / "keys.txt"
    key_file.write_text(f"# test keys\n{FILE_KEY}\n")
    up = h.Up(directory, step_backend="noop", threads=1, kv_cache_memory="64MiB", api_key=KEY,
              api_key_file=key_file, ssl_certfile=cert, ssl_keyfile=key)
    try:
        up.wait_for_line(r"loom: ready \(1 replicas\)", h.REGISTER_TIMEOUT_S)
        up.cert = cert
        yield up
    finally:
        up.stop()


def openai_client(rig, api_key, sent=None):
    """The openai client over HTTPS trusting the test's CA. api_key None: the request goes
    out with no Authorization header at all (the client refuses to run without a key, so a
    hook removes it). `sent` collects each request's Authorization header as sent."""
    def hook(request):
        if api_key is None:
            request.headers.pop("authorization", None)
        if sent is not None:
            sent.append(request.headers.get("authorization"))
    return openai.OpenAI(base_url=rig.http_url + "/v1", api_key=api_key or "unused", max_retries=0,
                         timeout=60,
                         http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(rig.cert)),
                                                  timeout=60, event_hooks={"request": [hook]}))


def get(rig, path, key=None):
    """(status, body) of GET `path` over HTTPS trusting the test's CA."""
    context = ssl.create_default_context(cafile=str(rig.cert))
    request = urllib.request.Request(rig.http_url + path)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_http_url_is_https(rig):
    assert rig.http_url.startswith("https://127.0.0.1:"), rig.http_url


@pytest.mark.parametrize("key", [KEY, FILE_KEY], ids=["flag_key", "file_key"])
def test_right_key_works_over_tls(rig, key):
    client = openai_client(rig, key)
    model = client.models.list().data[0].id
    completion = client.completions.create(model=model, prompt="Hello", max_tokens=4)
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage.completion_tokens >= 1
    chat = client.chat.completions.create(model=model, max_tokens=4,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message is not None


@pytest.mark.parametrize("key", [WRONG_KEY, None, KEY + "x", KEY[:-1]],
                         ids=["wrong", "missing", "longer", "prefix"])
def test_wrong_or_missing_key_is_an_authentication_error(rig, key):
    sent = []
    client = openai_client(rig, key, sent)
    with pytest.raises(openai.AuthenticationError) as raised:
        client.completions.create(model="", prompt="Hello", max_tokens=4)
    assert raised.value.status_code == 401
    body = raised.value.body
    assert body["type"] == "authentication_error", body
    assert "API key" in body["message"]
    with pytest.raises(openai.AuthenticationError):
        client.models.list()  # the same kept-alive connection still answers correctly
    assert sent == [None if key is None else f"Bearer {key}"] * 2
    status, text = get(rig, "/v1/models")  # no Authorization header at all
    assert status == 401
    assert json.loads(text)["error"]["code"] == "invalid_api_key"


def test_probes_and_metrics_are_open(rig):
    for path in ("/health", "/ready", "/live", "/metrics"):
        status, body = get(rig, path)
        assert status == 200, (path, status, body)
    assert "loom_" in get(rig, "/metrics")[1]
    # Everything else needs a key, /version and /tokenize included.
    assert get(rig, "/version")[0] == 401
    assert get(rig, "/version", KEY)[0] == 200


def test_plain_http_to_the_tls_port_gets_no_answer(rig):
    plain = rig.http_url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain + "/health", timeout=10).read()


def test_python_sdk_needs_the_key(rig):
    from loom_client import LoomClient, LoomError
    for key in (None, WRONG_KEY):
        with LoomClient(rig.address, api_key=key or "", timeout=30) as client:
            with pytest.raises(LoomError) as raised:
                client.list_models()
            assert raised.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(LoomError) as raised:
                client.generate("Hello", max_tokens=4)
            assert raised.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert raised.value.attempts == 1  # not retried
    with LoomClient(rig.address, api_key=KEY, timeout=30) as client:
        assert len(client.list_models()) == 1
        assert client.tokenize("Hello")
        completion = client.generate("Hello", max_tokens=4)
        assert completion.finish_reason is not None
        assert len(client.cluster_state().replicas) == 1


def run_client_tool(rig, *args):
    done = subprocess.run([str(CLIENT_TOOL), "info", "--address", rig.address, "--text", "Hello",
                           "--max-attempts", "1", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cpp_sdk_needs_the_key(rig):
    missing = h.require_binaries(CLIENT_TOOL)
    if missing:
        pytest.fail(missing)
    for args in ((), ("--api-key", WRONG_KEY)):
        info = run_client_tool(rig, *args)
        for call in ("tokenize", "list_models", "cluster_state"):
            assert info[call]["code"] == "UNAUTHENTICATED", info
    info = run_client_tool(rig, "--api-key", KEY)
    for call in ("tokenize", "detokenize", "list_models", "cluster_state"):
        assert info[call]["code"] == "OK", info
    done = subprocess.run([str(CLIENT_TOOL), "generate", "--address", rig.address, "--prompt", "Hello",
                           "--max-tokens", "4", "--api-key", KEY], capture_output=True, text=True,
                          timeout=60)
    assert json.loads(done.stdout)["code"] == "OK", done.stdout


def test_internal_services_stay_open(rig):
    # The worker registered (and heartbeats) without a key; gRPC health answers too.
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(rig.address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_no_key_is_logged(rig):
    # Every request above has been answered; whatever the processes wrote is in the log.
    text = rig.log_path.read_text(errors="replace") + "\n".join(rig.stdout_lines())
    assert "API keys required (2 configured)" in text
    for key in (KEY, FILE_KEY, WRONG_KEY):
        assert key not in text, f"a key appears in the log of {rig.args}"


def test_environment_key_alone_turns_keys_on(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_API_KEY", ENV_KEY)
    up = h.Up(tmp_path, step_backend="noop", threads=1, kv_cache_memory="64MiB")
    try:
        up.wait_for_line(r"loom: ready \(1 replicas\)", h.REGISTER_TIMEOUT_S)
        assert up.http_url.startswith("http://")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=up.http_url + "/v1", api_key=WRONG_KEY, max_retries=0).models.list()
        models = openai.OpenAI(base_url=up.http_url + "/v1", api_key=ENV_KEY, max_retries=0).models.list()
        assert len(models.data) == 1
        from loom_client import LoomClient
        monkeypatch.delenv("LOOM_API_KEY")
        with LoomClient(up.address, api_key=ENV_KEY, timeout=30) as client:
            assert len(client.list_models()) == 1
    finally:
        up.stop()
    assert ENV_KEY not in up.log_path.read_text(errors="replace")
