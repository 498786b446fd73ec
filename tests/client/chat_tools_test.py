"""Chat with tools over gRPC (GenerateRequest.messages/tools/tool_choice) against a real
`loom up` on the default model (SmolLM2: its template has no tool support, so Loom's
generic format), through the Python SDK (LoomClient.chat / chat_stream), the C++ SDK
(Client::Chat, tests/client/client_tool.cc) and raw gRPC:

* tool_choice "required" and a named function give a valid call of the tool's schema
  (sampled at temperature 1.0; the grammar engine, not the model, makes it valid; checked
  with jsonschema), non-streaming and streaming (the last message carries the calls);
* an assistant tool call and the tool's answer are served (the round trip renders);
* a prefilled assistant reply is continued (continue_final_message);
* a schema the grammar engine cannot compile is INVALID_ARGUMENT naming the construct;
  messages together with a prompt, tools without messages, parameters that are not JSON
  and a named function that is not among the tools are INVALID_ARGUMENT.
The chat template is parsed with the HTTP API off (--http-port -1): gRPC chats need it too.
"""
import json
import subprocess

import grpc
import jsonschema
import pytest

from client_test_util import h, require_cluster_binaries
from loom_client import LoomClient, LoomError

TOOL = h.BUILD_DIR / "tests" / "client" / "client_tool"

WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 16},
               "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}
TIME = {"name": "get_time", "description": "The local time in a time zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 24}},
                       "required": ["tz"]}}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]
SCHEMAS = {"get_weather": WEATHER["parameters"], "get_time": TIME["parameters"]}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    require_cluster_binaries()
    missing = h.require_binaries(TOOL)
    if missing:
        pytest.fail(missing)
    up = h.Up(tmp_path_factory.mktemp("chat_tools"), replicas=1, threads=2, http_port=-1)
    try:
        up.wait_healthy(["replica-0"])
        yield up
    finally:
        up.stop()
        print(up.log_tail())


@pytest.fixture(scope="module")
def client(up):
    with LoomClient(up.address, timeout=600) as client:
        yield client


def check_call(call, name=None):
    assert call.id.startswith("call_") and len(call.id) == 29, call
    assert call.name in SCHEMAS, call
    if name is not None:
        assert call.name == name
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_python_required_gives_a_valid_call(client):
    for seed in range(3):
        reply = client.chat(ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                            temperature=1.0, seed=seed, max_tokens=MAX_TOKENS)
        assert reply.finish_reason == "stop", reply
        assert len(reply.tool_calls) == 1, reply
        check_call(reply.tool_calls[0])
        assert reply.content == ""  # the whole reply is the call
        assert reply.prompt_tokens > 0


def test_python_named_function_streams_the_calls_on_the_last_chunk(client):
    chunks = []
    named = {"type": "function", "function": {"name": "get_time"}}
    with client.chat_stream(ASK, tools=TOOLS, tool_choice=named, temperature=1.0, seed=3,
                            max_tokens=MAX_TOKENS) as stream:
        chunks = list(stream)
    assert chunks[-1].finish_reason == "stop"
    assert all(not c.tool_calls for c in chunks[:-1])
    calls = chunks[-1].tool_calls
    assert len(calls) >= 1
    for call in calls:
        check_call(call, "get_time")
    # The streamed text is the model's raw reply: the generic format's JSON of the calls.
    raw = json.loads("".join(c.text for c in chunks))
    assert [c["name"] for c in raw["tool_calls"]] == [c.name for c in calls]
    # A function's bare name selects it too.
    reply = client.chat(ASK, tools=TOOLS, tool_choice="get_weather", temperature=1.0, seed=4,
                        max_tokens=MAX_TOKENS, parallel_tool_calls=False)
    assert len(reply.tool_calls) == 1
    check_call(reply.tool_calls[0], "get_weather")


def test_python_tool_round_trip_is_served(client):
    round_trip = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_abc", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18 degrees, sunny"}]
    short = client.chat(ASK, tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0)
    reply = client.chat(round_trip, tools=TOOLS, max_tokens=8, temperature=0)
    assert reply.finish_reason in ("stop", "length")
    # The call and the tool's answer are in the prompt (tokens beyond the question's).
    assert reply.prompt_tokens > short.prompt_tokens + 20
    # tool_choice "none" and no tools: plain text, no calls.
    assert short.tool_calls == [] and short.completion_tokens > 0


# vLLM's continue_final_message: the prefilled assistant reply is continued, so the prompt is
# the chat's with the prefill's tokens appended (the generation prompt opens the same
# assistant turn); both it and a new generation prompt is INVALID_ARGUMENT.
def test_python_continues_a_prefilled_reply(client):
    prefill = "The weather in Paris is"
    fresh = client.chat(ASK, max_tokens=1, temperature=0)
    continued = client.chat(ASK + [{"role": "assistant", "content": prefill}], max_tokens=6,
                            temperature=0, add_generation_prompt=False, continue_final_message=True)
    assert continued.completion_tokens > 0
    assert continued.prompt_tokens == \
        fresh.prompt_tokens + len(client.tokenize(prefill, add_special_tokens=False))
    expect_invalid(client, "add_generation_prompt", continue_final_message=True)


