"""Structured output end to end: the official `openai` client against one `loom serve` with
one CPU worker running the default model.

Sampled at temperature 1.0 with seeds, every output under a JSON schema parses and
validates (the constraint, not the model, makes it so); regex and choice outputs match
exactly; an output the grammar cannot complete within max_tokens ends with "length";
constructs the engine cannot compile, and conflicting constraints, are 400s naming the
parameter; the gRPC API and the Python SDK take the same constraints. Also /tokenize and
/detokenize.
"""
import concurrent.futures
import json
import pathlib
import re
import sys

import jsonschema
import openai
import pytest

try:  # the HTTP client the installed openai package is built on (openai >= 3 uses httpx2)
    import httpx2 as httpx
except ImportError:
    import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

# Every schema bounds its documents (string lengths, item counts, ranges), so an output
# always fits in MAX_TOKENS: a "length" finish would be the engine's failure, not the budget's.
MAX_TOKENS = 160


def obj(properties, required=None):
    return {"type": "object", "properties": properties, "required": list(required or properties),
            "additionalProperties": False}


S = {"type": "string", "maxLength": 12}
SCHEMAS = [
    obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    obj({"city": S, "population": {"type": "integer", "minimum": 1, "maximum": 99999999}}),
    obj({"ok": {"type": "boolean"}}),
    obj({"color": {"enum": ["red", "green", "blue"]}, "shade": {"type": "integer", "minimum": 1, "maximum": 9}}),
    obj({"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}),
    obj({"x": {"type": "number", "minimum": 0, "maximum": 100}, "y": {"type": "number", "minimum": 0, "maximum": 100}}),
    obj({"step": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
         "parity": {"type": "integer", "multipleOf": 2}}),
    # Pydantic's set[Literal[...]] (uniqueItems) and dict[constr(pattern), int] with bounds.
    {"type": "array", "items": {"enum": ["red", "green", "blue", "black"]}, "uniqueItems": True,
     "minItems": 2, "maxItems": 3},
    {"type": "object", "patternProperties": {"^k[0-9]$": {"type": "integer", "minimum": 0, "maximum": 9}},
     "minProperties": 1, "maxProperties": 3},
    # Pydantic's Field(gt=0, le=99.5) and confloat(ge=-1.5, le=1.5).
    obj({"price": {"type": "number", "exclusiveMinimum": 0, "maximum": 99.5},
         "ratio": {"type": "number", "minimum": -1.5, "maximum": 1.5}}),
    obj({"answer": {"type": ["string", "null"], "maxLength": 8}}),
    obj({"user": obj({"first": S, "last": S}), "admin": {"type": "boolean"}}),
    obj({"id": {"type": "string", "format": "uuid"}}),
    obj({"when": {"type": "string", "format": "date"}}),
    obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}),
    obj({"title": S, "rating": {"type": "integer", "minimum": 1, "maximum": 5}, "note": S}, required=["title", "rating"]),
    {"type": "array", "items": {"type": "integer", "minimum": -50, "maximum": 50}, "minItems": 2, "maxItems": 4},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "integer", "minimum": 1000, "maximum": 1999},
    {"anyOf": [obj({"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}}),
               obj({"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}})]},
    {"$defs": {"pt": obj({"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}})},
     "type": "array", "items": {"$ref": "#/$defs/pt"}, "minItems": 1, "maxItems": 3},
    obj({"email": {"type": "string", "format": "email", "maxLength": 30}}) if False else
    obj({"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}}),
    obj({"matrix": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2, "items": {"type": "boolean"}}}}),
    obj({"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "integer", "minimum": 0, "maximum": 9},
         "c": {"type": "integer", "minimum": 0, "maximum": 9}, "d": {"type": "integer", "minimum": 0, "maximum": 9}}),
    obj({"word": {"type": "string", "minLength": 3, "maxLength": 6}, "count": {"type": "integer", "minimum": 0, "maximum": 20}}),
]
GENERATIONS_PER_SCHEMA = 10
PROMPT = [{"role": "user", "content": "Reply with a JSON value for a small example record."}]


def test_sampled_outputs_parse_and_validate(client, model):
    assert len(SCHEMAS) >= 20
    for schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)

    def generate(job):
        index, seed = job
        response = client.chat.completions.create(
            model=model, messages=PROMPT, temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
            response_format={"type": "json_schema",
                             "json_schema": {"name": f"s{index}", "schema": SCHEMAS[index], "strict": True}})
        choice = response.choices[0]
        return index, seed, choice.finish_reason, choice.message.content

    jobs = [(i, 1000 * i + k) for i in range(len(SCHEMAS)) for k in range(GENERATIONS_PER_SCHEMA)]
    assert len(jobs) >= 200
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for index, seed, finish, content in pool.map(generate, jobs):
            try:
                assert finish == "stop", f"finish_reason {finish}"
                jsonschema.validate(json.loads(content), SCHEMAS[index])
            except (AssertionError, json.JSONDecodeError, jsonschema.ValidationError) as e:
                failures.append((index, seed, content, str(e)[:200]))
    assert not failures, failures[:5]


def test_guided_json_and_json_object_through_extra_body(client, model):
    schema = obj({"n": {"type": "integer", "minimum": 0, "maximum": 9}})
    for extra in ({"guided_json": schema}, {"structured_outputs": {"json": schema}}):
        response = client.completions.create(model=model, prompt="Some JSON:", max_tokens=MAX_TOKENS,
                                              temperature=1.0, seed=3, extra_body=extra)
        jsonschema.validate(json.loads(response.choices[0].text), schema)
    response = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=MAX_TOKENS,
                                              temperature=0.0, response_format={"type": "json_object"})
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(response.choices[0].message.content), dict)
    else:  # greedy output may be long; what came is a JSON object's prefix
        assert response.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("extra", [
    {"guided_regex": r"[A-Z][a-z]{2,5} [0-9]{2}"},
    {"structured_outputs": {"regex": r"(cat|dog)s? and (fish|bird)"}},
])
def test_regex_outputs_match_exactly(client, model, extra):
    pattern = extra.get("guided_regex") or extra["structured_outputs"]["regex"]
    for seed in range(5):
        response = client.completions.create(model=model, prompt="Answer:", max_tokens=40, temperature=1.0,
                                              seed=seed, extra_body=extra)
        assert response.choices[0].finish_reason == "stop"
        assert re.fullmatch(pattern, response.choices[0].text), response.choices[0].text


def test_choice_outputs_are_one_of_the_choices(client, model):
    choices = ["positive", "negative", "neutral"]
    for seed in range(5):
        for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
            response = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Sentiment of 'great!'?"}],
                max_tokens=10, temperature=1.0, seed=seed, extra_body=extra)
            assert response.choices[0].message.content in choices


def test_grammar_and_streaming(client, model):
    grammar = 'root ::= "(" num ("," num){0,2} ")"\nnum ::= [1-9] [0-9]?'
    stream = client.completions.create(model=model, prompt="Tuple:", max_tokens=30, temperature=1.0, seed=5,
                                       stream=True, extra_body={"guided_grammar": grammar})
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert re.fullmatch(r"\([1-9][0-9]?(,[1-9][0-9]?){0,2}\)", text), text


@pytest.mark.parametrize("extra", [{"min_tokens": 6}, {"ignore_eos": True}])
def test_a_complete_document_ends_before_min_tokens_and_with_ignore_eos(client, model, extra):
    # The grammar's document is complete after a few tokens: it ends there ("stop"), with
    # no token the grammar refuses after it (special tokens shown to catch them).
    for endpoint in ("chat", "completions"):
        body = dict(model=model, max_tokens=12, temperature=0, extra_body={
            "guided_choice": ["true", "false"], "skip_special_tokens": False, **extra})
        if endpoint == "chat":
            response = client.chat.completions.create(messages=PROMPT, **body)
            text = response.choices[0].message.content
        else:
            response = client.completions.create(prompt="Is the sky blue?", **body)
            text = response.choices[0].text
        assert text in ("true", "false"), text
        assert response.choices[0].finish_reason == "stop", endpoint
        assert response.usage.completion_tokens < 6, response.usage


def test_unsatisfiable_within_max_tokens_ends_with_length(client, model):
    response = client.completions.create(model=model, prompt="Go:", max_tokens=6, temperature=1.0, seed=1,
                                          extra_body={"guided_regex": "a{60}"})
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert re.fullmatch("a{1,59}", choice.text), choice.text


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"not": {}}}}}}},
     "response_format"),
    ({"guided_json": {"type": "string", "format": "hostname"}}, "guided_json"),
    ({"guided_regex": "(a)\\1"}, "guided_regex"),
    ({"guided_grammar": "root ::= root \"a\""}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"structured_outputs": {"yaml": "a"}}, "structured_outputs.yaml"),
])
def test_uncompilable_constraints_are_400_naming_the_param(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model, prompt="x", max_tokens=4, extra_body=extra)
    assert raised.value.body["param"] == param, raised.value.body
    assert raised.value.status_code == 400


