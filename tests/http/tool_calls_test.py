"""OpenAI tools end to end: the official `openai` client against one `loom serve` with one
CPU worker running the default model (SmolLM2, whose template has no tool support: Loom's
generic format, tools in a system prompt, calls as {"tool_calls": [...]}).

tool_choice "required" and a named function make the reply a valid call of the tool's
schema (the grammar engine enforces it, sampled at temperature 1.0), non-streaming and
streaming (delta.tool_calls as OpenAI streams them, the arguments as they are generated); "auto" parses a call the model wrote
and holds a call the model starts to the schemas (the generic format's trigger: a reply
that starts with '{');
an assistant tool call and the tool's answer render through the chat template; tool
schemas the engine cannot compile are 400s naming the construct. The other formats'
parsers are tested in C++ on recorded replies (tests/api/tool_call_parser_test.cc).
"""
import json
import pathlib
import sys

import jsonschema
import openai
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 24}},
                   "required": ["tz"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
MAX_TOKENS = 120


def check_call(name, arguments):
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_required_guarantees_a_valid_call(client, model):
    for seed in range(4):
        response = client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
            max_tokens=MAX_TOKENS, parallel_tool_calls=False)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_") and len(call.id) == 29
        check_call(call.function.name, call.function.arguments)


def test_a_call_cut_by_max_tokens_is_a_partial_call_whole_and_streamed(client, model):
    # Held to calls but cut short: the call as far as it came, not the call format's text,
    # the same whole and streamed; finish_reason says it was cut.
    kwargs = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                  max_tokens=14, parallel_tool_calls=False)
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls
    # The arguments as far as they are final (a string still open is not yet shown).
    assert call.function.name in SCHEMAS, call
    assert call.function.arguments in ("", "{") or call.function.arguments.startswith("{\""), call
    streamed = {"name": "", "arguments": ""}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for part in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed["name"] += (part.function and part.function.name) or ""
            streamed["arguments"] += (part.function and part.function.arguments) or ""
    assert streamed == {"name": call.function.name, "arguments": call.function.arguments}


def test_named_function_streams_delta_tool_calls(client, model):
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(3):
        stream = client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice=named, temperature=1.0, seed=seed,
            max_tokens=MAX_TOKENS, stream=True, parallel_tool_calls=False)
        calls, finish, content, pieces = {}, None, "", 0
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
                if part.id:
                    call["id"] = part.id
                if part.function and part.function.name:
                    call["name"] += part.function.name
                if part.function and part.function.arguments:
                    call["arguments"] += part.function.arguments
                    pieces += 1
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls"
        assert content == ""
        assert sorted(calls) == list(range(len(calls))) and calls, calls
        for call in calls.values():
            assert call["name"] == "get_time" and call["id"].startswith("call_")
            check_call(call["name"], call["arguments"])
        # The arguments arrive as they are generated, not whole at the end, and join to
        # what the same request answers whole.
        assert pieces > 1, calls
        whole = client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice=named, temperature=1.0, seed=seed,
            max_tokens=MAX_TOKENS, parallel_tool_calls=False).choices[0].message.tool_calls
        assert [c.function.arguments for c in whole] == [calls[i]["arguments"] for i in sorted(calls)]


# The generic format's call, written by a structured-output constraint, for `auto` to parse.
GENERIC_CALL = {"type": "object", "properties": {"tool_calls": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
    "type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER["function"]["parameters"]},
    "required": ["name", "arguments"]}}}, "required": ["tool_calls"]}


@pytest.mark.parametrize("stream", [False, True])
def test_auto_parses_a_call_the_model_wrote_and_passes_text_through(client, model, stream):
    def run(extra):
        kwargs = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="auto", temperature=1.0, seed=7,
                      max_tokens=MAX_TOKENS, extra_body=extra)
        if not stream:
            message = client.chat.completions.create(**kwargs).choices[0]
            calls = [(c.function.name, c.function.arguments) for c in message.message.tool_calls or []]
            return message.finish_reason, message.message.content, calls
        finish, content, calls = None, None, {}
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            delta = chunk.choices[0].delta
            if delta.content:
                content = (content or "") + delta.content
            for part in delta.tool_calls or []:
                name, arguments = calls.get(part.index, ("", ""))
                calls[part.index] = (name + (part.function.name or ""), arguments + (part.function.arguments or ""))
            finish = chunk.choices[0].finish_reason or finish
        return finish, content, [calls[i] for i in sorted(calls)]

    finish, content, calls = run({"guided_json": GENERIC_CALL})
    assert finish == "tool_calls" and content is None, (finish, content)
    assert len(calls) == 1 and calls[0][0] == "get_weather"
    check_call(*calls[0])
    finish, content, calls = run({"guided_choice": ["It is sunny in Paris."]})
    assert (finish, content, calls) == ("stop", "It is sunny in Paris.", [])


