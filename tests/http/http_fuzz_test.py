"""A bounded fuzz run of the HTTP API: random and malformed bodies, oversized bodies, invalid UTF-8,
huge numbers and wrong types for every parameter. Every answer must be a 4xx with an OpenAI error
body (never a 5xx, a hang or a dropped connection), and afterwards the server still serves and
every KV block is free. The seed is fixed (LOOM_HTTP_FUZZ_SEED overrides it), so a failure
reproduces; LOOM_HTTP_FUZZ_CASES sets the number of cases (default 400).
"""
import json
import os
import pathlib
import random
import sys

import pytest

try:  # the HTTP client the installed openai package is built on
    import httpx2 as httpx
except ImportError:
    import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

SEED = int(os.environ.get("LOOM_HTTP_FUZZ_SEED", "20261123"))
CASES = int(os.environ.get("LOOM_HTTP_FUZZ_CASES", "400"))

HUGE = [1e308 * 10, -1e308 * 10, 10**30, -(10**30), 2**64, 1.5e19]
WRONG_TYPE = ["ten", [], {}, [[[]]], {"x": [1, 2]}]
# Per parameter, values it must refuse: out of range, huge, or of the wrong type.
INVALID = {
    "model": [5, [], {}, True, "gpt-4", "no-such-model"],
    "max_tokens": HUGE + WRONG_TYPE + [0, -1, 0.5, True],
    "max_completion_tokens": HUGE + WRONG_TYPE + [0, -1, 2.5],
    "temperature": HUGE + WRONG_TYPE + [-0.5, -1],
    "top_p": HUGE + WRONG_TYPE + [0, -0.1, 1.01],
    "top_k": HUGE + WRONG_TYPE + [-2, 0.5],
    "min_p": HUGE + WRONG_TYPE + [-0.1, 1.5],
    "presence_penalty": HUGE + WRONG_TYPE + [2.5, -3],
    "frequency_penalty": HUGE + WRONG_TYPE + [2.5, -3],
    "repetition_penalty": HUGE + WRONG_TYPE + [0, -1],
    "seed": [1e308 * 10, 10**30, 2**64, "ten", [], {}, 0.5],
    "stop": [5, {}, [1, 2], ["a" * 9000], ["a" * 4096, "b" * 4097], [["a"]]],
    "stop_token_ids": [5, "x", [-1], [10**12], [[1]], ["a"]],
    "n": HUGE + WRONG_TYPE + [0, -1, 129, 1.5],
    "logprobs": HUGE + WRONG_TYPE + [-1, 21],
    "ignore_eos": [5, "yes", [], {}],
    "stream": [5, "yes", [], {}],
    "stream_options": [5, "x", [1]],
    "user": [5, [], {}],
    "priority": HUGE + WRONG_TYPE,
    "cache_salt": [5, [], {}],
}
CHAT_INVALID = {
    "messages": [5, "hello", [], [5], [{"content": "no role"}], [{"role": "user", "content": 5}],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]],
    "logprobs": [5, "yes", [], {}],
    "top_logprobs": HUGE + WRONG_TYPE + [-1, 21, 3],  # 3 without logprobs: true
}
COMPLETION_INVALID = {
    "prompt": [5, None, [], {}, [1.5], [-1], [10**12], [["a"]], [{"x": 1}], True],
    "echo": [5, "yes", [], {}],
}


def random_text(rng, n):
    alphabet = "abcdefghijklmnopqrstuvwxyz {}[]\":,\\\n\t\u00e9\u4e2d\U0001f600"
    return "".join(rng.choice(alphabet) for _ in range(n))


def valid_body(rng, chat):
    body = {"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": rng.randint(1, 4), "temperature": 0}
    if chat:
        body["messages"] = [{"role": "user", "content": random_text(rng, rng.randint(1, 20))}]
    else:
        body["prompt"] = random_text(rng, rng.randint(1, 20))
    return body


def make_case(rng):
    """(path, body bytes, content type, description) of one case that must be answered 4xx."""
    chat = rng.random() < 0.4
    path = "/v1/chat/completions" if chat else "/v1/completions"
    kind = rng.choice(["param", "param", "param", "garbage", "truncated", "utf8", "nesting", "shape"])
    body = valid_body(rng, chat)
    if kind == "param":
        table = dict(INVALID, **(CHAT_INVALID if chat else COMPLETION_INVALID))
        name = rng.choice(sorted(table))
        value = rng.choice(table[name])
        body[name] = value
        if name == "stream_options":
            body["stream"] = True
        data = json.dumps(body).encode()
        return path, data, "application/json", f"{name}={value!r}"
    if kind == "garbage":
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
        return path, data, "application/json", "random bytes"
    if kind == "truncated":
        data = json.dumps(body).encode()
        return path, data[:rng.randint(0, len(data) - 1)], "application/json", "truncated JSON"
    if kind == "utf8":
        data = json.dumps(body).encode()
        at = data.index(b'"', data.index(b'"content"' if chat else b'"prompt"') + 10) - 1
        data = data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80"]) + data[at:]
        return path, data, "application/json", "invalid UTF-8"
    if kind == "nesting":
        depth = rng.randint(1000, 20000)
        return path, b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}", "application/json", "deep nesting"
    return path, json.dumps(rng.choice([[body], "body", 5, None])).encode(), \
        rng.choice(["application/json", "text/plain", "application/xml"]), "not an object"


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with h.running_cluster(h.cluster_log_dir(tmp_path_factory, "http_fuzz"), {"r0": {"threads": 1}}) as rig:
        yield rig


def test_every_malformed_request_is_a_4xx_and_the_server_stays_healthy(rig):
    rng = random.Random(SEED)
    url = rig.coordinator.http_url
    failures = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(CASES):
            path, data, content_type, what = make_case(rng)
            try:
                response = client.post(path, content=data, headers={"Content-Type": content_type})
            except httpx.HTTPError as error:
                failures.append(f"case {i} ({what}): {type(error).__name__}: {error}")
                continue
            ok = 400 <= response.status_code < 500
            try:
                ok = ok and bool(response.json()["error"]["message"])
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                failures.append(f"case {i} ({what}): {response.status_code} {response.text[:200]!r}")
        # Oversized: past the 32 MiB body limit.
        response = client.post("/v1/completions", content=b"x" * (33 << 20),
                               headers={"Content-Type": "application/json"})
        if response.status_code != 413:
            failures.append(f"oversized body: {response.status_code}")
        assert client.get("/health").status_code == 200
        # Still serving.
        response = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
        assert response.status_code == 200, response.text
    assert not failures, "\n".join(failures[:30])
    rig.coordinator.wait_idle(timeout=15)