# chat_template_kwargs and reasoning_effort reach the server (the default model's template
# reads neither, so the prompt stays the same); an effort outside OpenAI's four, or kwargs
# the template may not take, are INVALID_ARGUMENT naming the field.
def test_python_template_kwargs_and_reasoning_effort_are_sent(client):
    plain = client.chat(ASK, max_tokens=1, temperature=0)
    both = client.chat(ASK, max_tokens=1, temperature=0, chat_template_kwargs={"enable_thinking": False},
                       reasoning_effort="low")
    assert both.prompt_tokens == plain.prompt_tokens and both.completion_tokens == 1
    expect_invalid(client, "reasoning_effort", reasoning_effort="extreme")
    expect_invalid(client, "chat_template_kwargs", chat_template_kwargs={"messages": []})
    expect_invalid(client, "chat_template_kwargs", chat_template_kwargs="{not json")


def expect_invalid(client, needle, **kwargs):
    with pytest.raises(LoomError) as error:
        client.chat(ASK, max_tokens=8, **kwargs)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT, error.value
    assert needle in error.value.details, error.value.details


def test_python_bad_tools_are_invalid_argument_naming_the_construct(client):
    bad = [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}]
    expect_invalid(client, "'not'", tools=bad, tool_choice="required")
    expect_invalid(client, "nope", tools=TOOLS, tool_choice="nope")
    expect_invalid(client, "tools", tool_choice="required")
    expect_invalid(client, "always", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "always"}})


def raw_generate_error(up, request):
    with pytest.raises(grpc.RpcError) as error:
        for _ in up.stub.Generate(request, timeout=60):
            pass
    return error.value


def test_raw_grpc_refuses_prompt_with_messages_and_chat_fields_without_messages(up):
    pb = h.stubs().pb
    both = pb.GenerateRequest(text="Hello", max_tokens=4, messages=[pb.ChatMessage(role="user", content="Hi")])
    error = raw_generate_error(up, both)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not both" in error.details(), error
    tools_only = pb.GenerateRequest(text="Hello", max_tokens=4, tools=[pb.Tool(name="f")])
    error = raw_generate_error(up, tools_only)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "need messages" in error.details(), error
    not_json = pb.GenerateRequest(max_tokens=4, messages=[pb.ChatMessage(role="user", content="Hi")],
                                  tools=[pb.Tool(name="f", parameters="{not json")])
    error = raw_generate_error(up, not_json)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not valid JSON" in error.details(), error
    # A well-formed chat on the raw API: its reply carries the calls.
    chat = pb.GenerateRequest(max_tokens=MAX_TOKENS, messages=[pb.ChatMessage(role="user", content=ASK[0]["content"])],
                              tools=[pb.Tool(name="get_time", parameters=json.dumps(TIME["parameters"]))],
                              tool_choice="required")
    last = list(up.stub.Generate(chat, timeout=600))[-1]
    assert last.finish_reason == pb.FINISH_REASON_STOP and len(last.tool_calls) >= 1
    jsonschema.validate(json.loads(last.tool_calls[0].arguments), TIME["parameters"])


def run_cpp(up, spec, *flags):
    done = subprocess.run([str(TOOL), "chat", "--address", up.address, "--request", json.dumps(spec), *flags],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("stream", [False, True], ids=["chat", "stream"])
def test_cpp_sdk_required_and_named_give_valid_calls(up, stream):
    flags = ["--stream"] if stream else []
    for seed, choice in ((0, {"mode": "required"}), (1, {"mode": "function", "function": "get_time"})):
        spec = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": choice, "max_tokens": MAX_TOKENS,
                "temperature": 1.0, "seed": seed, "parallel_tool_calls": False}
        out = run_cpp(up, spec, *flags)
        assert out["code"] == "OK", out
        completion = out["completion"]
        assert completion["finish_reason"] == "stop", completion
        assert len(completion["tool_calls"]) == 1, completion
        call = completion["tool_calls"][0]
        assert call["id"].startswith("call_")
        if choice["mode"] == "function":
            assert call["name"] == "get_time"
        assert call["name"] in SCHEMAS
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        if stream:
            assert out["chunks"] >= 1


def test_cpp_sdk_bad_schema_is_invalid_argument(up):
    spec = {"messages": ASK, "tools": [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}],
            "tool_choice": {"mode": "required"}, "max_tokens": 8}
    out = run_cpp(up, spec)
    assert out["code"] == "INVALID_ARGUMENT" and "'not'" in out["message"], out
