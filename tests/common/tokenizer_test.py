"""Loom's tokenizer against Hugging Face `tokenizers` on SmolLM2's own vocabulary.

The reference is rebuilt from the GGUF (vocabulary, merges, token types) the way
SmolLM2's tokenizer.json defines it: a byte-level BPE model with no unknown token,
pre-tokenizer Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)],
a ByteLevel decoder, and the control tokens as special added tokens. The same recipe
without Digits is first checked against the GPT-2 test data that came from the real
tokenizer, so a mistake in the recipe shows up there rather than as a false pass.
"""
import json
import pathlib
import random
import subprocess

import pytest

from conftest import BUILD_DIR, tool_path
from hf_reference import build_reference


def read_vocab_cases(shared_dir, name):
    base = pathlib.Path(shared_dir) / "testdata" / "tokenizer" / f"ggml-vocab-{name}.gguf"
    inputs = base.with_name(base.name + ".inp").read_text(encoding="utf-8")
    outputs = base.with_name(base.name + ".out").read_text(encoding="utf-8")
    texts = inputs.split("\n__ggml_vocab_test__\n")[:-1]
    ids = [[int(x) for x in line.split()] for line in outputs.split("\n")[:len(texts)]]
    assert len(texts) == len(ids) > 40
    return base, texts, ids


def run_tool(model_path, texts, *flags):
    payload = "".join(json.dumps(text) + "\n" for text in texts)
    result = subprocess.run([str(tool_path("tokenize_tool")), "--model", str(model_path), *flags],
                            input=payload.encode("utf-8"), capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    # Not splitlines(): the JSON may hold raw U+2028 or U+0085, which it would split on.
    lines = result.stdout.decode("utf-8").split("\n")[:-1]
    assert len(lines) == len(texts)
    return [json.loads(line) for line in lines]


# --- the reference itself ---------------------------------------------------------

def test_reference_recipe_reproduces_the_gpt2_test_data(shared_dir):
    path, texts, expected = read_vocab_cases(shared_dir, "gpt-2")
    reference = build_reference(path, individual_digits=False)
    got = [encoding.ids for encoding in reference.encode_batch(texts, add_special_tokens=False)]
    assert got == expected


@pytest.fixture(scope="module")
def reference(model_path):
    return build_reference(model_path, individual_digits=True)


def test_reference_knows_smollm2_basics(reference):
    assert reference.encode("<|im_start|>", add_special_tokens=False).ids == [1]
    assert reference.encode("<|im_end|>", add_special_tokens=False).ids == [2]
    digits = reference.encode("2024", add_special_tokens=False).ids
    assert [reference.decode([i]) for i in digits] == ["2", "0", "2", "4"]
    hello = reference.encode("Hello world", add_special_tokens=False)
    assert hello.tokens == ["Hello", "Ġworld"]
    assert reference.decode(hello.ids) == "Hello world"
    # A space before a word is part of the word's token, runs of spaces keep the last one.
    assert reference.encode("a   b", add_special_tokens=False).tokens == ["a", "ĠĠ", "Ġb"]


# --- generated strings ----------------------------------------------------------

WORDS = {
    "english": ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello",
                "World", "tokenizer", "SERVING", "Model", "don't", "I've", "we'll", "it's",
                "THEY'RE", "o'clock", "rock'n'roll", "naïve", "café", "façade", "résumé"],
    "german": ["Straße", "Größe", "Donaudampfschifffahrtsgesellschaftskapitän", "über", "ÄÖÜ"],
    "cyrillic": ["привет", "мир", "Български", "нещо", "Ёлка", "съобщение"],
    "greek": ["Καλημέρα", "κόσμε", "ΑΒΓΔ", "λόγος"],
    "arabic": ["مرحبا", "بالعالم", "السلام", "عليكم", "١٢٣"],
    "hebrew": ["שלום", "עולם", "תודה"],
    "devanagari": ["नमस्ते", "दुनिया", "हिन्दी", "१२३"],
    "thai": ["สวัสดี", "ชาวโลก", "ภาษาไทย"],
    "khmer": ["កាន់តែពិសេសអាច", "ខ្មែរ"],
    "chinese": ["你好", "世界", "我想在apple工作", "天～", "中文分词", "。", "，"],
    "japanese": ["こんにちは", "カタカナ", "日本語", "ｶﾀｶﾅ", "ー"],
    "korean": ["안녕하세요", "세계", "한국어"],
    "vietnamese": ["Cửa", "Việt", "Tiếng", "Nguyễn"],
    "emoji": ["😀", "🚀", "🦙🦙", "😶\u200d🌫️", "👩\u200d💻", "👨\u200d👩\u200d👧\u200d👦",
              "👍🏽", "🇫🇷", "🏳️\u200d🌈", "❤️", "✅", "🤖", "🧑🏿\u200d🚀"],
    "symbols": ["∑", "∫", "√", "≤", "≥", "→", "€", "£", "¥", "©", "®", "™", "°", "±", "½",
                "…", "—", "–", "«", "»", "„", "“", "”", "‘", "’", "•", "§", "¶"],
    "code": ["def", "return", "self.x", "x += 1;", "std::vector<int>", "{\"key\": [1, 2]}",
             "#include <stdio.h>", "if (a && b) {", "}", "=>", "!==", "0x1F", "lambda x: x**2",
             "SELECT * FROM t;", "</div>", "<br/>", "```", "__init__", "$HOME", "@decorator"],
    "special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>",
                "<|im_start", "im_end|>", "<|", "|>", "<jupyter_code>", "<empty_output>"],
}

WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n", "\n ",
              "    ", "\u00a0", "\u3000", "\u2009", "\u0085", " \t \n", "\u2028"]

PUNCTUATION = [".", ",", "!", "?", "...", ";", ":", "'", "\"", "(", ")", "[", "]", "-", "--",
               "!!!!!!", "??", "'''", "=======", "------"]


def random_number(rng):
    kind = rng.randrange(7)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 12)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 6)}f}"
    if kind == 2:
        return f"{rng.randrange(10**9):,}"
    if kind == 3:
        return hex(rng.randrange(2**32))
    if kind == 4:
        return f"+1 ({rng.randrange(100, 999)}) {rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}"
    if kind == 5:
        return f"{rng.randrange(1, 28)}/{rng.randrange(1, 12)}/{rng.randrange(1900, 2100)}"
    return "".join(rng.choice("0123456789٠١٢٣४५६") for _ in range(rng.randrange(1, 8)))


# Blocks whose letters, marks and digits have been assigned for many Unicode versions,
# so that PCRE2's and Oniguruma's tables agree on them.
CODE_POINT_RANGES = [(0x20, 0x7E), (0xA1, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF),
                     (0x5D0, 0x5EA), (0x620, 0x64A), (0x900, 0x97F), (0xE01, 0xE5B),
                     (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3),
                     (0x2000, 0x206F), (0x2190, 0x21FF), (0x2200, 0x22FF), (0x1F300, 0x1F64F),
                     (0xFF01, 0xFF5E)]


def random_code_points(rng):
    out = []
    for _ in range(rng.randrange(1, 30)):
        low, high = rng.choice(CODE_POINT_RANGES)
        out.append(chr(rng.randint(low, high)))
    return "".join(out)


def random_fragment(rng):
    kind = rng.randrange(10)
    if kind < 5:
        return rng.choice(WORDS[rng.choice(list(WORDS))])
    if kind == 5:
        return random_number(rng)
    if kind == 6:
        return rng.choice(WHITESPACE)
    if kind == 7:
        return rng.choice(PUNCTUATION)
    if kind == 8:
        return random_code_points(rng)
    return rng.choice(["a" * rng.randrange(40, 300), "ab" * rng.randrange(30, 100),
                       " " * rng.randrange(50, 400), "\n" * rng.randrange(2, 60),
                       "https://example.com/" + "x" * rng.randrange(30, 90) + "?q=1&r=2",
                       "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo" * rng.randrange(1, 5)])


def generated_strings(count, seed=20240611):
    rng = random.Random(seed)
    texts = []
    for i in range(count):
        fragments = [random_fragment(rng) for _ in range(rng.randrange(1, 25))]
        joiner = rng.choice(["", " ", " ", " ", "\n", rng.choice(WHITESPACE)])
        text = joiner.join(fragments)
        if i % 7 == 0:
            text = " " + text
        if i % 11 == 0:
            text += rng.choice(WHITESPACE)
        texts.append(text)
    # Fixed cases worth keeping whatever the seed does.
    texts += ["", " ", "\n", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
              "<|im_start|><|im_end|><|endoftext|>", "<<|im_start|>>", "Hello world",
              " Hello world", "3.14159 2,718 1e-9 007", "I've   been\t\t'told' he's",
              "\u00a0\u00a0x", "x\u0085\u0085y", "a\u3000\u3000b", "\n\n\n\n \n",
              "🧑🏿‍🚀🧑🏿‍🚀🧑🏿‍🚀", "ǅungla ǈudevit", "ﬁnancial ﬂow", "e\u0301cole"]
    return texts


