"""The Python SDK (client/python, `loom_client`) against real processes: a coordinator
(`loom serve`) and one CPU worker on loopback.

* generate and generate_stream: greedy text equals `loom generate`'s; chunks join to the
  blocking result; usage and logprobs are filled in.
* Closing a stream mid-generation and a deadline that expires both free every KV block.
* UNAVAILABLE is retried before the first token (a client that starts before any worker
  registered succeeds once one does) and never after (a coordinator killed mid-stream).
* tokenize/detokenize round trip, list_models, cluster_state; client errors are not retried.
* embed: the vectors of POST /v1/embeddings bit for bit (text and token ids); bad inputs
  are INVALID_ARGUMENT with nothing placed; an expired deadline frees every block.
"""
import base64
import math
import threading
import time

import grpc
import numpy as np
import openai
import pytest

from client_test_util import LONG_RUN_TOKENS, PROMPT, blocks_in_use, h, require_cluster_binaries
from loom_client import LoomClient, LoomError, RetryPolicy


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    require_cluster_binaries()
    with h.running_cluster(tmp_path_factory.mktemp("python_client"), {"r0": {"threads": 1}}) as rig:
        yield rig


@pytest.fixture(scope="module")
def client(rig):
    with LoomClient(rig.coordinator.address, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def reference():
    return h.loom_generate(PROMPT, 16, threads=1).text


def test_generate_greedy_equals_loom_generate(client, reference):
    completion = client.generate(PROMPT, max_tokens=16)
    assert completion.text == reference
    assert completion.finish_reason in ("stop", "length")
    assert completion.completion_tokens == len(completion.token_ids) > 0
    assert completion.prompt_tokens == len(h.tokenize(PROMPT))
    assert completion.replica_id == "r0"
    assert completion.attempts == 1


def test_stream_chunks_join_to_the_same_completion(client, reference):
    with client.generate_stream(PROMPT, max_tokens=16) as stream:
        chunks = list(stream)
    assert len(chunks) >= 2
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason in ("stop", "length")
    assert "".join(c.text for c in chunks) == reference
    assert chunks[-1].completion_tokens == sum(len(c.token_ids) for c in chunks)


def test_token_id_prompt_and_logprobs(client):
    ids = client.tokenize(PROMPT)
    by_text = client.generate(PROMPT, max_tokens=8)
    completion = client.generate(ids, max_tokens=8, logprobs=2)
    assert completion.token_ids == by_text.token_ids
    assert len(completion.logprobs) == len(completion.token_ids)
    for token_id, logprob in zip(completion.token_ids, completion.logprobs):
        assert logprob.token_id == token_id
        assert logprob.logprob <= 0
        assert len(logprob.top) == 2
        assert logprob.top[0][0] == token_id  # greedy picks the most likely token


def test_closing_a_stream_mid_generation_frees_its_kv_blocks(rig, client):
    coordinator = rig.coordinator
    stream = client.generate_stream(h.LONG_PARAGRAPH, max_tokens=LONG_RUN_TOKENS, ignore_eos=True)
    tokens = 0
    for chunk in stream:
        tokens += len(chunk.token_ids)
        if tokens >= 4:
            break
    assert tokens >= 4
    assert blocks_in_use(coordinator) > 0
    stream.close()
    with pytest.raises(LoomError) as error:
        next(stream)
    assert error.value.code == grpc.StatusCode.CANCELLED
    coordinator.wait_idle(timeout=15)


@pytest.mark.slow_machine
def test_deadline_expiry_is_deadline_exceeded_and_frees_blocks(rig, client):
    start = time.monotonic()
    with pytest.raises(LoomError) as error:
        client.generate(h.LONG_PARAGRAPH, max_tokens=LONG_RUN_TOKENS, ignore_eos=True, timeout=2.0)
    assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert error.value.attempts == 1
    assert time.monotonic() - start < 10
    rig.coordinator.wait_idle(timeout=15)


def test_invalid_request_is_not_retried(client):
    with pytest.raises(LoomError) as error:
        client.generate(PROMPT, max_tokens=4, temperature=-1.0)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.attempts == 1


def test_tokenize_detokenize_round_trip(client):
    text = "Hello, world! The quick brown fox."
    ids = client.tokenize(text)
    assert ids == h.tokenize(text)
    assert client.detokenize(ids, skip_special_tokens=True) == text


def test_detokenize_of_an_id_outside_the_vocabulary_is_invalid_argument(client):
    with pytest.raises(LoomError) as error:
        client.detokenize([1 << 30])
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT


# A proto string must be UTF-8: ids that stop inside a character give U+FFFD there (the
# client failed with INTERNAL "Exception deserializing response!" on 115 of the first
# 2,000 single ids).
def test_detokenize_of_a_partial_character_is_valid_utf8(client):
    ids = client.tokenize("h\u00e9llo \U0001F600")
    texts = [client.detokenize(ids[:end]) for end in range(1, len(ids) + 1)]
    assert texts[-1] == "h\u00e9llo \U0001F600"
    assert any("\ufffd" in text for text in texts[:-1]), texts


# An error quoting a huge input (a 1 MB model name) keeps its code: the message is cut
# below a client's metadata limit instead of turning into RESOURCE_EXHAUSTED.
def test_an_error_quoting_a_huge_input_keeps_its_code(client):
    with pytest.raises(LoomError) as error:
        client.generate(PROMPT, max_tokens=2, model="m" * 1_000_000)
    assert error.value.code == grpc.StatusCode.NOT_FOUND, error.value


def test_embed_gives_the_http_apis_vectors(rig, client):
    ids = client.tokenize(PROMPT)
    embeddings = client.embed([PROMPT, ids, "A different sentence."])
    assert len(embeddings.vectors) == 3 and all(len(v) == 576 for v in embeddings.vectors)
    assert embeddings.vectors[0] == embeddings.vectors[1]
    assert embeddings.vectors[0] != embeddings.vectors[2]
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-4) for v in embeddings.vectors)
    assert embeddings.input_tokens[:2] == [len(ids), len(ids)]
    assert embeddings.prompt_tokens == sum(embeddings.input_tokens)
    assert client.embed(PROMPT).vectors == embeddings.vectors[:1]
    assert client.embed(ids).vectors == embeddings.vectors[:1]
    http = openai.OpenAI(base_url=rig.coordinator.http_url + "/v1", api_key="unused", max_retries=0)
    over_http = http.embeddings.create(model=h.MODEL_PATH.stem, input=[PROMPT, "A different sentence."],
                                       encoding_format="base64")
    for got, want in zip(over_http.data, [embeddings.vectors[0], embeddings.vectors[2]]):
        values = got.embedding if isinstance(got.embedding, list) else \
            np.frombuffer(base64.b64decode(got.embedding), dtype="<f4").tolist()
        assert np.array_equal(np.asarray(values, dtype=np.float32), np.asarray(want, dtype=np.float32))


