"""The bundled word-level tokenizer: one token per letter-run, per digit and per punctuation mark.

Spacing is carried by a SentencePiece-style marker: a piece that follows a space starts with
``▁`` (``"75 + 3"`` -> ``▁7 5 ▁+ ▁3``), so numbers are spelled digit by digit and still decode to
exactly the text they came from (``decode(encode(x)) == x`` for single-spaced text with no
leading/trailing space, which is how every task suite writes its prompts and answers). A token
count therefore equals ``dllm.eval.tasks.count_tokens``: the marker never costs a token.

Chat format: ``<|user|> {prompt} <|assistant|>`` then the answer and ``<|eos|>``.

``pad_numbers=W`` left-pads every number shorter than W digits with an *empty digit* token ``∅``
that decodes to nothing (``"35 + 84"`` -> ``▁∅ ∅ 3 5 ▁+ ▁∅ ∅ 8 4``): the text round-trips
unchanged, but a digit's place is now a fixed position inside its number, which is what a small
model needs to line up operands (docs/training.md: a from-scratch ``arith`` run reached 59% after
600 steps with W=4, against 3% with plain digits). Runs of single digits separated by spaces (a
Sudoku grid's cells, ``0 0 0 2 / 2 1 4 3``) are cells, not numbers: only the first is padded.

``number_tokens=D`` instead makes every run of up to D digits one token (``"12 * 7"`` -> ``▁12 ▁* ▁7``;
a longer number is split into D-digit pieces from the left), so an arithmetic fact such as
``12 * 7 = 84`` is a relation between three tokens rather than between digit strings. Every
1..D-digit string is in the vocabulary, seen in the data or not (about 2,200 entries for D=3).

``number_tags=True`` (with ``pad_numbers=W``) gives every padded number both views: a whole-number
*tag* token that decodes to nothing, then its padded digits (``"35 + 84"`` -> ``▁⟦35⟧ ∅ ∅ 3 5 ▁+
▁⟦84⟧ ∅ ∅ 8 4``). The tag makes a relation between numbers (``12 * 7`` lands on 84) a relation
between tokens, which countdown needs; the padded digits keep the column alignment that arith needs
(whole-number tokens alone make arith unlearnable: docs/training.md, "Lessons from training the bundled models"). Numbers of W or
more digits and the unpadded Sudoku cells get no tag. ``tokenizers`` normalizers cannot copy a
matched number, so the tagger copies it into its tag digit by digit (31 rules for W=4).

``number_tag_style="replace"`` puts the tag in place of the number's first empty digit instead of
before it (``"35"`` -> ``▁⟦35⟧ ∅ 3 5``, ``"123"`` -> ``▁⟦123⟧ 1 2 3``): sequences keep the length
and positions of plain padding, so a model trained with padded digits can take up the tags without
relearning where things are (``dllm.training.models.remap_vocabulary`` starts each tag from the row of
the empty digit it replaces, which leaves such a model's function unchanged on its inputs).
``number_tag_style="whole"`` puts the tag in place of the whole padded number (``"35"`` -> ``▁⟦35⟧ ∅ ∅ ∅``,
the same length): the tag is then the number's only view, so a model cannot read the number from its
digits instead (a padded-digit model fine-tuned with ``replace`` tags kept reading the digits;
docs/training.md, "Lessons from training the bundled models"). Tags decode to nothing, so tagged numbers do not decode back; use it
with ``number_tag_context`` for prompts, which are encoded and never decoded.
``number_tag_digits=D`` tags only numbers of up to D digits (0: every padded number): 1,000 three-digit
tags are each a rare class, which a fine-tuned model was slow to learn.
``number_tag_context=R`` tags only numbers that the regular expression R matches right after (a
lookahead; empty: every padded number). ``"countdown"`` (``COUNTDOWN_PROMPT_CONTEXT``) tags the numbers of a countdown
prompt (``numbers 3 15 7 target 52 :``) and nothing else in the suites, so the model sees whole
numbers where it has to relate them while every answer keeps plain padded digits.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
)

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

EMPTY_DIGIT = "\u2205"  # "∅": pads numbers to a fixed width (pad_numbers); decodes to nothing
TAG_OPEN, TAG_CLOSE = "\u27e6", "\u27e7"  # "⟦", "⟧": a number tag ⟦35⟧ (number_tags); decodes to nothing
TAG_PATTERN = f"{TAG_OPEN}[0-9]+{TAG_CLOSE}"
# the numbers of a countdown prompt: more numbers then "target", or the target before " :"
COUNTDOWN_PROMPT_CONTEXT = f"[0-9{EMPTY_DIGIT}{TAG_OPEN}{TAG_CLOSE} ]* (?:target|:)"
# number_tag_style: the tag goes before the padded number, replaces its first ∅, or replaces the whole
# number (the tag then is the number's only view: "whole")
TAG_STYLES = ("insert", "replace", "whole")
PADDED_PIECE_PATTERN = rf"{SPACE}?[A-Za-z]+|{SPACE}?[0-9{EMPTY_DIGIT}]|{SPACE}?[^A-Za-z0-9{SPACE}{EMPTY_DIGIT}]|{SPACE}"

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


MAX_NUMBER_TOKEN_DIGITS = 3  # 10^4 four-digit tokens (x2 with the space marker) would dwarf a tiny model


def pieces(text: str, pad_numbers: int = 0, number_tokens: int = 0, number_tags: bool = False,
           number_tag_style: str = "insert", number_tag_digits: int = 0, number_tag_context: str = "") -> list[str]:
    """The pieces ``text`` splits into (before the vocabulary lookup)."""
    norm = _normalizer(pad_numbers, number_tags, number_tag_style, number_tag_digits, number_tag_context)
    if norm is not None:
        text = norm.normalize_str(text)
    return [p for p, _ in _pre_tokenizer(pad_numbers, number_tokens, number_tags).pre_tokenize_str(text)]


def _piece_pattern(pad_numbers: int = 0, number_tokens: int = 0, number_tags: bool = False) -> str:
    if number_tokens:
        return PIECE_PATTERN.replace("[0-9]", f"[0-9]{{1,{number_tokens}}}", 1)
    if number_tags:  # first, or the catch-all single-character branch would split ⟦ off
        return rf"{SPACE}?{TAG_PATTERN}|" + PADDED_PIECE_PATTERN
    return PADDED_PIECE_PATTERN if pad_numbers else PIECE_PATTERN


def _pre_tokenizer(pad_numbers: int = 0, number_tokens: int = 0,
                   number_tags: bool = False) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=False),
        pre_tokenizers.Split(Regex(_piece_pattern(pad_numbers, number_tokens, number_tags)), behavior="isolated"),
    ])


def _normalizer(pad_numbers: int = 0, number_tags: bool = False, number_tag_style: str = "insert",
                number_tag_digits: int = 0, number_tag_context: str = "") -> normalizers.Normalizer | None:
    if not pad_numbers:
        return None
    padder = _number_padder(pad_numbers)
    if not number_tags:
        return padder
    return normalizers.Sequence([padder, _number_tagger(pad_numbers, style=number_tag_style,
                                                        max_digits=number_tag_digits,
                                                        context=tag_context(number_tag_context))])


def _digit_strings(max_digits: int) -> list[str]:
    """Every 1..max_digits-digit string, leading zeros included."""
    return [f"{n:0{d}d}" for d in range(1, max_digits + 1) for n in range(10 ** d)]


def _number_pieces(max_digits: int) -> list[str]:
    """Every 1..max_digits-digit string, with and without the space marker."""
    numbers = _digit_strings(max_digits)
    return numbers + [SPACE + n for n in numbers]


# A Sudoku cell after the first of its row: a single digit after "d " that ends its row within seven
# more cells ("0 0 0 2 / 2 1 4 3", and the 9-cell rows of sudoku9). Other numbers after "d " are
# numbers ("numbers 3 15 7 target"). Tokenizers built before 2026-12-05 allowed two more cells (4x4
# rows only): they pad the second to sixth cell of a 9-cell row.
_LATER_CELL = r"(?<=[0-9] )(?=[0-9](?: [0-9](?![0-9])){0,7}(?: /|\s*$))"


def _number_padder(width: int) -> normalizers.Normalizer:
    """Insert ``width - n`` empty digits before every n-digit number (n < width), except Sudoku
    cells after the first: the first cell of a grid is padded, the cells after it are not.

    Tokenizers built before 2026-12-04 (a tokenizer keeps its rules in ``tokenizer.json``) also
    left unpadded every number that follows "d ", so a countdown prompt ``numbers 3 15 7`` padded
    only its first number while the answer ``3 * 15 + 7`` padded all three."""
    e = EMPTY_DIGIT
    start = rf"(?<![0-9{e}])(?<!/ )(?!{_LATER_CELL})"
    return normalizers.Sequence([normalizers.Replace(Regex(rf"{start}(?=[0-9]{{{n}}}(?![0-9]))"), e * (width - n))
                                 for n in range(1, width)])


def _number_tagger(width: int, style: str = "insert", max_digits: int = 0,
                   context: str = "") -> normalizers.Normalizer:
    """Put ``⟦s⟧`` before every padded number ``∅..∅s`` (``replace``: in place of its first ``∅``;
    ``whole``: in place of the whole padded number, which becomes ``⟦s⟧`` and ``width - 1`` empty
    digits), s any 1..width-1-digit string (runs after the padder, so exactly the padded numbers are
    tagged: an n-digit string carries width - n empty digits, which identifies it). ``max_digits``:
    tag only numbers of up to that many digits (0: width - 1, every padded number). ``context``: a
    regex the text right after the number must match; it is matched against the padded text before
    any tag is added.

    A ``Replace`` rule writes literal text (no group references), so the number is copied into its tag
    one digit at a time: one rule opens an empty tag ``⟦⟧`` at every number to tag, then a rule per
    digit place j and digit d writes d into every tag holding j digits whose number has d at place j
    (empty matches, so each rule inserts text). That is 1 + 10 * max_digits rules (31 for width 4) in
    place of one rule per digit string (1,110), each rule a pass over the text. Tokenizers built before
    2026-12-07 keep the per-string rules in their ``tokenizer.json``; both give the same text wherever
    the context does not read tags (the countdown context reads them alike)."""
    e = EMPTY_DIGIT
    free = rf"(?<![0-9{e}{TAG_OPEN}{TAG_CLOSE}])"
    after = f"(?={context})" if context else ""
    lengths = range(1, (max_digits or width - 1) + 1)
    replace = style == "replace"  # the tag takes the place of the number's first empty digit
    left = {n: width - n - replace for n in lengths}  # the empty digits between the tag and the digits
    padded = "|".join(f"{e}{{{left[n]}}}[0-9]{{{n}}}" for n in lengths)
    opened = rf"{free}{e if replace else ''}(?=(?:{padded})(?![0-9]){after})"
    rules = [normalizers.Replace(Regex(opened), TAG_OPEN + TAG_CLOSE)]
    for j in range(max(lengths)):
        for d in range(10):
            # before the ⟧ of a tag holding j digits, whose number has n > j digits with d at place j
            ahead = "|".join(f"{e}{{{left[n]}}}[0-9]{{{j}}}{d}[0-9]{{{n - j - 1}}}" for n in lengths if n > j)
            place = rf"(?<={TAG_OPEN}[0-9]{{{j}}})(?={TAG_CLOSE}(?:{ahead})(?![0-9]))"
            rules.append(normalizers.Replace(Regex(place), str(d)))
    if style == "whole":  # the number's digits become empty digits: the tag is its only view
        digits = "|".join(rf"(?<={TAG_OPEN}[0-9]{{{n}}}{TAG_CLOSE}){e}{{{width - n}}}[0-9]{{{n}}}" for n in lengths)
        rules.append(normalizers.Replace(Regex(f"(?:{digits})(?![0-9])"), e * (width - 1)))
    return normalizers.Sequence(rules)


TAG_CONTEXTS = {"countdown": COUNTDOWN_PROMPT_CONTEXT}  # names a recipe can give instead of a regex


def tag_context(name_or_regex: str) -> str:
    """The regex a ``number_tag_context`` setting stands for: a name in ``TAG_CONTEXTS`` or a regex."""
    return TAG_CONTEXTS.get(name_or_regex, name_or_regex)


def tag_context_error(context: str) -> str | None:
    """Why ``context`` cannot be a ``number_tag_context`` (a name in ``TAG_CONTEXTS`` or a regex
    ``tokenizers`` accepts), or None."""
    try:
        Regex(tag_context(context))
    except Exception as exc:  # the Rust regex error has no Python class of its own
        return f"number_tag_context {context!r} is not a valid regular expression: {exc}"
    return None


def tag_origin(piece: str) -> str | None:
    """The empty-digit piece a number tag stands where (``▁⟦35⟧`` -> ``▁∅``), None for other pieces.
    With ``number_tag_style="replace"`` it is exactly the piece the tag took the place of."""
    return re.sub(TAG_PATTERN, EMPTY_DIGIT, piece) if re.fullmatch(rf"{SPACE}?{TAG_PATTERN}", piece) else None


def _base_pieces() -> list[str]:
    """Pieces every tokenizer has, seen in the data or not: digits and ASCII punctuation in both forms."""
    singles = list(string.digits) + list(string.punctuation)
    return [SPACE, "\n"] + singles + [SPACE + s for s in singles]


def build_tokenizer(texts: Iterable[str], extra_pieces: Iterable[str] = (), pad_numbers: int = 0,
                    number_tokens: int = 0, number_tags: bool = False, number_tag_style: str = "insert",
                    number_tag_digits: int = 0, number_tag_context: str = ""):
    """A ``PreTrainedTokenizerFast`` whose vocabulary is every piece of ``texts`` (plus digits,
    punctuation, the chat tokens and the special tokens), with the chat template set.

    ``pad_numbers=W`` (W >= 2): numbers are left-padded to W digits with ``∅``; ``number_tokens=D``
    (2 <= D <= 3): runs of up to D digits are single tokens; the two exclude each other.
    ``number_tags`` (needs ``pad_numbers``): each padded number also gets a whole-number tag token
    before its digits, or in place of its first empty digit with ``number_tag_style="replace"``
    (module docstring); ``number_tag_digits=D`` tags only numbers of up to D digits, and
    ``number_tag_context=R`` only numbers that the regex R (or a name in ``TAG_CONTEXTS``) matches
    right after."""
    from transformers import PreTrainedTokenizerFast

    if pad_numbers and pad_numbers < 2:
        raise ValueError(f"pad_numbers must be 0 (off) or >= 2, got {pad_numbers}")
    if number_tokens and not 2 <= number_tokens <= MAX_NUMBER_TOKEN_DIGITS:
        raise ValueError(f"number_tokens must be 0 (off) or in [2, {MAX_NUMBER_TOKEN_DIGITS}], got {number_tokens}")
    if pad_numbers and number_tokens:
        raise ValueError("pad_numbers and number_tokens exclude each other (digits padded to a width, "
                         "or whole numbers as tokens); set one of them to 0")
    if number_tags and not pad_numbers:
        raise ValueError("number_tags tags padded numbers: it needs pad_numbers (e.g. 4)")
    if number_tag_style not in TAG_STYLES:
        raise ValueError(f"number_tag_style must be one of {', '.join(TAG_STYLES)}, got {number_tag_style!r}")
    if number_tag_digits and not 1 <= number_tag_digits < (pad_numbers or 2):
        raise ValueError(f"number_tag_digits must be 0 (every padded number) or in [1, pad_numbers - 1], "
                         f"got {number_tag_digits}")
    if number_tag_context and not number_tags:
        raise ValueError("number_tag_context limits which numbers get tags: it needs number_tags=True")
    if number_tag_context and (err := tag_context_error(number_tag_context)):
        raise ValueError(err)
    pre = _pre_tokenizer(pad_numbers, number_tokens, number_tags)
    norm = _normalizer(pad_numbers, number_tags, number_tag_style, number_tag_digits, number_tag_context)
    found: set[str] = set(_base_pieces()) | set(extra_pieces)
    if number_tokens:
        found |= set(_number_pieces(number_tokens))
    if norm is not None:
        found |= {EMPTY_DIGIT, SPACE + EMPTY_DIGIT}
    if number_tags:
        tags = [f"{TAG_OPEN}{s}{TAG_CLOSE}" for s in _digit_strings(number_tag_digits or pad_numbers - 1)]
        found |= set(tags) | {SPACE + t for t in tags}
    for text in texts:
        if norm is not None:
            text = norm.normalize_str(text)
        found.update(p for p, _ in pre.pre_tokenize_str(text))
    found.difference_update(SPECIAL_TOKENS)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for piece in sorted(found):  # sorted: the same texts always give the same ids
        vocab[piece] = len(vocab)

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre
    metaspace = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=False)
    if norm is not None:
        tok.normalizer = norm
        hide = [decoders.Replace(EMPTY_DIGIT, "")]
        if number_tags:
            hide.append(decoders.Replace(Regex(TAG_PATTERN), ""))
        tok.decoder = decoders.Sequence([*hide, metaspace])
    else:
        tok.decoder = metaspace
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