@pytest.fixture(scope="module")
def strings():
    texts = generated_strings(2000)
    assert len(texts) >= 1000
    return texts


def first_mismatches(texts, got, expected, limit=5):
    report = []
    for text, ids, want in zip(texts, got, expected):
        if ids != want:
            report.append(f"{text!r}\n  loom {ids}\n  hf   {want}")
            if len(report) == limit:
                break
    return "\n".join(report)


def test_encode_matches_hugging_face_on_generated_strings(model_path, reference, strings):
    expected = [e.ids for e in reference.encode_batch(strings, add_special_tokens=False)]
    got = [row["ids"] for row in run_tool(model_path, strings)]
    mismatched = sum(1 for a, b in zip(got, expected) if a != b)
    assert mismatched == 0, (f"{mismatched} of {len(strings)} strings differ:\n"
                             + first_mismatches(strings, got, expected))


def test_special_tokens_stay_text_without_parse_special(model_path, reference, strings):
    texts = [t for t in strings if "<|" in t or "<repo" in t][:200]
    assert texts
    got = [row["ids"] for row in run_tool(model_path, texts, "--no-parse-special")]
    # Hugging Face's split_special_tokens=True is the same thing as not parsing them.
    plain = build_reference(model_path, individual_digits=True)
    plain.encode_special_tokens = True
    expected = [e.ids for e in plain.encode_batch(texts, add_special_tokens=False)]
    assert got == expected, first_mismatches(texts, got, expected)


def test_decode_gives_back_every_generated_string(model_path, reference, strings):
    rows = run_tool(model_path, strings)
    wrong = [(text, row["decoded"]) for text, row in zip(strings, rows) if row["decoded"] != text]
    assert not wrong, f"{len(wrong)} round trips differ, first: {wrong[0]!r}"
    # And the reference decodes our ids to the same text.
    sample = list(zip(strings, rows))[:300]
    assert all(reference.decode(row["ids"], skip_special_tokens=False) == text
               for text, row in sample)


# --- the command line -----------------------------------------------------------

def loom_binary():
    path = BUILD_DIR / "coordinator" / "loom"
    if not path.exists():
        pytest.fail(f"{path} is missing: build the `loom` target first")
    return path


def test_cli_tokenize_and_detokenize_round_trip(model_path, reference):
    text = "<|im_start|>user\nWhat is 12+30?<|im_end|>"
    result = subprocess.run([str(loom_binary()), "tokenize", "--model", str(model_path), text],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ids = [int(x) for x in result.stdout.split()]
    assert ids == reference.encode(text, add_special_tokens=False).ids
    back = subprocess.run([str(loom_binary()), "detokenize", "--model", str(model_path),
                           *map(str, ids)], capture_output=True, text=True, timeout=120)
    assert back.returncode == 0, back.stderr
    assert back.stdout == text + "\n"


def test_cli_no_parse_special_keeps_markers_as_text(model_path):
    result = subprocess.run([str(loom_binary()), "tokenize", "--model", str(model_path),
                             "--no-parse-special", "<|im_end|>"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "2" not in result.stdout.split()
    assert len(result.stdout.split()) > 1


def test_cli_rejects_bad_arguments_with_usage_and_exit_2(model_path):
    for args in (["tokenize"], ["tokenize", "--model", str(model_path)],
                 ["tokenize", "--model", str(model_path), "--bogus", "x"],
                 ["detokenize", "--model", str(model_path), "12", "abc"]):
        result = subprocess.run([str(loom_binary()), *args], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2, args
        assert "usage" in result.stderr


def test_cli_reports_errors_with_exit_1(model_path, tmp_path):
    missing = subprocess.run([str(loom_binary()), "tokenize", "--model", str(tmp_path / "no.gguf"),
                              "hi"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and missing.stderr
    out_of_range = subprocess.run([str(loom_binary()), "detokenize", "--model", str(model_path),
                                   "999999"], capture_output=True, text=True, timeout=120)
    assert out_of_range.returncode == 1 and "999999" in out_of_range.stderr
