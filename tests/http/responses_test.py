"""POST /v1/responses through the official `openai` client (`client.responses.create`), on one
`loom serve` with one CPU worker running the default model: the documented subset
(api/responses_api.h) answers whole and streamed with the text the chat completions API gives
the same conversation; structured output through `text.format`; max_output_tokens cut short
is `incomplete`; function tools (a forced call as a function_call item, whole and with its
arguments streamed, and a call and its output as input); what the subset does not take is a
400 naming the field.
"""
import json

import jsonschema
import openai
import pytest

MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Name a color."}]


def test_whole_response_equals_the_chat_completion(client, model):
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0)
    response = client.responses.create(model=model, instructions="You answer briefly.", input="Name a color.",
                                       max_output_tokens=12, temperature=0)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens
    expected_status = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    assert response.status == expected_status
    # Message items as input: the same conversation.
    items = client.responses.create(model=model, input=[
        {"role": "developer", "content": "You answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}],
        max_output_tokens=12, temperature=0)
    assert items.output_text == response.output_text


def test_streamed_events_join_to_the_whole_text(client, model):
    whole = client.responses.create(model=model, input="Count to five.", max_output_tokens=16, temperature=0)
    events = list(client.responses.create(model=model, input="Count to five.", max_output_tokens=16,
                                          temperature=0, stream=True))
    types = [event.type for event in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens


def test_text_format_json_schema_and_incomplete(client, model):
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    response = client.responses.create(model=model, input="Pick a color.", temperature=1.0,
                                       text={"format": {"type": "json_schema", "name": "pick", "schema": schema,
                                                        "strict": True}}, max_output_tokens=32)
    assert json.loads(response.output_text)["color"] in ("red", "green", "blue")
    cut = client.responses.create(model=model, input="Tell me a long story.", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_reasoning_effort_is_taken(client, model):
    response = client.responses.create(model=model, input="Hi.", reasoning={"effort": "low"},
                                       max_output_tokens=4)
    assert response.status in ("completed", "incomplete") and response.output_text, response


@pytest.mark.parametrize("kwargs, param", [
    (dict(input="x", tools=[{"type": "web_search"}]), "tools"),
    (dict(input="x", previous_response_id="resp_123"), "previous_response_id"),
    (dict(input=[{"type": "function_call_output", "call_id": "c"}]), "input"),
    (dict(input=[{"type": "reasoning", "summary": []}]), "input"),
    (dict(input=[]), "input"),
    (dict(input="x", temperature=-1), "temperature"),
    (dict(input="x", text={"format": {"type": "xml"}}), "text"),
    (dict(input="x", text={"format": {"type": "json_schema", "name": "x"}}), "text"),  # no schema
    (dict(input="x", max_output_tokens=0), "max_output_tokens"),
    # Fields of the wrong type: 400s naming them, not 500s.
    (dict(input="x", text={"format": {"type": "json_schema", "name": 7, "schema": {}}}), "text.format"),
    (dict(input="x", text={"format": {"type": ["json_object"]}}), "text.format"),
    (dict(input="x", tools=[{"type": 3, "name": "f"}]), "tools"),
    (dict(input="x", text="hello"), "text"),
    (dict(input="x", text={"format": "json_object"}), "text.format"),
    (dict(input=[{"type": 5, "role": "user", "content": "hi"}]), "input"),
    (dict(input=[{"role": "user", "content": [{"type": None, "text": "hi"}]}]), "input"),
    # reasoning: {effort} is the chat's reasoning_effort, checked there.
    (dict(input="x", reasoning="high"), "reasoning"),
    (dict(input="x", reasoning={"effort": "extreme"}), "reasoning_effort"),
])
def test_what_the_subset_does_not_take_is_400(client, model, kwargs, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=model, **kwargs)
    assert raised.value.body["param"] == param, raised.value.body


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                          "required": ["city"]}}


def test_function_tools_whole_streamed_and_as_input(client, model):
    kwargs = dict(model=model, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                  parallel_tool_calls=False, temperature=1.0, max_output_tokens=120)
    response = client.responses.create(extra_body={"seed": 1}, **kwargs)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_"), response
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    assert response.tools[0].name == "get_weather"

    events = list(client.responses.create(extra_body={"seed": 1}, stream=True, **kwargs))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) > 1 and "".join(deltas) == done.arguments == calls[0].arguments
    final = [e for e in events if e.type == "response.completed"][0].response
    assert [item.arguments for item in final.output if item.type == "function_call"] == [done.arguments]
    # The same items as the whole response (no empty message beside the call), each event
    # at its item's index.
    assert [item.type for item in final.output] == [item.type for item in response.output] == ["function_call"]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "function_call")]
    assert {e.output_index for e in events if hasattr(e, "output_index")} == {0}

    # The call and its result as input: the conversation goes on in text.
    follow = client.responses.create(model=model, tools=[WEATHER], max_output_tokens=16, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C and sunny"}],
        tool_choice="none")
    assert follow.output[0].type == "message" and follow.output_text
