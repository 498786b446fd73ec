"""Reasoning models through the official `openai` client: `loom serve --chat-template FILE
--reasoning-parser qwen3` on the default model, with a Qwen3-style template that opens the
reply's thinking (`<think>`) unless `chat_template_kwargs.enable_thinking` is false.

The default model does not think, so a regex constraint makes its reply have the shape a
reasoning model's has (`words</think>Answer`): the split into `reasoning_content` and
`content` is then checked whole and streamed, with thinking on and off, cut short by
max_tokens, and alongside bad kwargs and bad flags.
"""
import pathlib
import re
import subprocess
import sys

import openai
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "cluster"))
import cluster_harness as h  # noqa: E402

TEMPLATE = (
    "{%- if reasoning_effort is defined %}<|im_start|>system\nReasoning: {{ reasoning_effort }}"
    "<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
    "{% endif %}")
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
# A reasoning model's reply: thoughts, the closing tag, the answer.
SHAPE = {"guided_regex": "[a-z]{2,8}( [a-z]{2,8}){1,3}</think>[A-Z][a-z]{2,8}"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    directory = h.cluster_log_dir(tmp_path_factory, "reasoning")
    template = directory / "qwen3_style.jinja"
    template.write_text(TEMPLATE)
    with h.running_cluster(directory, {"r0": {"threads": 2}}, chat_template=template,
                           reasoning_parser="qwen3") as rig:
        yield rig


def chat(client, model, **kwargs):
    extra = dict(SHAPE)
    extra.update(kwargs.pop("extra_body", {}))
    kwargs.setdefault("max_tokens", 60)
    return client.chat.completions.create(model=model, messages=MESSAGES, temperature=0,
                                          extra_body=extra, **kwargs)


def streamed(client, model, **kwargs):
    reasoning, content, finish = [], [], None
    for chunk in chat(client, model, stream=True, **kwargs):
        for choice in chunk.choices:
            delta = choice.delta
            reasoning.append(getattr(delta, "reasoning_content", None) or "")
            content.append(delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(reasoning), "".join(content), finish


def rendered(rig, model, **body):
    """The chat prompt /tokenize renders for MESSAGES and `body`'s fields, as text."""
    base = rig.coordinator.http_url
    status, tokens = h.post_json(base + "/tokenize", {"model": model, "messages": MESSAGES, **body})
    assert status == 200, tokens
    status, text = h.post_json(base + "/detokenize", {"model": model, "tokens": tokens["tokens"]})
    assert status == 200, text
    return text["prompt"]


def test_chat_template_kwargs_reach_the_template(rig, model):
    assert rendered(rig, model).endswith("<|im_start|>assistant\n<think>\n")
    assert rendered(rig, model, chat_template_kwargs={"enable_thinking": True}).endswith("assistant\n<think>\n")
    assert rendered(rig, model, chat_template_kwargs={"enable_thinking": False}).endswith("<think>\n\n</think>\n\n")


def test_reasoning_effort_reaches_the_template(rig, client, model):
    """OpenAI's reasoning_effort is the template's variable (gpt-oss's harmony template says
    it in its system message); chat_template_kwargs override it, as in vLLM; a value outside
    OpenAI's four is refused by name."""
    assert "Reasoning:" not in rendered(rig, model)
    assert rendered(rig, model, reasoning_effort="high").startswith("<|im_start|>system\nReasoning: high<|im_end|>")
    assert "Reasoning: low<" in rendered(rig, model, reasoning_effort="high",
                                         chat_template_kwargs={"reasoning_effort": "low"})
    assert "Reasoning: medium<" in rendered(rig, model, chat_template_kwargs={"reasoning_effort": "medium"})
    for bad in ("extreme", 3):
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2,
                                           extra_body={"reasoning_effort": bad})
        assert error.value.body["param"] == "reasoning_effort", error.value.body


def test_thinking_is_reasoning_content_whole_and_streamed(client, model):
    message = chat(client, model).choices[0].message
    reasoning = getattr(message, "reasoning_content", None)
    assert re.fullmatch(r"[a-z]{2,8}( [a-z]{2,8}){1,3}", reasoning or ""), message
    assert re.fullmatch(r"[A-Z][a-z]{2,8}", message.content or ""), message
    assert streamed(client, model) == (reasoning, message.content, "stop")


def test_thinking_off_leaves_everything_content(client, model):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    message = chat(client, model, extra_body=off).choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    # The reply did not open a thinking block, so its literal tag is content.
    assert re.fullmatch(r"[a-z]{2,8}( [a-z]{2,8}){1,3}</think>[A-Z][a-z]{2,8}", message.content), message
    assert streamed(client, model, extra_body=off) == ("", message.content, "stop")


def test_a_reply_cut_off_while_thinking_is_all_reasoning(client, model):
    response = chat(client, model, max_tokens=3)
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "length"
    assert getattr(message, "reasoning_content", None), message
    assert message.content is None
    reasoning, content, finish = streamed(client, model, max_tokens=3)
    assert (reasoning, content, finish) == (message.reasoning_content, "", "length")


def grpc_chat(rig, **fields):
    """MESSAGES over gRPC (GenerateRequest.messages), constrained to SHAPE: the last message."""
    request = h.make_request("", max_tokens=60, temperature=0)
    request.ClearField("text")
    request.messages.add(role="user", content=MESSAGES[0]["content"])
    request.sampling.grammar.kind = "regex"
    request.sampling.grammar.text = SHAPE["guided_regex"]
    for field, value in fields.items():
        setattr(request, field, value)
    responses = list(rig.coordinator.stub.Generate(request, timeout=120))
    return responses[-1]


def test_grpc_chat_splits_the_reasoning_as_http_does(rig, client, model):
    """The same chat over gRPC: the last message carries `reasoning_content` and `content` as
    /v1/chat/completions splits them; thinking off (chat_template_kwargs as JSON text) leaves
    no reasoning, the literal tag in the content."""
    message = chat(client, model).choices[0].message
    last = grpc_chat(rig)
    assert last.HasField("reasoning_content")
    assert (last.reasoning_content, last.content) == (message.reasoning_content, message.content)
    off = grpc_chat(rig, chat_template_kwargs='{"enable_thinking": false}')
    assert not off.HasField("reasoning_content")
    assert re.fullmatch(r"[a-z]{2,8}( [a-z]{2,8}){1,3}</think>[A-Z][a-z]{2,8}", off.content), off


@pytest.mark.parametrize("kwargs", [5, "enable_thinking", {"messages": []}, {"tools": []}])
def test_bad_chat_template_kwargs_are_400(client, model, kwargs):
    with pytest.raises(openai.BadRequestError) as raised:
        chat(client, model, extra_body={"chat_template_kwargs": kwargs})
    assert raised.value.body["param"] == "chat_template_kwargs", raised.value.body


@pytest.mark.parametrize("flags, message", [
    (["--reasoning-parser", "granite"], "deepseek_r1, qwen3 or glm45"),
    (["--chat-template", "/nonexistent/template.jinja"], "--chat-template: cannot read"),
    (["--chat-template", "{% for x in %}"], "--chat-template: not a template"),
])
def test_bad_flags_stop_the_server_with_the_reason(tmp_path, flags, message):
    done = subprocess.run([str(h.LOOM_BIN), "serve", "--model", str(h.MODEL_PATH), "--grpc-port", "0",
                           "--port", "0", *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