def test_grpc_api_and_python_sdk_take_constraints(rig):
    request = h.make_request(prompt="Pick:", max_tokens=20, temperature=1.0, seed=4)
    request.sampling.grammar.kind = "choice"
    request.sampling.grammar.text = json.dumps(["left", "right"])
    outcome = h.generate_all(rig.coordinator.stub, [request])[0]
    assert outcome.finished, outcome.describe()
    assert outcome.text in ("left", "right")

    # The installed SDK (scripts/install-deps.sh builds it from this checkout): client_test_util
    # fails this test, never skips it, when loom_client is missing or older than this checkout.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "client"))
    from client_test_util import require_sdk_parameter
    require_sdk_parameter("regex")
    from loom_client import LoomClient
    with LoomClient(rig.coordinator.address) as sdk:
        completion = sdk.generate("Number:", max_tokens=12, temperature=1.0, seed=2, regex="[0-9]{3}")
        assert re.fullmatch("[0-9]{3}", completion.text), completion.text
        with pytest.raises(TypeError):
            sdk.generate("x", regex="a", choice=["a"])


def test_tokenize_and_detokenize(rig, model):
    base = rig.coordinator.http_url
    status, tokens = h.post_json(base + "/tokenize", {"model": model, "prompt": "Hello world",
                                                    "add_special_tokens": False})
    assert status == 200
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] > 0
    assert h.post_json(base + "/detokenize", {"model": model, "tokens": tokens["tokens"]}) == \
        (200, {"prompt": "Hello world"})
    status, chat = h.post_json(base + "/tokenize", {"model": model, "messages": PROMPT})
    assert status == 200 and chat["count"] > tokens["count"]  # the template's tokens too
    status, bad = h.post_json(base + "/detokenize", {"tokens": [-1]})
    assert status == 400 and bad["error"]["param"] == "tokens"
    status, bad = h.post_json(base + "/tokenize", {"text": "x"})
    assert status == 400 and bad["error"]["param"] == "prompt"
    status, bad = h.post_json(base + "/tokenize", {"prompt": "x", "messages": PROMPT})
    assert status == 400 and bad["error"]["param"] == "prompt"


