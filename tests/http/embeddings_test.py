"""POST /v1/embeddings through the official `openai` client (`client.embeddings.create`), on one
`loom serve` with one CPU worker running the default model. An input's embedding is its last
token's final hidden state after the final norm, L2-normalized (vLLM's LAST pooling of a decoder
model): checked against the model itself, since the tied LM head applied to that state must
rank first the token greedy decoding picks (the embedding table dequantized from the GGUF with
the `gguf` package). Strings, token lists and batches of either; base64; what the endpoint
refuses is a 400 naming the parameter (404 for another model).
"""
import base64
import pathlib
import struct
import sys

import numpy as np
import openai
import pytest
import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

# The served context, short so that an input filling it is cheap to embed.
MAX_MODEL_LEN = 256
COORDINATOR_FLAGS = {"max_model_len": MAX_MODEL_LEN}  # conftest.py's rig


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land"]
HIDDEN = 576  # SmolLM2-135M


def vectors(response):
    return [np.array(item.embedding, dtype=np.float64) for item in response.data]


def test_every_input_gets_a_unit_vector_in_input_order(client, model):
    response = client.embeddings.create(model=model, input=PROMPTS + [PROMPTS[0]])
    assert response.object == "list" and response.model == model
    assert [item.index for item in response.data] == [0, 1, 2, 3]
    out = vectors(response)
    for v in out:
        assert v.shape == (HIDDEN,)
        assert abs(np.linalg.norm(v) - 1.0) < 1e-5
    # The same input gives the same bits; different inputs differ.
    assert np.array_equal(out[0], out[3])
    assert not np.allclose(out[0], out[1]) and not np.allclose(out[1], out[2])
    # Alone or in a batch: the same vector (batch-invariant kernels).
    alone = vectors(client.embeddings.create(model=model, input=PROMPTS[1]))[0]
    assert np.array_equal(alone, out[1])
    tokens = sum(len(h.tokenize(p)) for p in PROMPTS + [PROMPTS[0]])
    assert response.usage.prompt_tokens == tokens == response.usage.total_tokens


def test_token_lists_and_base64_give_the_same_vectors(rig, client, model):
    ids = requests.post(rig.coordinator.http_url + "/tokenize", json={"prompt": PROMPTS[2]},
                        timeout=60).json()["tokens"]
    by_text = vectors(client.embeddings.create(model=model, input=PROMPTS[2]))[0]
    by_ids = vectors(client.embeddings.create(model=model, input=ids))[0]
    assert np.array_equal(by_text, by_ids)
    batch = vectors(client.embeddings.create(model=model, input=[ids, ids[:3]]))
    assert np.array_equal(batch[0], by_text) and not np.allclose(batch[1], by_text)
    # base64 over the wire (raw HTTP: the client decodes it itself otherwise).
    raw = requests.post(rig.coordinator.http_url + "/v1/embeddings",
                        json={"model": model, "input": PROMPTS[2], "encoding_format": "base64"},
                        timeout=60).json()
    decoded = struct.unpack(f"<{HIDDEN}f", base64.b64decode(raw["data"][0]["embedding"]))
    assert np.array_equal(np.array(decoded, dtype=np.float64), by_text)
    # dimensions equal to the model's is accepted.
    same = vectors(client.embeddings.create(model=model, input=PROMPTS[2], dimensions=HIDDEN))[0]
    assert np.array_equal(same, by_text)


def test_the_lm_head_ranks_the_greedy_token_first_on_the_embedding(rig, client, model):
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(h.MODEL_PATH))
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    table = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float64).reshape(-1, HIDDEN)
    checked = 0
    for prompt, v in zip(PROMPTS, vectors(client.embeddings.create(model=model, input=PROMPTS))):
        logits = table @ v
        first, second = np.sort(logits)[-2:][::-1]
        greedy = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0)
        if first - second < 1e-3 * abs(first):
            continue  # a near tie: float summation order may decide it either way
        predicted = int(np.argmax(logits))
        text = requests.post(rig.coordinator.http_url + "/detokenize", json={"tokens": [predicted]},
                             timeout=60).json()["prompt"]
        assert text == greedy.choices[0].text, (prompt, predicted, text, greedy.choices[0].text)
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [1, "a"]}, "input"),
    # A list of strings or of token lists, not both (OpenAI's and vLLM's shapes).
    ({"input": ["a", [1, 2]]}, "input"),
    ({"input": [[1, 2], "a"]}, "input"),
    # Token ids past 32 bits were narrowed (2^32 + 1 embedded as token 1).
    ({"input": [4294967297]}, "input"),
    ({"input": [[4294967301, 2]]}, "input"),
    ({"input": [9223372036854775808]}, "input"),
    ({"input": [2147483648]}, "input"),
    ({"input": "hi", "dimensions": 64}, "dimensions"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({}, "input"),
])
def test_bad_requests_are_400_naming_the_parameter(rig, model, body, param):
    answer = requests.post(rig.coordinator.http_url + "/v1/embeddings", json={"model": model, **body},
                           timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text


def test_another_model_is_404_and_an_input_past_the_context_is_400(client):
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=client.models.list().data[0].id, input="word " * 9000)


# A generated reply needs one token of room after the prompt; an embedding needs none, so an
# input may fill the context exactly (and no more), and its blocks are freed after.
def test_an_input_may_fill_the_context_but_not_pass_it(rig, client, model):
    status, tokens = h.post_json(rig.coordinator.http_url + "/tokenize",
                                 {"model": model, "prompt": PROMPTS[0], "add_special_tokens": False})
    assert status == 200 and tokens["max_model_len"] == MAX_MODEL_LEN, tokens
    full = (tokens["tokens"] * MAX_MODEL_LEN)[:MAX_MODEL_LEN]
    response = client.embeddings.create(model=model, input=full)
    assert response.usage.prompt_tokens == MAX_MODEL_LEN
    assert np.linalg.norm(vectors(response)[0]) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=model, input=full + full[:1])
    assert refused.value.body["param"] == "input", refused.value.body
    with pytest.raises(openai.BadRequestError):  # a completion must leave room for a token
        client.completions.create(model=model, prompt=full, max_tokens=1)
    rig.coordinator.wait_idle()
