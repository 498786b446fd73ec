"""The OpenAI-compatible HTTP API against real processes, through the official `openai` client.

One `loom serve` with one worker (greedy references from the gRPC API of the same cluster), plus
small clusters for the 429 (a zero-length waiting queue) and 503 (no worker) cases.

* Completions and chat, streaming and not; streamed text equals the non-streamed text; greedy
  HTTP text equals gRPC Generate's; `n` samples, seeds reproduce; stop strings; logprobs; echo;
  include_usage; token-id prompts and prompt lists.
* Every error case answers the status the issue names with an OpenAI error body, the client
  raises the matching exception class, and 4xx answers trigger no retry.
* A client that disconnects (streaming or not) cancels its request: every KV block is free again.
* /health, /ready, /version, /v1/models.
"""
import pathlib
import sys

import openai
import pytest

try:  # the HTTP client the installed openai package is built on (openai >= 3 uses httpx2)
    import httpx2 as httpx
except ImportError:
    import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402
from cluster_harness import make_request  # noqa: E402

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


class RequestCounter:
    """Counts the HTTP requests the openai client sends (retries included)."""

    def __init__(self):
        self.count = 0

    def __call__(self, request):
        self.count += 1


def client_for(rig, max_retries=0, counter=None, timeout=120.0):
    hooks = {"request": [counter]} if counter is not None else {}
    return openai.OpenAI(base_url=rig.coordinator.http_url + "/v1", api_key="unused",
                         max_retries=max_retries, timeout=timeout,
                         http_client=httpx.Client(event_hooks=hooks, timeout=timeout))


@pytest.fixture(scope="module")
def client(rig):
    return client_for(rig)


def grpc_greedy(rig, text, max_tokens):
    outcome = h.generate_all(rig.coordinator.stub, [make_request(prompt=text, max_tokens=max_tokens)])[0]
    assert outcome.finished, outcome.describe()
    return outcome.text


def test_models_lists_the_served_model(client, rig):
    models = client.models.list().data
    assert len(models) == 1
    assert models[0].id == "SmolLM2-135M-Instruct.Q4_1"
    assert models[0].owned_by == "loom"
    # GET /v1/models/{id}: the client's retrieve (ids may hold '/': the rest of the path).
    assert client.models.retrieve(models[0].id).model_dump() == models[0].model_dump()
    for missing in ("gpt-4", "org/other-model"):
        with pytest.raises(openai.NotFoundError) as error:
            client.models.retrieve(missing)
        assert missing in error.value.body["message"]


def test_completion_greedy_equals_grpc_and_reports_usage(client, model, rig):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    choice = completion.choices[0]
    assert choice.text == grpc_greedy(rig, PROMPT, 12)
    assert choice.finish_reason == "length"
    assert completion.object == "text_completion"
    assert completion.usage.completion_tokens == 12
    assert completion.usage.prompt_tokens == len(
        rig.coordinator.stub.Tokenize(h.stubs().pb.TokenizeRequest(text=PROMPT, add_special_tokens=True,
                                                                    parse_special=True)).token_ids)
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 12


def test_streamed_completion_equals_the_whole_one(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0,
                                            stream=True))
    assert len(chunks) > 1
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_streaming_and_not_agree_and_usage_chunk_comes_last(client, model):
    whole = client.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0)
    message = whole.choices[0].message
    assert message.role == "assistant"
    assert "Paris" in message.content
    assert whole.object == "chat.completion"
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == message.content
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(client, model):
    """vLLM's stream_options.continuous_usage_stats: each chunk's usage counts the tokens sent
    so far (a chunk may carry several), the last equals the whole answer's; without
    include_usage it changes nothing."""
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                            stream=True, stream_options=options))
    assert all(c.usage is not None for c in chunks)
    assert {c.usage.prompt_tokens for c in chunks} == {whole.usage.prompt_tokens}
    counts = [c.usage.completion_tokens for c in chunks[:-1]]
    assert counts[0] >= 1 and counts == sorted(counts) and len(set(counts)) > 2, counts
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == counts[-1]
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
               for c in chunks)
    chat = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0,
                                               stream=True, stream_options=options))
    assert all(c.usage is not None for c in chat)
    assert chat[-1].usage.completion_tokens == 8
    plain = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0,
                                           stream=True,
                                           stream_options={"continuous_usage_stats": True}))
    assert all(c.usage is None for c in plain)