@pytest.mark.parametrize("extra,param", [
    ({"suffix": "x"}, "suffix"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"best_of": 2}, "best_of"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),  # 0-20
    ({"tool_choice": "required"}, "tool_choice"),  # without tools
    # vLLM's chat-template fields: the served model's template renders every request.
    ({"chat_template": "{{ raise_exception('boom') }}"}, "chat_template"),
    ({"documents": [{"title": "a", "text": "b"}]}, "documents"),
    # ... nor through the template's own arguments.
    ({"chat_template_kwargs": {"documents": [{"text": "b"}]}}, "chat_template_kwargs"),
    # A reply cannot both start a new message and continue the last one.
    ({"continue_final_message": True}, "continue_final_message"),
    ({"chat_template_kwargs": {"continue_final_message": True}}, "continue_final_message"),
    ({"add_generation_prompt": "no"}, "add_generation_prompt"),
    ({"chat_template_kwargs": {"add_generation_prompt": 0}}, "chat_template_kwargs"),
    # vLLM's sampling extras that would change the output: refused, not ignored.
    ({"allowed_token_ids": [5]}, "allowed_token_ids"),
    ({"bad_words": ["a"]}, "bad_words"),
    ({"truncate_prompt_tokens": 2}, "truncate_prompt_tokens"),
    ({"use_beam_search": True}, "use_beam_search"),
])
def test_unimplemented_parameters_are_refused_not_ignored(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=PROMPT, max_tokens=2, extra_body=extra)
    assert raised.value.body["param"] == param, raised.value.body


