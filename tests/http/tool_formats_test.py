"""Tool-call formats beyond Hermes, Llama 3 JSON and Mistral, end to end with the official
`openai` client: `loom serve --chat-template` with a template in Qwen3-Coder's XML style,
one in GLM-4.5's, one in Llama's pythonic style and one in gpt-oss's harmony channels, on the
default model.

The format is chosen from the template, as for a model that ships it. The default model
does not call tools, so a regex constraint makes it write a call in the template's format;
the reply must come back as `tool_calls` (whole and streamed) with the arguments as JSON,
and a forced call (tool_choice "required") must still parse.
"""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

CHATML = ("{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
          "{% endfor %}<|im_start|>assistant\n")
FORMATS = {
    "qwen3_coder": (
        "{%- if tools %}<|im_start|>system\nYou may call these tools: {{ tools | tojson }}\n"
        "Call one as <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>\n{% endif %}" + CHATML,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n[A-Z][a-z]{2,8}\n</parameter>\n"
        "<parameter=days>\n[1-9]\n</parameter>\n</function>\n</tool_call>"),
    # GLM-4.5: the city written as a postal code must stay a string (the tool declares it
    # one) though its text reads as a number.
    "glm45": (
        "{%- if tools %}<|im_start|>system\nYou may call these tools: {{ tools | tojson }}\n"
        "Call one as <tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n"
        "</tool_call><|im_end|>\n{% endif %}" + CHATML,
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>7500[1-9]</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>[1-9]</arg_value>\n</tool_call>"),
    "pythonic": (
        "{%- if tools %}<|im_start|>system\nYou may call these tools: {{ tools | tojson }}\n"
        "Reply with [func_name1(params_name1=params_value1), func_name2(params)]<|im_end|>\n{% endif %}" + CHATML,
        '\\[get_weather\\(city="[A-Z][a-z]{2,8}", days=[1-9]\\)\\]'),
    # gpt-oss (harmony): reasoning in the analysis channel, then a message to the function.
    "gpt_oss": (
        "{%- if tools %}<|start|>developer<|message|># Tools\n{{ tools | tojson }}\nCall one as "
        "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGUMENTS<|call|><|end|>{% endif %}"
        "{%- for message in messages %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>"
        "{% endfor %}<|start|>assistant",
        r"<\|channel\|>analysis<\|message\|>[a-z ]{3,20}<\|end\|><\|start\|>assistant<\|channel\|>commentary "
        r'to=functions\.get_weather <\|constrain\|>json<\|message\|>\{"city": "[A-Z][a-z]{2,8}", "days": [1-9]\}'
        r"<\|call\|>"),
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}]
MESSAGES = [{"role": "user", "content": "What will the weather be in Paris?"}]


@pytest.fixture(scope="module", params=sorted(FORMATS))
def served(request, tmp_path_factory):
    directory = h.cluster_log_dir(tmp_path_factory, request.param)
    template = directory / "template.jinja"
    template.write_text(FORMATS[request.param][0])
    # --stream-interval-ms 0: each write sends what was generated since the last one, so
    # replies mostly stream token by token (with the default interval a fast machine would
    # batch the whole short reasoning into one chunk); under load they may still batch.
    with h.running_cluster(directory, {"r0": {"threads": 2}}, chat_template=template,
                           stream_interval_ms=0) as rig:
        import openai
        client = openai.OpenAI(base_url=rig.coordinator.http_url + "/v1", api_key="unused",
                               max_retries=0, timeout=600.0)
        yield request.param, rig, client, client.models.list().data[0].id


def check_arguments(arguments: str):
    parsed = json.loads(arguments)
    assert set(parsed) == {"city", "days"}, parsed
    assert isinstance(parsed["city"], str) and isinstance(parsed["days"], int), parsed


def test_the_template_renders_the_tools(served):
    name, rig, _, model = served
    status, tokens = h.post_json(rig.coordinator.http_url + "/tokenize",
                                 {"model": model, "messages": MESSAGES, "tools": TOOLS})
    assert status == 200, tokens
    status, text = h.post_json(rig.coordinator.http_url + "/detokenize", {"model": model, "tokens": tokens["tokens"]})
    assert '"name": "get_weather"' in text["prompt"] or '"name":"get_weather"' in text["prompt"], text


def test_a_call_in_the_templates_format_is_tool_calls(served):
    name, _, client, model = served
    regex = FORMATS[name][1]
    response = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, temperature=0,
                                              max_tokens=160, extra_body={"guided_regex": regex})
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    check_arguments(call.function.arguments)

    names, arguments, finish, content = [], {}, None, ""
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, temperature=0,
                                                max_tokens=160, stream=True, extra_body={"guided_regex": regex}):
        for streamed in chunk.choices:
            content += streamed.delta.content or ""
            for delta in streamed.delta.tool_calls or []:
                if delta.function.name:
                    names.append(delta.function.name)
                arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
            finish = streamed.finish_reason or finish
    assert (names, finish, content) == (["get_weather"], "tool_calls", "")
    assert arguments[0] == call.function.arguments


def test_a_forced_call_parses(served):
    _, _, client, model = served
    response = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                              parallel_tool_calls=False,
                                              temperature=0, max_tokens=160)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    parsed = json.loads(call.function.arguments)
    assert isinstance(parsed["city"], str) and isinstance(parsed["days"], int), parsed


def test_gpt_oss_channels_are_reasoning_and_content(served):
    name, _, client, model = served
    if name != "gpt_oss":
        pytest.skip("harmony channels are gpt-oss's")
    regex = (r"<\|channel\|>analysis<\|message\|>[a-z ]{3,20}<\|end\|><\|start\|>assistant"
             r"<\|channel\|>final<\|message\|>It is [a-z]{3,8}\.")
    kwargs = dict(model=model, messages=MESSAGES, temperature=0, max_tokens=160, extra_body={"guided_regex": regex})
    for tools in ({}, {"tools": TOOLS}):  # the channels are split with and without tools
        message = client.chat.completions.create(**kwargs, **tools).choices[0].message
        assert message.content.startswith("It is ") and "<|" not in message.content, message
        reasoning = message.model_extra["reasoning_content"]
        assert reasoning and "<|" not in reasoning and not message.tool_calls, message
        content, streamed_reasoning, pieces = "", "", 0
        for chunk in client.chat.completions.create(stream=True, **kwargs, **tools):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                part = (choice.delta.model_extra or {}).get("reasoning_content") or ""
                streamed_reasoning += part
                pieces += bool(part)
        assert (content, streamed_reasoning) == (message.content, reasoning)
        # How many pieces it comes in depends on the machine: the server writes what has been
        # generated when it gets to write, and under load (a full ctest run) the whole short
        # reasoning has come in one piece even with --stream-interval-ms 0.
        assert pieces >= 1