def test_n_samples_with_a_seed_reproduce_and_differ(client, model):
    def run():
        completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                               temperature=1.0, n=3, seed=1234)
        assert [c.index for c in completion.choices] == [0, 1, 2]
        assert completion.usage.completion_tokens <= 3 * 16
        return [c.text for c in completion.choices]

    first, second = run(), run()
    assert first == second
    assert len(set(first)) > 1, first


def test_unseeded_sampling_varies(client, model):
    texts = {client.completions.create(model=model, prompt="Once upon a time", max_tokens=12,
                                       temperature=1.0).choices[0].text for _ in range(3)}
    assert len(texts) > 1


def test_stop_string_ends_the_text_before_it(client, model):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=20, temperature=0,
                                           stop=["."])
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == " Paris"


def test_completion_logprobs(client, model):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0,
                                           logprobs=3)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == 5
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    for token, lp, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert len(top) == 3
        # Greedy: the chosen token is the most likely one.
        assert max(top.values()) == pytest.approx(lp, abs=1e-5)
        assert top[token] == pytest.approx(lp, abs=1e-5)
    assert logprobs.text_offset[0] == 0


def test_chat_logprobs(client, model):
    completion = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, temperature=0,
                                                logprobs=True, top_logprobs=2)
    content = completion.choices[0].logprobs.content
    assert len(content) == completion.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(client, model, rig):
    """vLLM's return_tokens_as_token_ids: every token of a logprobs object (chosen, top
    alternatives, echoed prompt; chat's bytes too) reads "token_id:<id>", the ids detokenize to
    the text, and the logprobs and text offsets are those of the plain request."""
    args = dict(model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    plain = client.completions.create(**args).choices[0]
    named = client.completions.create(**args, extra_body={"return_tokens_as_token_ids": True}).choices[0]
    assert named.text == plain.text
    tokens = named.logprobs.tokens
    assert all(t.startswith("token_id:") for t in tokens), tokens
    ids = [int(t.split(":")[1]) for t in tokens]
    detokenized = httpx.post(rig.coordinator.http_url + "/detokenize", json={"model": model, "tokens": ids},
                             timeout=30).json()["prompt"]
    assert detokenized == plain.text
    assert named.logprobs.token_logprobs == plain.logprobs.token_logprobs
    assert named.logprobs.text_offset == plain.logprobs.text_offset
    for token, lp, top in zip(tokens, named.logprobs.token_logprobs, named.logprobs.top_logprobs):
        assert all(key.startswith("token_id:") for key in top)
        assert top[token] == pytest.approx(lp, abs=1e-5)
    echoed = client.completions.create(**args, echo=True,
                                       extra_body={"return_tokens_as_token_ids": True}).choices[0]
    assert all(t.startswith("token_id:") for t in echoed.logprobs.tokens)
    assert echoed.logprobs.tokens[-5:] == tokens
    chat = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=2,
                                          extra_body={"return_tokens_as_token_ids": True})
    for entry in chat.choices[0].logprobs.content:
        assert entry.token.startswith("token_id:")
        assert bytes(entry.bytes).decode() == entry.token
        assert all(alt.token.startswith("token_id:") for alt in entry.top_logprobs)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**args, extra_body={"return_tokens_as_token_ids": "yes"})
    assert "return_tokens_as_token_ids" in str(refused.value)