@pytest.mark.slow_machine
def test_embed_refuses_bad_inputs_and_frees_blocks_past_its_deadline(rig, client):
    for inputs, words in (([], "at least one input"), ([PROMPT, [1 << 30]], "input 1")):
        with pytest.raises(LoomError) as error:
            client.embed(inputs)
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert words in error.value.details, error.value.details
        assert error.value.attempts == 1
    with pytest.raises(LoomError) as error:
        client.embed([PROMPT * 40] * 4, timeout=0.05)
    assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    rig.coordinator.wait_idle(timeout=30)
    assert blocks_in_use(rig.coordinator) == 0


def test_list_models_and_cluster_state(client):
    models = client.list_models()
    assert [m.id for m in models] == [h.MODEL_PATH.stem]
    assert models[0].architecture == "llama"
    assert models[0].vocab_size == 49152
    assert models[0].context_length > 0
    state = client.cluster_state()
    assert state.model == h.MODEL_PATH.stem
    assert state.num_healthy_replicas == 1
    assert [r.replica_id for r in state.replicas] == ["r0"]
    assert state.replicas[0].num_kv_blocks > 0


def test_unavailable_before_the_first_token_is_retried_until_a_worker_registers(tmp_path, reference):
    require_cluster_binaries()
    with h.ClusterRig(tmp_path) as rig:
        address = rig.coordinator.address
        with LoomClient(address, retry=RetryPolicy(max_attempts=1)) as no_retry:
            with pytest.raises(LoomError) as error:
                no_retry.generate(PROMPT, max_tokens=16, timeout=30)
            assert error.value.code == grpc.StatusCode.UNAVAILABLE

        result = {}
        retrying = LoomClient(address, retry=RetryPolicy(max_attempts=1000, initial_backoff=0.05,
                                                         max_backoff=0.2))

        def call():
            try:
                result["completion"] = retrying.generate(PROMPT, max_tokens=16, timeout=120)
            except LoomError as e:  # recorded, asserted below
                result["error"] = e

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(1.0)  # several UNAVAILABLE answers while no replica exists
        rig.add_worker("r0", threads=1)
        thread.join(timeout=150)
        retrying.close()
        assert not thread.is_alive()
        assert "error" not in result, result.get("error")
        assert result["completion"].attempts > 1
        assert result["completion"].text == reference


def test_unavailable_after_tokens_arrived_is_not_retried(tmp_path):
    require_cluster_binaries()
    with h.ClusterRig(tmp_path) as rig:
        rig.add_worker("r0", threads=1)
        client = LoomClient(rig.coordinator.address,
                            retry=RetryPolicy(max_attempts=50, initial_backoff=0.05, max_backoff=0.1))
        stream = client.generate_stream(h.LONG_PARAGRAPH, max_tokens=LONG_RUN_TOKENS, ignore_eos=True,
                                        timeout=120)
        tokens = 0
        for chunk in stream:
            tokens += len(chunk.token_ids)
            if tokens >= 2:
                break
        rig.coordinator.kill()  # the connection drops mid-stream
        with pytest.raises(LoomError) as error:
            for chunk in stream:
                tokens += len(chunk.token_ids)
        client.close()
        assert error.value.code == grpc.StatusCode.UNAVAILABLE, error.value
        assert error.value.attempts == 1
        assert stream.attempts == 1
