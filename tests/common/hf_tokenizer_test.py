"""tokenizer.json pre-tokenizers and normalizers beyond the SmolLM2 directory's: Loom loaded
from a Hugging Face directory tokenizes 1,000 generated strings exactly as `tokenizers` does
with the same tokenizer.json.

Each case writes the SmolLM2 directory's tokenizer.json with another pre_tokenizer or
normalizer (the vocabulary and merges stay SmolLM2's, so BPE runs on every piece the split
produces): the GPT-2, Llama 3, Qwen2/Qwen3, Mistral-Nemo (Tekken) and DeepSeek-V3 Split
regexes, StarCoder/SmolLM's Digits, every Split behavior (isolated, removed,
merged_with_previous, merged_with_next, contiguous) with and without `invert`, String
patterns, and the NFC/NFD/NFKC/NFKD normalizers on strings with combining characters.
"""
import json
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import hf_checkpoint  # noqa: E402
import tokenizer_test  # noqa: E402

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_V3 = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def split(pattern, behavior="Isolated", invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern},
            "behavior": behavior, "invert": invert}


def byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def sequence(*steps):
    return {"type": "Sequence", "pretokenizers": list(steps)}


PRE_TOKENIZERS = {
    "gpt2": byte_level(True),
    "llama3": sequence(split(LLAMA3), byte_level(False)),
    "qwen2_qwen3": sequence(split(QWEN2), byte_level(False)),
    "tekken": sequence(split(TEKKEN), byte_level(False)),
    "deepseek_v3": sequence(*[split(p) for p in DEEPSEEK_V3], byte_level(False)),
    "starcoder_digits": sequence({"type": "Digits", "individual_digits": True}, byte_level(True)),
    "digit_runs": sequence({"type": "Digits", "individual_digits": False}, byte_level(True)),
    "removed_spaces": sequence(split(" ", "Removed", literal=True), byte_level(True)),
    "merged_with_previous": sequence(split(r"\p{P}", "MergedWithPrevious"), byte_level(True)),
    "merged_with_next": sequence(split(r"\s+", "MergedWithNext"), byte_level(False)),
    "contiguous": sequence(split(r"[aeiou]", "Contiguous"), byte_level(True)),
    "inverted_isolated": sequence(split(r"\p{L}+", "Isolated", invert=True), byte_level(False)),
    "inverted_removed": sequence(split(r"\p{L}+|\p{N}+", "Removed", invert=True), byte_level(False)),
    "inverted_merged": sequence(split(r"\s", "MergedWithPrevious", invert=True), byte_level(True)),
}

NORMALIZERS = ["NFC", "NFD", "NFKC", "NFKD"]

# Combining sequences, precomposed letters, compatibility characters and Hangul.
COMBINING = ["e\u0301", "E\u0300", "a\u030a", "\u00c5", "A\u030a", "o\u0308\u0304", "\u1e9b\u0323",
             "\u0071\u0307\u0323", "\ufb01", "\u2460", "\u00bd", "\uff21", "\u1100\u1161\u11a8",
             "\uac01", "\u0958", "\u212b", "\u2126", "n\u0303o", "\u0344", "\u3300", "x\u0338"]


def combining_strings(count, seed=7):
    import random
    rng = random.Random(seed)
    base = tokenizer_test.generated_strings(count)
    out = []
    for text in base:
        pieces = list(text)
        for _ in range(rng.randrange(1, 6)):
            pieces.insert(rng.randrange(len(pieces) + 1), rng.choice(COMBINING))
        out.append("".join(pieces))
    return out


@pytest.fixture(scope="module")
def smollm_dir(tmp_path_factory, model_path):
    return hf_checkpoint.write_hf_directory(model_path, tmp_path_factory.mktemp("hf_tok") / "base",
                                            dtype="bfloat16")


def variant(base, target, **changes):
    """A copy of `base` (weights symlinked) whose tokenizer.json has `changes` applied."""
    target.mkdir()
    for item in base.iterdir():
        if item.name == "tokenizer.json":
            continue
        (target / item.name).symlink_to(item)
    tokenizer = json.loads((base / "tokenizer.json").read_text())
    tokenizer.update(changes)
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    return target


def expect_same_tokens(directory, texts):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(directory / "tokenizer.json"))
    expected = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    got = [row["ids"] for row in tokenizer_test.run_tool(directory, texts)]
    assert got == expected, tokenizer_test.first_mismatches(texts, got, expected)


@pytest.mark.parametrize("name", PRE_TOKENIZERS)
def test_pre_tokenizer_matches_tokenizers_on_1000_strings(smollm_dir, tmp_path, name):
    directory = variant(smollm_dir, tmp_path / name, pre_tokenizer=PRE_TOKENIZERS[name])
    expect_same_tokens(directory, tokenizer_test.generated_strings(1000))


@pytest.mark.parametrize("form", NORMALIZERS)
def test_normalizer_matches_tokenizers_on_combining_characters(smollm_dir, tmp_path, form):
    directory = variant(smollm_dir, tmp_path / form,
                        normalizer={"type": "Sequence", "normalizers": [{"type": form}]})
    texts = combining_strings(1000)
    expect_same_tokens(directory, texts)


def test_normalization_changes_the_tokens(smollm_dir, tmp_path):
    """The NFC check can fail: decomposed input tokenizes differently without the normalizer."""
    plain = variant(smollm_dir, tmp_path / "plain", normalizer=None)
    nfc = variant(smollm_dir, tmp_path / "nfc", normalizer={"type": "NFC"})
    text = ["cafe\u0301 A\u030angstro\u0308m"]
    assert tokenizer_test.run_tool(plain, text)[0]["ids"] != tokenizer_test.run_tool(nfc, text)[0]["ids"]


def test_unsupported_pre_tokenizer_steps_are_refused_by_name(smollm_dir, tmp_path):
    cases = {
        "whitespace": (sequence({"type": "Whitespace"}, byte_level(False)), "Whitespace"),
        "behavior": (sequence(split("a", "Sideways"), byte_level(False)), "Sideways"),
        "regex": (sequence(split("(?<=a+)b"), byte_level(False)), "(?<=a+)b"),
    }
    for name, (pre, needle) in cases.items():
        directory = variant(smollm_dir, tmp_path / name, pre_tokenizer=pre)
        import subprocess
        from conftest import tool_path
        result = subprocess.run([str(tool_path("tokenize_tool")), "--model", str(directory)],
                                input=b"\"x\"\n", capture_output=True, timeout=120)
        assert result.returncode != 0, name
        assert needle in result.stderr.decode(errors="replace"), (name, result.stderr)