def test_request_ids_come_from_the_client_or_are_made_and_are_answered(client, model, rig):
    """X-Request-Id (else vLLM's body field request_id) names the request: the response's id is
    "cmpl-" / "chatcmpl-" and it, and the header answers it; without one the server makes
    one and answers it the same way (an empty one counts as none). An id that cannot go into a
    header is refused."""
    raw = client.completions.with_raw_response.create(
        model=model, prompt=PROMPT, max_tokens=2, temperature=0,
        extra_headers={"X-Request-Id": "trace-1234"})
    assert raw.headers["x-request-id"] == "trace-1234"
    assert raw.parse().id == "cmpl-trace-1234"
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=CHAT, max_tokens=2, temperature=0, extra_body={"request_id": "mine-7"})
    assert raw.headers["x-request-id"] == "mine-7"
    assert raw.parse().id == "chatcmpl-mine-7"
    made = client.completions.with_raw_response.create(model=model, prompt=PROMPT, max_tokens=2)
    assert made.parse().id == "cmpl-" + made.headers["x-request-id"]
    other = client.completions.with_raw_response.create(model=model, prompt=PROMPT, max_tokens=2)
    assert other.headers["x-request-id"] != made.headers["x-request-id"]
    with client.completions.with_streaming_response.create(
            model=model, prompt=PROMPT, max_tokens=3, stream=True,
            extra_headers={"X-Request-Id": "streamed-9"}) as streamed:
        assert streamed.headers["x-request-id"] == "streamed-9"
        assert {chunk.id for chunk in streamed.parse()} == {"cmpl-streamed-9"}
    for extra in ({"extra_body": {"request_id": "has space"}}, {"extra_body": {"request_id": 7}},
                  {"extra_headers": {"X-Request-Id": "x" * 257}}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=model, prompt=PROMPT, max_tokens=2, **extra)
        assert "request" in str(refused.value).lower(), extra
    rig.coordinator.wait_idle(timeout=15)


def test_echo_token_ids_and_prompt_lists(client, model, rig):
    echoed = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    ids = list(rig.coordinator.stub.Tokenize(h.stubs().pb.TokenizeRequest(
        text=PROMPT, add_special_tokens=True, parse_special=True)).token_ids)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == plain.choices[0].text
    both = client.completions.create(model=model, prompt=[PROMPT, "Hello"], max_tokens=4, temperature=0)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].text == plain.choices[0].text


BAD_REQUESTS = [
    ("temperature", dict(temperature=-0.5)),
    ("top_p", dict(top_p=0)),
    ("top_p", dict(top_p=1.5)),
    ("top_p", dict(top_p=1e-300)),  # above 0, but 0 as the float the engine holds
    ("max_tokens", dict(max_tokens=0)),
    ("stop", dict(stop=["a" * 5000, "b" * 5000])),  # 10,000 bytes > 8,192
    ("n", dict(n=0)),
    ("n", dict(n=100000)),
    # A list of strings or of token lists, not both (OpenAI's and vLLM's shapes).
    ("prompt", dict(prompt=["Hello", [1, 2]])),
    ("prompt", dict(prompt=[[1, 2], "Hello"])),
]


@pytest.mark.parametrize("param,kwargs", BAD_REQUESTS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(BAD_REQUESTS)])
def test_invalid_parameters_are_400_without_retries(rig, model, param, kwargs):
    counter = RequestCounter()
    client = client_for(rig, max_retries=3, counter=counter)
    args = dict(model=model, prompt=PROMPT, max_tokens=4)
    args.update(kwargs)
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**args)
    assert error.value.status_code == 400
    body = error.value.body
    assert body["param"] == param, body
    assert body["type"] == "invalid_request_error"
    assert counter.count == 1


def test_prompt_plus_max_tokens_beyond_the_context_names_the_numbers(client, model):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=8190)
    message = error.value.body["message"]
    assert "8190" in message and "8192" in message, message


