"""Hugging Face `tokenizers` rebuilt from a GGUF vocabulary, as the reference for Loom's
byte-level BPE tokenizer (used by tokenizer_test.py and bench/tokenizer_bench.py).

The recipe mirrors SmolLM2's tokenizer.json: a BPE model with no unknown token and no
byte fallback, pre-tokenizer Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)] (plain ByteLevel for GPT-2), a ByteLevel
decoder, CONTROL tokens as special added tokens and USER_DEFINED tokens as added tokens.
"""
import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3
USER_DEFINED = 4


def read_vocab(path):
    """(tokens, token_types, merges) of the GGUF at `path`."""
    reader = gguf.GGUFReader(str(path))

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    types_field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(types_field.parts[i][0]) for i in types_field.data]
    return strings("tokenizer.ggml.tokens"), types, strings("tokenizer.ggml.merges")


def build_reference(path, individual_digits):
    """A `tokenizers.Tokenizer` equivalent to the byte-level BPE vocabulary at `path`."""
    tokens, types, merges = read_vocab(path)
    vocab = {token: i for i, token in enumerate(tokens)}
    merge_pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    model = models.BPE(vocab=vocab, merges=merge_pairs, unk_token=None, fuse_unk=False,
                       byte_fallback=False)
    reference = Tokenizer(model)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if individual_digits:
        reference.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        reference.pre_tokenizer = byte_level
    reference.decoder = decoders.ByteLevel()
    reference.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(types) if kind == CONTROL])
    added = [AddedToken(tokens[i], special=False, normalized=False)
             for i, kind in enumerate(types) if kind == USER_DEFINED]
    if added:
        reference.add_tokens(added)
    return reference