def test_auto_holds_a_call_the_model_starts_to_the_schemas(client, model):
    # SmolLM2 never starts a call on its own at temperature 1 (8 of 8 seeds answered in
    # text), so a logit bias on '{' makes it start one: from there the grammar (tool_choice
    # "auto" with the generic format's trigger) must keep the reply a valid call, however
    # hard the bias pushes for more braces. Without the constraint ("none") the same bias
    # writes braces only.
    brace = h.tokenize("{")[-1]
    for seed in range(3):
        response = client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice="auto", temperature=1.0, seed=seed,
            max_tokens=400, logit_bias={str(brace): 100}, parallel_tool_calls=False)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        for call in choice.message.tool_calls:
            check_call(call.function.name, call.function.arguments)
    free = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none",
                                          temperature=1.0, seed=0, max_tokens=16, logit_bias={str(brace): 100})
    assert free.choices[0].message.content.startswith("{{{{"), free.choices[0]


def test_tool_choice_none_and_no_tools_answer_in_text(client, model):
    response = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none",
                                              max_tokens=8, temperature=0)
    assert response.choices[0].message.tool_calls is None
    assert response.choices[0].finish_reason in ("stop", "length")


def test_legacy_functions_return_function_call(client, model):
    response = client.chat.completions.create(
        model=model, messages=ASK, functions=[TIME["function"]], function_call={"name": "get_time"},
        temperature=1.0, seed=1, max_tokens=MAX_TOKENS)
    choice = response.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.function_call.name == "get_time"
    check_call("get_time", choice.message.function_call.arguments)


ROUND_TRIP = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_abc", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
    {"role": "tool", "tool_call_id": "call_abc", "content": "18 degrees, sunny"},
]


def test_tool_round_trip_renders_through_the_template(rig, client, model):
    base = rig.coordinator.http_url
    status, tokens = h.post_json(base + "/tokenize", {"model": model, "messages": ROUND_TRIP, "tools": TOOLS})
    assert status == 200, tokens
    status, text = h.post_json(base + "/detokenize", {"model": model, "tokens": tokens["tokens"]})
    assert status == 200
    prompt = text["prompt"]
    # SmolLM2's template (ChatML, no tool support): the generic format's system prompt with
    # the tools, the call as the model is asked to write it, the answer as a tool_response.
    assert prompt.startswith("<|im_start|>system\nYou can call the following tools"), prompt
    assert '"name":"get_weather","description":"The current weather in a city"' in prompt
    assert ('<|im_start|>assistant\n{"tool_calls":[{"name":"get_weather","arguments":'
            '{"city":"Paris","unit":"celsius"}}]}<|im_end|>') in prompt, prompt
    assert ('<|im_start|>user\n{"tool_response":{"tool_call_id":"call_abc","name":"get_weather",'
            '"content":"18 degrees, sunny"}}<|im_end|>\n<|im_start|>assistant\n') in prompt, prompt
    # The same conversation is served (the model answers after the tool's result).
    response = client.chat.completions.create(model=model, messages=ROUND_TRIP, tools=TOOLS, max_tokens=8,
                                              temperature=0)
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("extra,param,needle", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"not": {}}}}}}], "tool_choice": "required"}, "tools", "'not'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "always"),
    ({"tool_choice": "required"}, "tool_choice", "tools"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "function"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", "conflicts"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ({"functions": [TIME["function"]], "function_call": "auto", "stream": True}, "functions", "stream"),
])
def test_bad_tool_requests_are_400_naming_the_param(client, model, extra, param, needle):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, extra_body=extra)
    assert raised.value.body["param"] == param, raised.value.body
    assert needle in raised.value.body["message"], raised.value.body


def test_tools_on_completions_are_refused(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model, prompt="x", max_tokens=2, extra_body={"tools": TOOLS})
    assert raised.value.body["param"] == "tools"