@pytest.mark.parametrize("fields,param", [
    ({"messages": [{"role": "user", "content": [{"type": 5, "text": "hi"}]}]}, "messages"),
    ({"tools": [{"type": None, "function": {"name": "f"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": 5}}, "tool_choice"),
])
def test_names_of_the_wrong_json_type_are_400_naming_the_field(rig, model, fields, param):
    status, body = h.post_json(rig.coordinator.http_url + "/v1/chat/completions",
                               {"model": model, "messages": PROMPT, "max_tokens": 2, **fields})
    assert status == 400 and body["error"]["param"] == param, body


# vLLM's add_generation_prompt and continue_final_message: the assistant reply prefilled by
# the client is continued, not restarted. The chat's prompt is the rendered conversation cut
# after the prefill (as /tokenize reports it), so a greedy chat equals a greedy completion of
# those token ids; without the generation prompt the chat is one token shorter or more.
def test_a_prefilled_assistant_reply_is_continued(rig, client, model):
    base = rig.coordinator.http_url
    prefill = "The capital of France is"
    messages = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": prefill}]
    status, open_chat = h.post_json(base + "/tokenize", {
        "model": model, "messages": messages, "add_generation_prompt": False,
        "continue_final_message": True})
    assert status == 200, open_chat
    status, text = h.post_json(base + "/detokenize", {"model": model, "tokens": open_chat["tokens"]})
    assert status == 200 and text["prompt"].endswith("<|im_start|>assistant\n" + prefill), text

    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    completion = client.completions.create(model=model, prompt=open_chat["tokens"], max_tokens=8,
                                           temperature=0)
    assert chat.choices[0].message.content == completion.choices[0].text
    assert chat.usage.prompt_tokens == open_chat["count"]

    counts = {}
    for add in (True, False):
        status, body = h.post_json(base + "/tokenize", {"model": model, "messages": messages[:1],
                                                        "add_generation_prompt": add})
        assert status == 200, body
        counts[add] = body["count"]
    assert counts[False] < counts[True]
    # chat_template_kwargs override the request's fields, as in vLLM.
    status, body = h.post_json(base + "/tokenize", {
        "model": model, "messages": messages[:1], "chat_template_kwargs": {"add_generation_prompt": False}})
    assert status == 200 and body["count"] == counts[False], body


def test_no_op_values_of_unimplemented_parameters_are_accepted(client, model):
    response = client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=2, temperature=0,
        extra_body={"tools": [], "tool_choice": "none", "logit_bias": {}, "min_tokens": 0,
                    "truncate_prompt_tokens": -1, "allowed_token_ids": None, "use_beam_search": False,
                    "skip_special_tokens": True, "parallel_tool_calls": True, "best_of": 1,
                    "suffix": "", "add_generation_prompt": True, "continue_final_message": False,
                    "chat_template": "", "documents": []})
    assert response.choices[0].finish_reason == "length"



# JSON text (Python's json module itself stops near 1,000 levels).
DEEP_SCHEMA = '{"type":"array","items":' * 10000 + '{"type":"integer"}' + "}" * 10000
CHAT_TEXT = json.dumps(PROMPT)


# Inputs nested far deeper than any real one used to overflow the coordinator's stack (one
# request took the server down): each is a 400 naming the nesting, quickly, and the server
# keeps serving. A body is refused whole before parsing (its depth is counted, not recursed);
# schemas and grammars sent as strings are bounded where they are compiled.
@pytest.mark.parametrize("endpoint,fields,param,fragment", [
    ("chat/completions", f'"messages": {CHAT_TEXT}, "response_format": {{"type": "json_schema", "json_schema": {{"name": "x", "schema": {DEEP_SCHEMA}}}}}',
     None, "the request body nests arrays and objects deeper than 256 levels"),
    ("chat/completions", f'"messages": {CHAT_TEXT}, "tool_choice": "required", "tools": [{{"type": "function", "function": {{"name": "f", "parameters": {DEEP_SCHEMA}}}}}]',
     None, "the request body nests arrays and objects deeper than 256 levels"),
    ("completions", '"prompt": "x", "guided_json": ' + json.dumps(DEEP_SCHEMA),
     "guided_json", "nests arrays and objects deeper than 256 levels"),
    ("completions", '"prompt": "x", "guided_regex": ' + json.dumps("(" * 100000 + "a" + ")" * 100000),
     "guided_regex", "groups nested deeper than 256"),
    ("completions", '"prompt": "x", "guided_regex": ' + json.dumps("a" + "*" * 1000000),
     "guided_regex", "multiple repeat"),
    ("completions", '"prompt": "x", "guided_grammar": ' + json.dumps('root ::= "a"' + "*" * 1000000),
     "guided_grammar", "cannot be stacked"),
])
def test_inputs_nested_too_deep_are_400_and_the_server_lives(rig, model, endpoint, fields, param, fragment):
    body = f'{{"model": {json.dumps(model)}, "max_tokens": 2, {fields}}}'
    response = httpx.post(f"{rig.coordinator.http_url}/v1/{endpoint}", content=body.encode(),
                          headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert fragment in error["message"], error
    assert error["param"] == param, error
    again = httpx.post(f"{rig.coordinator.http_url}/v1/completions",
                       json={"model": model, "prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert again.status_code == 200, again.text
