"""Loom's chat-template interpreter against Python's jinja2, configured as Hugging Face
transformers does for apply_chat_template: byte-identical text, and an error exactly when
jinja2 raises. One driver process renders all conversations of a template."""
import datetime
import functools
import json
import subprocess

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import SHARED_DIR, tool_path

TEMPLATE_DIR = SHARED_DIR / "testdata" / "chat_templates"

# (bos_token, eos_token) as each model's tokenizer sets them; None = not passed.
SPECIAL_TOKENS = {
    "Qwen-Qwen2.5-7B-Instruct": (None, "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
}


def hf_environment() -> ImmutableSandboxedEnvironment:
    """transformers' _compile_jinja_template."""

    def raise_exception(message):
        raise ValueError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


def system(content):
    return {"role": "system", "content": content}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city, in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}

TOOL_CALL = {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}

CONVERSATIONS = {
    "single_turn": [user("Hello!")],
    "system_single": [system("You are terse."), user("Hi there")],
    "multi_turn": [user("What is 2+2?"), assistant("4."), user("And 3+3?")],
    "system_multi_turn": [system("Be kind."), user("a"), assistant("b"), user("c"),
                          assistant("d"), user("e")],
    "assistant_last": [user("Tell me a joke."), assistant("Why did the chicken cross the road?")],
    "system_assistant_last": [system("sys"), user("q"), assistant("a")],
    "unicode": [system("Réponds en français 🇫🇷"), user("日本語で答えて: naïve café 👋🏽 עברית"),
                assistant("はい、わかりました。Ωμέγα — “quotes” …"), user("Ünïcödé ñ ß ǅ")],
    "braces_quotes_newlines": [user("{{ not a tag }} {% if %} {# nor this #} 'single' \"double\""),
                               assistant("line1\nline2\n\n  indented\ttab \\ backslash\r\n"),
                               user("  padded with spaces and newlines \n\n")],
    "empty_content": [user("")],
    "whitespace_only": [user(" \n\t ")],
    "think_tags": [user("Solve it"), assistant("<think>reasoning here</think>The answer is 42."),
                   user("Thanks")],
    "user_user": [user("first"), user("second")],
    "assistant_first": [assistant("I start."), user("ok")],
    "system_only": [system("Only a system prompt.")],
    "no_messages": [],
    "double_system": [system("one"), system("two"), user("hi")],
    "tool_round_trip": [user("Weather in Zürich?"),
                        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                        {"role": "tool", "content": "{\"temperature\": 21}", "tool_call_id": "call12345",
                         "name": "get_weather"},
                        assistant("It is 21 °C.")],
    "tool_string_arguments": [user("Weather?"),
                              {"role": "assistant", "content": None, "tool_calls": [
                                  {"id": "abcdefghi", "type": "function",
                                   "function": {"name": "get_weather",
                                                "arguments": "{\"city\": \"Paris\"}"}}]},
                              {"role": "tool", "content": "sunny", "tool_call_id": "abcdefghi"}],
}


def contexts_for(name: str):
    bos, eos = SPECIAL_TOKENS.get(name, (None, None))
    specials = {}
    if bos is not None:
        specials["bos_token"] = bos
    if eos is not None:
        specials["eos_token"] = eos
    cases = []
    for conversation, messages in CONVERSATIONS.items():
        for add_generation_prompt in (True, False):
            cases.append((f"{conversation}/agp={add_generation_prompt}",
                          {"messages": messages, "add_generation_prompt": add_generation_prompt,
                           **specials}))
    # Tool definitions, as apply_chat_template(tools=...) passes them.
    for conversation in ("single_turn", "system_multi_turn", "tool_round_trip"):
        cases.append((f"{conversation}/tools", {"messages": CONVERSATIONS[conversation],
                                                "tools": [WEATHER_TOOL],
                                                "add_generation_prompt": True, **specials}))
    cases.append(("llama_builtin_tools", {"messages": CONVERSATIONS["system_single"],
                                          "builtin_tools": ["brave_search", "code_interpreter",
                                                            "wolfram_alpha"],
                                          "tools": [WEATHER_TOOL], "tools_in_user_message": False,
                                          "date_string": "01 Jan 2025",
                                          "add_generation_prompt": True, **specials}))
    cases.append(("no_add_generation_prompt_variable", {"messages": CONVERSATIONS["multi_turn"],
                                                        **specials}))
    return cases


def smollm2_template(model_path) -> str:
    from gguf import GGUFReader
    field = GGUFReader(str(model_path)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


@functools.lru_cache(maxsize=None)
def template_sources(model_path):
    sources = {path.stem: path.read_text(encoding="utf-8")
               for path in sorted(TEMPLATE_DIR.glob("*.jinja"))}
    sources["SmolLM2-135M-Instruct"] = smollm2_template(model_path)
    return sources


TEMPLATE_NAMES = sorted(path.stem for path in TEMPLATE_DIR.glob("*.jinja")) + [
    "SmolLM2-135M-Instruct"]
SPECIAL_TOKENS["SmolLM2-135M-Instruct"] = ("<|im_start|>", "<|im_end|>")


def reference(env, source, context):
    try:
        return {"text": env.from_string(source).render(**context)}
    except Exception as error:  # noqa: BLE001 - any jinja2 failure is an expected error
        return {"error": f"{type(error).__name__}: {error}"}


def run_tool(template_file, contexts):
    stdin = "".join(json.dumps(context, ensure_ascii=False) + "\n" for context in contexts)
    result = subprocess.run([str(tool_path("chat_template_tool")), str(template_file)],
                            input=stdin.encode("utf-8"), capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode("utf-8").splitlines()
    assert len(lines) == len(contexts)
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_renders_byte_identical_to_jinja2(name, model_path, tmp_path):
    source = template_sources(model_path)[name]
    template_file = tmp_path / "template.jinja"
    template_file.write_bytes(source.encode("utf-8"))
    cases = contexts_for(name)
    env = hf_environment()
    expected = [reference(env, source, context) for _, context in cases]
    actual = run_tool(template_file, [context for _, context in cases])
    failures = []
    for (case, _), want, got in zip(cases, expected, actual):
        if "error" in want:
            if "error" not in got:
                failures.append(f"{case}: jinja2 raised {want['error']!r}, Loom rendered "
                                f"{got.get('text')!r}")
            elif want["error"].startswith("ValueError: ") and \
                    got["error"] != want["error"][len("ValueError: "):]:
                failures.append(f"{case}: raise_exception message {got['error']!r} != "
                                f"{want['error']!r}")
        elif got.get("text") != want["text"]:
            failures.append(f"{case}:\n  jinja2: {want['text']!r}\n  Loom:   {got!r}")
    assert not failures, f"{len(failures)}/{len(cases)} cases differ:\n" + "\n".join(failures)
    # The conversations must exercise the template, not only its error paths.
    assert sum("text" in want for want in expected) >= len(cases) // 3


def test_every_shared_template_is_covered():
    assert len(TEMPLATE_NAMES) >= 7
