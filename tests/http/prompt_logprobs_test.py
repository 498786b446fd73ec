"""Prompt log-probabilities through the official `openai` client and gRPC, on one `loom serve`
with one CPU worker running the default model: lm-evaluation-harness's log-likelihood
request (token-id prompt, echo, logprobs 1, max_tokens 1), vLLM's `prompt_logprobs` on
completions and chat, and GenerateRequest.prompt_logprobs.

The prompt's scores come from the worker's prompt-scoring rows; the generated token's
logprob from the sampler. The two paths must agree: the logprob the sampler gave the greedy
token after a prompt is the score that token gets as the last token of the prompt extended
by it. A prefix-cache hit must not change the scores (the scored prompt is recomputed).
"""
import math

import openai
import pytest

import cluster_harness as h  # noqa: E402  (conftest put tests/cluster on the path)

PROMPT = "The capital of France is Paris. The capital of Italy is"


def encode(rig, model, text):
    status, body = h.post_json(rig.coordinator.http_url + "/tokenize",
                               {"model": model, "prompt": text, "add_special_tokens": False})
    assert status == 200, body
    return body["tokens"]


def loglikelihood_request(client, model, prompt_ids):
    """What lm-evaluation-harness's local-completions model sends for a log-likelihood."""
    return client.completions.create(model=model, prompt=prompt_ids, echo=True, logprobs=1,
                                     max_tokens=1, temperature=0, seed=1234)


def test_lm_eval_loglikelihood_request(rig, client, model):
    ids = encode(rig, model, PROMPT)
    choice = loglikelihood_request(client, model, ids).choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(ids) + 1  # the prompt, then the generated token
    assert choice.text.startswith(PROMPT)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    scores = logprobs.token_logprobs[1:]
    assert all(isinstance(s, float) and s <= 1e-6 for s in scores), scores
    assert all(len(top) == 1 for top in logprobs.top_logprobs[1:]), logprobs.top_logprobs
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0
    # The harness's greedy check: where the prompt token is the most likely one, its
    # logprob is the top entry's.
    for token, score, top in zip(logprobs.tokens[1:-1], scores[:-1], logprobs.top_logprobs[1:-1]):
        best, best_score = max(top.items(), key=lambda item: item[1])
        assert score <= best_score + 1e-4
        if best == token:
            assert math.isclose(score, best_score, abs_tol=1e-4)
    # Natural text: several of its tokens are the model's own first choice there.
    greedy = sum(1 for token, top in zip(logprobs.tokens[1:-1], logprobs.top_logprobs[1:-1])
                 if max(top, key=top.get) == token)
    assert greedy >= 2, logprobs

    # The sampler's logprob of the greedy token = its score as the extended prompt's last.
    generated = encode(rig, model, logprobs.tokens[-1])
    extended = loglikelihood_request(client, model, ids + generated[:1]).choices[0].logprobs
    assert math.isclose(extended.token_logprobs[len(ids)], logprobs.token_logprobs[-1], abs_tol=2e-3)
    assert extended.token_logprobs[1:len(ids)] == pytest.approx(scores[:-1], abs=1e-4)


def test_prompt_logprobs_on_completions_and_chat(rig, client, model):
    ids = encode(rig, model, PROMPT)
    echo = loglikelihood_request(client, model, ids).choices[0].logprobs.token_logprobs
    completion = client.completions.create(model=model, prompt=ids, max_tokens=2, temperature=0,
                                           extra_body={"prompt_logprobs": 3})
    scores = completion.choices[0].model_extra["prompt_logprobs"]
    assert len(scores) == len(ids) and scores[0] is None
    for position, entry in enumerate(scores[1:], start=1):
        own = entry[str(ids[position])]
        assert own["logprob"] == pytest.approx(echo[position], abs=1e-4)
        assert own["rank"] >= 1 and own["decoded_token"]
        others = sorted(e["rank"] for key, e in entry.items() if key != str(ids[position]))
        if own["rank"] <= 3:  # among the top 3: listed once
            assert sorted(e["rank"] for e in entry.values()) == [1, 2, 3], entry
        else:
            assert others == [1, 2, 3], entry
        assert (own["rank"] == 1) == (max(entry.values(), key=lambda e: e["logprob"]) is own)

    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 0})
    prompt = chat.model_extra["prompt_logprobs"]
    assert len(prompt) == chat.usage.prompt_tokens and prompt[0] is None
    assert all(len(entry) == 1 for entry in prompt[1:])  # the prompt token alone


def test_a_prefix_cache_hit_does_not_change_the_scores(rig, client, model):
    ids = encode(rig, model, PROMPT + " Rome. The capital of Spain is")
    plain = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0)
    assert plain.choices[0].text
    first = loglikelihood_request(client, model, ids).choices[0].logprobs.token_logprobs
    again = loglikelihood_request(client, model, ids).choices[0].logprobs.token_logprobs
    assert first == pytest.approx(again, abs=1e-5)
    assert None not in first[1:]


def test_grpc_prompt_logprobs(rig, model):
    request = h.make_request(prompt=PROMPT, max_tokens=1, temperature=0)
    request.prompt_logprobs = 2
    last = list(rig.coordinator.stub.Generate(request, timeout=120))[-1]
    assert last.finish_reason != 0
    assert len(last.prompt_logprobs) == last.prompt_tokens - 1
    assert all(len(p.top_logprobs) == 2 and p.rank >= 1 and p.logprob <= 1e-6 for p in last.prompt_logprobs)
    request.prompt_logprobs = 21
    with pytest.raises(Exception) as raised:
        list(rig.coordinator.stub.Generate(request, timeout=60))
    assert "prompt_logprobs" in str(raised.value)


@pytest.mark.parametrize("kwargs, param", [
    (dict(extra_body={"prompt_logprobs": 21}), "prompt_logprobs"),
    (dict(extra_body={"prompt_logprobs": -1}), "prompt_logprobs"),
    (dict(stream=True, extra_body={"prompt_logprobs": 1}), "prompt_logprobs"),
    (dict(stream=True, echo=True, logprobs=1), "echo"),
])
def test_bad_prompt_logprobs_are_400(client, model, kwargs, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=1, **kwargs)
    assert raised.value.body["param"] == param, raised.value.body
