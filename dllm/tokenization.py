"""The bundled word-level tokenizer: one token per letter-run, per digit and per punctuation mark.

Spacing is carried by a SentencePiece-style marker: a piece that follows a space starts with
``▁`` (``"75 + 3"`` -> ``▁7 5 ▁+ ▁3``), so numbers are spelled digit by digit and still decode to
exactly the text they came from (``decode(encode(x)) == x`` for single-spaced text with no
leading/trailing space, which is how every task suite writes its prompts and answers). A token
count therefore equals ``eval.tasks.count_tokens``: the marker never costs a token.

Chat format: ``<|user|> {prompt} <|assistant|>`` then the answer and ``<|eos|>``.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

SPACE = "\u2581"  # "▁"
MASK_TOKEN = "<|mask|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
# Fixed ids: the model config stores pad/eos/mask ids, so they must not move when the vocabulary grows.
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, EOS_TOKEN, MASK_TOKEN, USER_TOKEN, ASSISTANT_TOKEN)

# A piece: optional space marker + (a letter run | one digit | one other character), or a bare marker
# (only produced by runs of spaces, which canonical text does not contain).
PIECE_PATTERN = rf"{SPACE}?[A-Za-z]+|{SPACE}?[0-9]|{SPACE}?[^A-Za-z0-9{SPACE}]|{SPACE}"

# Roles: the user turn and the generation prompt are what training and generation feed the model.
# A system message is rendered as a user turn (the tiny models have no system role).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|assistant|> ' + message['content'] + '<|eos|>' }}"
    "{%- else -%}"
    "{{ '<|user|> ' + message['content'] + ' ' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)


def pieces(text: str) -> list[str]:
    """The pieces ``text`` splits into (before the vocabulary lookup)."""
    return [p for p, _ in _pre_tokenizer().pre_tokenize_str(text)]


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=False),
        pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
    ])


def _base_pieces() -> list[str]:
    """Pieces every tokenizer has, seen in the data or not: digits and ASCII punctuation in both forms."""
    singles = list(string.digits) + list(string.punctuation)
    return [SPACE, "\n"] + singles + [SPACE + s for s in singles]


def build_tokenizer(texts: Iterable[str], extra_pieces: Iterable[str] = ()):
    """A ``PreTrainedTokenizerFast`` whose vocabulary is every piece of ``texts`` (plus digits,
    punctuation, the chat tokens and the special tokens), with the chat template set."""
    from transformers import PreTrainedTokenizerFast

    pre = _pre_tokenizer()
    found: set[str] = set(_base_pieces()) | set(extra_pieces)
    for text in texts:
        found.update(p for p, _ in pre.pre_tokenize_str(text))
    found.difference_update(SPECIAL_TOKENS)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for piece in sorted(found):  # sorted: the same texts always give the same ids
        vocab[piece] = len(vocab)

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=False)
    # The space after <|user|> and before <|assistant|> belongs to the template, not to the prompt.
    strip = {USER_TOKEN: (False, True), ASSISTANT_TOKEN: (True, True)}
    tok.add_special_tokens([
        AddedToken(t, special=True, normalized=False, lstrip=strip.get(t, (False, False))[0],
                   rstrip=strip.get(t, (False, False))[1])
        for t in SPECIAL_TOKENS
    ])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        mask_token=MASK_TOKEN,
        additional_special_tokens=[USER_TOKEN, ASSISTANT_TOKEN],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,  # " ." must stay " .": the suites' canonical spacing
        padding_side="left",  # prompts are left-padded; answers start at the same slot in a batch
        model_max_length=4096,
    )


def save_tokenizer(tokenizer, directory: str | Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def load_tokenizer(directory: str | Path):
    """``AutoTokenizer.from_pretrained`` on a local directory (offline)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def special_token_ids(tokenizer) -> dict[str, int]:
    """The ids a dllm model config needs: mask, eos, pad."""
    ids = {
        "mask_token_id": tokenizer.convert_tokens_to_ids(MASK_TOKEN),
        "eos_token_id": tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        "pad_token_id": tokenizer.convert_tokens_to_ids(PAD_TOKEN),
    }
    unk = tokenizer.convert_tokens_to_ids(UNK_TOKEN)
    missing = [k for k, v in ids.items() if v is None or (v == unk and k != "unk")]
    if missing:
        raise ValueError(f"tokenizer lacks the dllm special tokens for {missing}; build it with build_tokenizer()")
    return ids