def test_image_parts_are_400_naming_their_type(client, model):
    """Loom serves text (a multimodal checkpoint as its text model): an image part is refused
    by its type, a text part without text as such."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}])
    assert error.value.body["param"] == "messages"
    assert "'image_url'" in error.value.body["message"], error.value.body
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text"}]}])
    assert "'text' string" in error.value.body["message"], error.value.body


def test_unknown_model_is_404(rig):
    counter = RequestCounter()
    client = client_for(rig, max_retries=3, counter=counter)
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="gpt-4", messages=CHAT, max_tokens=4)
    assert "gpt-4" in error.value.body["message"]
    assert counter.count == 1


@pytest.mark.parametrize("body,content_type", [
    (b"{not json", "application/json"),
    (b'{"prompt": "x"', "application/json"),
    (b"[1, 2]", "application/json"),
    (b'{"prompt": "\xff\xfe"}', "application/json"),
    (b'{"prompt": "x", "max_tokens": 1e400}', "application/json"),
    (b'{"prompt": "x", "max_tokens": 99999999999999999999999}', "application/json"),
    (b'{"prompt": "x", "max_tokens": "ten"}', "application/json"),
    (b'{"prompt": 5}', "application/json"),
    (b'{"prompt": "x"}', "text/plain"),
    (b"prompt=x", "application/x-www-form-urlencoded"),
])
def test_malformed_bodies_are_400_with_a_json_error(rig, body, content_type):
    response = httpx.post(rig.coordinator.http_url + "/v1/completions", content=body,
                          headers={"Content-Type": content_type}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"


def test_unknown_route_and_method_get_json_errors(rig):
    response = httpx.get(rig.coordinator.http_url + "/v1/nothing", timeout=30)
    assert response.status_code == 404
    assert "error" in response.json()
    response = httpx.post(rig.coordinator.http_url + "/v1/completions",
                          content=b"{" + b" " * (40 << 20) + b"}",
                          headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == 413
    assert "error" in response.json()


def test_unknown_fields_are_ignored(client, model):
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0,
                                           extra_body={"best_of_nonsense": 3, "guided": {"x": 1}})
    assert completion.choices[0].finish_reason == "length"


def test_health_ready_version(rig):
    url = rig.coordinator.http_url
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.get(url + "/ready", timeout=10).status_code == 200
    version = httpx.get(url + "/version", timeout=10).json()
    assert version["version"] and version["model"] == "SmolLM2-135M-Instruct.Q4_1"


def test_head_answers_the_get_routes_without_a_body(rig):
    # One kept-alive connection: a HEAD answer that sent its body (or its length wrong) would
    # corrupt the next answer on it.
    with httpx.Client(base_url=rig.coordinator.http_url, timeout=10) as client:
        for path in ("/health", "/v1/models", "/version", "/metrics"):
            get = client.get(path)
            head = client.head(path)
            assert head.status_code == get.status_code == 200, path
            assert head.content == b"", path
            assert head.headers["content-type"] == get.headers["content-type"], path
            if path != "/metrics":  # the metrics change between the two calls
                assert int(head.headers["content-length"]) == len(get.content), path
        # Still 404 and 405 (with only their heads) where GET would be.
        assert client.head("/v1/nothing").status_code == 404
        assert client.head("/v1/completions").status_code == 405
        assert client.get("/health").status_code == 200


def test_stream_disconnect_cancels_and_frees_blocks(rig, model):
    client = client_for(rig)
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=2000, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    received = 0
    for _ in stream:
        received += 1
        if received == 3:
            break
    # Observed while the stream is open (2000 tokens cannot end meanwhile): after close() the
    # cancellation may already have freed everything before a first poll could look.
    assert rig.coordinator.wait_replicas(lambda r: r["r0"].num_running == 1, 10, "the request runs")
    stream.close()
    rig.coordinator.wait_idle(timeout=15)


def test_non_streaming_disconnect_cancels_and_frees_blocks(rig, model):
    client = client_for(rig, timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model=model, prompt=PROMPT, max_tokens=2000, temperature=0,
                                  extra_body={"ignore_eos": True})
    rig.coordinator.wait_idle(timeout=15)


def test_full_queue_is_429_with_retry_after(tmp_path):
    with h.running_cluster(tmp_path, {"r0": {"threads": 1}}, max_waiting=0) as rig:
        counter = RequestCounter()
        client = client_for(rig, max_retries=0, counter=counter)
        with pytest.raises(openai.RateLimitError) as error:
            client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=PROMPT, max_tokens=4)
        assert error.value.response.headers["Retry-After"] == "1"
        assert error.value.body["code"] == "queue_full"
        assert counter.count == 1


# A batch with more parts than the queues take even when empty can never be served: a 400
# (no retry), refused before any part is queued, so another client meanwhile gets no 429.
# A loop of such requests used to hold the queue and turn 19 of 20 of others' into 429s.
def test_a_batch_the_queues_cannot_take_is_400_and_blocks_no_one(tmp_path):
    with h.running_cluster(tmp_path, {"r0": {"threads": 1}}, max_waiting=4) as rig:
        model = "SmolLM2-135M-Instruct.Q4_1"
        url = rig.coordinator.http_url
        for path, body in [("/v1/completions", {"prompt": ["a"] * 5, "max_tokens": 1}),
                           ("/v1/completions", {"prompt": "a", "n": 6, "max_tokens": 1}),
                           ("/v1/embeddings", {"input": ["a"] * 5})]:
            response = httpx.post(url + path, json={"model": model, **body}, timeout=30)
            assert response.status_code == 400, (path, body, response.text)
            message = response.json()["error"]["message"]
            assert "exceed the 4 requests the server queues at once" in message, message
            other = httpx.post(url + "/v1/completions",
                               json={"model": model, "prompt": "Hi", "max_tokens": 1}, timeout=30)
            assert other.status_code == 200, other.text
        fits = httpx.post(url + "/v1/embeddings", json={"model": model, "input": ["a"] * 4},
                          timeout=60)
        assert fits.status_code == 200, fits.text
        assert len(fits.json()["data"]) == 4
        # 3 prompts x 2 samples: 3 first samples at once, each prompt's second once it has
        # output; it fits.
        both = httpx.post(url + "/v1/completions",
                          json={"model": model, "prompt": ["a"] * 3, "n": 2, "max_tokens": 1}, timeout=60)
        assert both.status_code == 200, both.text


def test_no_replica_is_503_and_health_says_so(tmp_path):
    coordinator = h.Coordinator(tmp_path)
    try:
        assert httpx.get(coordinator.http_url + "/health", timeout=10).status_code == 503
        assert httpx.get(coordinator.http_url + "/ready", timeout=10).status_code == 503
        client = openai.OpenAI(base_url=coordinator.http_url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as error:
            client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=PROMPT, max_tokens=4)
        assert error.value.status_code == 503
    finally:
        coordinator.stop()


def test_usage_reports_cached_prompt_tokens(client, model):
    prompt = "Loom caches the key and value blocks of prompts it has seen before, " * 4
    first = client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0)
    second = client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= 32
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert first.choices[0].text == second.choices[0].text


def test_n_samples_share_the_prompt_blocks(client, model, rig):
    # A prompt of ~200 tokens and n = 4: the first sample computes it, the others reuse its
    # cached blocks, so the replica computes far less than 4 prompts.
    prompt = " ".join(f"item{i}" for i in range(100))
    computed_before = rig.coordinator.replicas()["r0"].num_tokens_computed
    completion = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=1.0,
                                           n=4, seed=5)
    computed = rig.coordinator.replicas()["r0"].num_tokens_computed - computed_before
    prompt_tokens = completion.usage.prompt_tokens
    assert len(completion.choices) == 4
    assert prompt_tokens > 150
    assert computed < 2 * prompt_tokens, (computed, prompt_tokens)
    assert computed >= prompt_tokens
