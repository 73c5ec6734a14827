"""The bundled tokenizer: exact round trip of every suite's canonical text, token counts, chat template."""

from __future__ import annotations

import pytest

from dllm.eval.tasks import count_tokens, get_suite, suite_names
from dllm.tokenization import build_tokenizer, load_tokenizer, pieces, save_tokenizer, special_token_ids, tag_origin


@pytest.fixture(scope="module")
def plain_tokenizer():
    """The suites' tokenizer without number padding (recipes with ``model.pad_numbers: 0``)."""
    from dllm.training.data import suite_texts

    return build_tokenizer(suite_texts())


def test_the_bundled_tokenizer_pads_numbers(tokenizer):
    assert tokenizer.tokenize("What is 5 + 84 ?") == ["▁What", "▁is", "▁∅", "∅", "∅", "5", "▁+", "▁∅", "∅", "8", "4",
                                                      "▁?"]
    assert tokenizer.decode(tokenizer("5 + 84", add_special_tokens=False)["input_ids"]) == "5 + 84"


@pytest.mark.parametrize("name", suite_names())
def test_round_trip_and_counts(plain_tokenizer, name):
    tokenizer = plain_tokenizer
    suite = get_suite(name)
    for split in ("train", "test"):
        for ex in suite.examples(split, 200, seed=3):
            for text in (ex.prompt, ex.answer):
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                assert tokenizer.unk_token_id not in ids, text
                assert tokenizer.decode(ids) == text
                assert len(ids) == count_tokens(text)


def test_digits_are_single_tokens(plain_tokenizer):
    tokenizer = plain_tokenizer
    toks = tokenizer.tokenize("What is 123 + 45 ?")
    assert toks == ["▁What", "▁is", "▁1", "2", "3", "▁+", "▁4", "5", "▁?"]
    # "12 4" and "1 24" stay distinguishable
    assert tokenizer.decode(tokenizer("12 4", add_special_tokens=False)["input_ids"]) == "12 4"
    assert tokenizer.decode(tokenizer("1 24", add_special_tokens=False)["input_ids"]) == "1 24"


def test_chat_template(tokenizer):
    msgs = [{"role": "user", "content": "What is 7 + 5 ?"}]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|user|> What is 7 + 5 ? <|assistant|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    toks = tokenizer.convert_ids_to_tokens(ids)
    assert toks[0] == "<|user|>" and toks[-1] == "<|assistant|>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "What is 7 + 5 ?"
    full = tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": "12"}], tokenize=False)
    assert full == "<|user|> What is 7 + 5 ? <|assistant|> 12<|eos|>"


def test_special_tokens_and_save_load(tmp_path):
    tok = build_tokenizer(["hello world 42 ."])
    ids = special_token_ids(tok)
    assert len(set(ids.values())) == 3
    assert tok.mask_token == "<|mask|>" and tok.eos_token == "<|eos|>" and tok.pad_token == "<|pad|>"
    save_tokenizer(tok, tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.get_vocab() == tok.get_vocab()
    assert special_token_ids(again) == ids
    assert again.decode(again("hello world 42 .", add_special_tokens=False)["input_ids"]) == "hello world 42 ."
    assert again.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                     tokenize=False) == "<|user|> hi <|assistant|>"
    # unseen words map to <|unk|> instead of failing
    assert again.unk_token_id in again("zebra", add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def padded_tokenizer():
    from dllm.training.data import suite_texts

    return build_tokenizer(suite_texts(), pad_numbers=4)


def test_padded_numbers_have_a_fixed_width(padded_tokenizer, tmp_path):
    tok = padded_tokenizer
    assert tok.tokenize("What is 5 + 84 ?") == ["▁What", "▁is", "▁∅", "∅", "∅", "5", "▁+", "▁∅", "∅", "8", "4", "▁?"]
    assert tok.tokenize("1998") == ["▁1", "9", "9", "8"] and tok.tokenize("12345") == ["▁1", "2", "3", "4", "5"]
    # Sudoku cells are not numbers: only the first of a run of space-separated digits is padded
    assert tok.tokenize("sudoku : 0 0 1 / 2 1") == ["▁sudoku", "▁:", "▁∅", "∅", "∅", "0", "▁0", "▁1", "▁/", "▁2", "▁1"]
    # the chat template's answer slot: padded answers decode to plain numbers, also token by token
    from dllm.decoding.textstream import IncrementalDetokenizer

    ids = tok("7 . #### 42", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.add([i]) for i in ids) + detok.flush() == "7 . #### 42"
    assert tok.decode(ids, skip_special_tokens=True) == "7 . #### 42"
    save_tokenizer(tok, tmp_path)
    again = load_tokenizer(tmp_path)
    assert again("What is 5 + 84 ?")["input_ids"] == tok("What is 5 + 84 ?")["input_ids"]
    with pytest.raises(ValueError, match="pad_numbers"):
        build_tokenizer(["1"], pad_numbers=1)


def test_recipes_can_build_a_padded_tokenizer():
    from dllm.training.config import ModelSection
    from dllm.training.models import load_tokenizer_for

    plain = load_tokenizer_for(ModelSection())
    padded = load_tokenizer_for(ModelSection(pad_numbers=4))
    assert plain.tokenize("45") == ["▁4", "5"] and padded.tokenize("45") == ["▁∅", "∅", "4", "5"]
    assert len(padded) == len(plain) + 2


@pytest.mark.parametrize("kind", ["bundled", "tagged"])
def test_result_mask_finds_the_gsm_results(request, kind):
    import torch

    from dllm.training.objectives import result_slots
    from dllm.training.sft import result_token_ids

    tokenizer = request.getfixturevalue("tokenizer" if kind == "bundled" else "tagged_tokenizer")
    triggers, numbers = result_token_ids(tokenizer, ["=", "#"])
    ids = torch.tensor([tokenizer.encode("9 * 14 = 126 . 126 + 36 = 162 . #### 162", add_special_tokens=False)])
    slots = result_slots(ids, triggers, numbers)
    assert tokenizer.decode(ids[0][slots[0]].tolist()).split() == ["126", "162", "162"]
    # a result's tag is masked with its digits: left visible it would give them away
    pieces = tokenizer.convert_ids_to_tokens(ids[0][slots[0]].tolist())
    assert [p for p in pieces if "\u27e6" in p] == ([] if kind == "bundled" else ["▁⟦126⟧", "▁⟦162⟧", "▁⟦162⟧"])
    with pytest.raises(ValueError, match="no trigger tokens"):  # a ConfigError
        result_token_ids(tokenizer, ["no-such-token"])


@pytest.fixture(scope="module")
def number_tokenizer():
    from dllm.training.data import suite_texts

    return build_tokenizer(suite_texts(), number_tokens=3)


@pytest.fixture(scope="module")
def tagged_tokenizer():
    from dllm.training.data import suite_texts

    return build_tokenizer(suite_texts(), pad_numbers=4, number_tags=True)


@pytest.fixture(scope="module")
def replaced_tokenizer():
    from dllm.training.data import suite_texts

    return build_tokenizer(suite_texts(), pad_numbers=4, number_tags=True, number_tag_style="replace")


@pytest.mark.parametrize("kind", ["padded", "number", "tagged", "replaced"])
@pytest.mark.parametrize("name", suite_names())
def test_padded_and_number_tokenizers_round_trip(request, kind, name):
    tok = request.getfixturevalue(f"{kind}_tokenizer")
    for ex in get_suite(name).examples("test", 100, seed=5):
        for text in (ex.prompt, ex.answer):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids, text
            assert tok.decode(ids) == text
            if kind == "number":
                assert len(ids) <= count_tokens(text)  # never more pieces than one per digit
            if kind == "tagged":  # the padded pieces plus one tag per padded number
                padded = request.getfixturevalue("padded_tokenizer").tokenize(text)
                tags = [p for p in tok.convert_ids_to_tokens(ids) if "\u27e6" in p]
                assert len(ids) == len(padded) + len(tags)
                assert len(tags) == sum(p.endswith("\u2205") and (i == 0 or not padded[i - 1].endswith("\u2205"))
                                        for i, p in enumerate(padded))
            if kind == "replaced":  # the padded pieces, each number's first empty digit swapped for its tag
                padded = request.getfixturevalue("padded_tokenizer").tokenize(text)
                assert [tag_origin(p) or p for p in tok.convert_ids_to_tokens(ids)] == padded


def test_number_tokens_make_whole_numbers_single_tokens(number_tokenizer, tmp_path):
    tok = number_tokenizer
    assert tok.tokenize("numbers 3 15 7 target 98 :") == ["▁numbers", "▁3", "▁15", "▁7", "▁target", "▁98", "▁:"]
    # a longer number is cut into 3-digit pieces from the left and still decodes to itself
    assert tok.tokenize("1234 + 5") == ["▁123", "4", "▁+", "▁5"]
    assert tok.decode(tok("1234 + 5", add_special_tokens=False)["input_ids"]) == "1234 + 5"
    # every 1-3 digit string is in the vocabulary, including ones no suite writes
    for text in ("997", "007", "40"):
        assert tok.unk_token_id not in tok(text, add_special_tokens=False)["input_ids"]
    # Sudoku cells stay one token each
    assert tok.tokenize("0 0 1 / 2 1") == ["▁0", "▁0", "▁1", "▁/", "▁2", "▁1"]
    save_tokenizer(tok, tmp_path)
    again = load_tokenizer(tmp_path)
    assert again("12 * 7 = 84")["input_ids"] == tok("12 * 7 = 84")["input_ids"]
    assert special_token_ids(again) == special_token_ids(tok)


def test_number_tags_give_each_padded_number_both_views(tagged_tokenizer, tmp_path):
    tok = tagged_tokenizer
    assert tok.tokenize("numbers 3 15 7 target 98 :") == [
        "▁numbers", "▁⟦3⟧", "∅", "∅", "∅", "3", "▁⟦15⟧", "∅", "∅", "1", "5", "▁⟦7⟧", "∅", "∅", "∅", "7",
        "▁target", "▁⟦98⟧", "∅", "∅", "9", "8", "▁:"]
    # a tag is glued to what comes before it, like the first padding piece it precedes
    assert tok.tokenize("(3 * 15)") == ["▁(", "⟦3⟧", "∅", "∅", "∅", "3", "▁*", "▁⟦15⟧", "∅", "∅", "1", "5", ")"]
    # 4-digit numbers are not padded, so not tagged; every 1-3 digit string has a tag, seen in the data or not
    assert tok.tokenize("1234 = 997") == ["▁1", "2", "3", "4", "▁=", "▁⟦997⟧", "∅", "9", "9", "7"]
    assert tok.unk_token_id not in tok("007 40", add_special_tokens=False)["input_ids"]
    # a Sudoku grid gains one token: only its first (padded) cell is tagged
    grid = "sudoku : 0 0 0 2 / 2 1 4 3 / 3 0 0 1 / 1 0 3 4"
    assert len(tok.tokenize(grid)) == 25 and tok.tokenize(grid)[2] == "▁⟦0⟧"
    # tags decode to nothing, also when a model writes a tag that disagrees with its digits
    # (a tag with no digits after it leaves only its space)
    ids = tok.convert_tokens_to_ids(["▁⟦12⟧", "∅", "∅", "1", "3", "▁+", "▁⟦5⟧"])
    assert tok.decode(ids) == "13 + "
    save_tokenizer(tok, tmp_path)
    again = load_tokenizer(tmp_path)
    assert again("12 * 7 = 84")["input_ids"] == tok("12 * 7 = 84")["input_ids"]
    assert again.decode(again("12 * 7 = 84", add_special_tokens=False)["input_ids"]) == "12 * 7 = 84"


def test_replace_style_tags_take_the_first_empty_digits_place(replaced_tokenizer):
    tok = replaced_tokenizer
    assert tok.tokenize("numbers 3 15 7 target 98 :") == [
        "▁numbers", "▁⟦3⟧", "∅", "∅", "3", "▁⟦15⟧", "∅", "1", "5", "▁⟦7⟧", "∅", "∅", "7",
        "▁target", "▁⟦98⟧", "∅", "9", "8", "▁:"]
    # a 3-digit number keeps no empty digit; a 4-digit one has none to replace and stays untagged
    assert tok.tokenize("1234 = 997") == ["▁1", "2", "3", "4", "▁=", "▁⟦997⟧", "9", "9", "7"]
    assert tok.tokenize("(35)") == ["▁(", "⟦35⟧", "∅", "3", "5", ")"]
    assert tag_origin("▁⟦35⟧") == "▁∅" and tag_origin("⟦0⟧") == "∅"
    assert tag_origin("▁∅") is None and tag_origin("▁35") is None


def test_number_tag_digits_leaves_longer_numbers_untagged():
    from dllm.training.data import suite_texts

    tok = build_tokenizer(suite_texts(), pad_numbers=4, number_tags=True, number_tag_style="replace",
                          number_tag_digits=2)
    assert tok.tokenize("35 + 84 = 119") == ["▁⟦35⟧", "∅", "3", "5", "▁+", "▁⟦84⟧", "∅", "8", "4", "▁=",
                                             "▁∅", "1", "1", "9"]
    tags = [t for t in tok.get_vocab() if tag_origin(t)]
    assert len(tags) == 2 * 110  # 1- and 2-digit strings, with and without the space marker
    assert tok.decode(tok("35 + 84 = 119", add_special_tokens=False)["input_ids"]) == "35 + 84 = 119"


def test_countdown_context_tags_only_countdown_prompt_numbers():
    from dllm.training.data import suite_texts

    texts = suite_texts()
    tok = build_tokenizer(texts, pad_numbers=4, number_tags=True, number_tag_style="replace",
                          number_tag_digits=2, number_tag_context="countdown")
    plain = build_tokenizer(texts, pad_numbers=4)
    assert tok.tokenize("numbers 3 15 7 target 52 :") == [
        "▁numbers", "▁⟦3⟧", "∅", "∅", "3", "▁⟦15⟧", "∅", "1", "5", "▁⟦7⟧", "∅", "∅", "7",
        "▁target", "▁⟦52⟧", "∅", "5", "2", "▁:"]
    # a target of 100 has three digits, more than number_tag_digits: padded, not tagged
    assert tok.tokenize("numbers 3 15 7 target 100 :")[-6:] == ["▁target", "▁∅", "1", "0", "0", "▁:"]
    # answers and every other suite's text keep plain padded digits (same pieces, so a padded-digit
    # checkpoint reads them unchanged); each countdown prompt differs only by its tags
    changed = [t for t in texts if tok.tokenize(t) != plain.tokenize(t)]
    assert changed and all(t.startswith("numbers ") and t.endswith(" :") for t in changed)
    for t in changed:
        assert [tag_origin(p) or p for p in tok.tokenize(t)] == plain.tokenize(t)
    assert tok.tokenize("3 * 15 + 7") == plain.tokenize("3 * 15 + 7")
    assert pieces("numbers 3 15 7 target 52 :", pad_numbers=4, number_tags=True, number_tag_style="replace",
                  number_tag_context="countdown") == tok.tokenize("numbers 3 15 7 target 52 :")
    assert tok.decode(tok("numbers 3 15 7 target 52 :", add_special_tokens=False)["input_ids"]) == \
        "numbers 3 15 7 target 52 :"


def test_whole_style_tags_are_a_countdown_prompt_numbers_only_view():
    from dllm.training.data import suite_texts

    texts = suite_texts()
    tok = build_tokenizer(texts, pad_numbers=4, number_tags=True, number_tag_style="whole",
                          number_tag_digits=2, number_tag_context="countdown")
    plain = build_tokenizer(texts, pad_numbers=4)
    assert tok.tokenize("numbers 3 15 7 target 52 :") == [
        "▁numbers", "▁⟦3⟧", "∅", "∅", "∅", "▁⟦15⟧", "∅", "∅", "∅", "▁⟦7⟧", "∅", "∅", "∅",
        "▁target", "▁⟦52⟧", "∅", "∅", "∅", "▁:"]
    # same length and positions as plain padding; numbers over number_tag_digits keep their digits
    assert tok.tokenize("numbers 3 15 7 target 100 :")[-6:] == ["▁target", "▁∅", "1", "0", "0", "▁:"]
    changed = [t for t in texts if tok.tokenize(t) != plain.tokenize(t)]
    assert changed and all(t.startswith("numbers ") and t.endswith(" :") for t in changed)
    for t in changed:
        a, b = tok.tokenize(t), plain.tokenize(t)
        assert len(a) == len(b) and not any(p.isdigit() for p, q in zip(a, b) if p != q)
    assert tok.tokenize("3 * 15 + 7") == plain.tokenize("3 * 15 + 7")
    # the tag is the number's only view, and tags decode to nothing: a prompt's tagged numbers do
    # not decode back (answers, which carry no tags, do)
    assert tok.decode(tok("numbers 3 15 target 100 :", add_special_tokens=False)["input_ids"]) == \
        "numbers   target 100 :"
    assert tok.decode(tok("3 * 15 + 7", add_special_tokens=False)["input_ids"]) == "3 * 15 + 7"


def _tagged_by_rule(text: str, width: int, style: str, max_digits: int, context: str) -> str:
    """What the tagger's rules must give, written out per number: every padded number ``∅..∅s`` not
    inside another number or tag, whose n digits fit ``max_digits`` and whose following text ``context``
    matches, gets its tag ``⟦s⟧`` (before the empty digits, in place of the first, or of them all)."""
    import re

    from dllm.tokenization import EMPTY_DIGIT as E

    def tag(m: re.Match) -> str:
        pads, digits = m.group(1), m.group(2)
        if len(pads) + len(digits) != width or len(digits) > (max_digits or width - 1):
            return m.group(0)
        if style == "whole":
            return f"⟦{digits}⟧" + E * (width - 1)
        return f"⟦{digits}⟧" + pads[style == "replace":] + digits

    return re.sub(rf"(?<![0-9{E}⟦⟧])({E}+)([0-9]+)(?![0-9])" + (f"(?={context})" if context else ""), tag, text)


def test_number_tags_follow_their_rule_on_every_suite_and_on_random_text():
    """The tagger copies each number into its tag digit by digit (31 rules, not one per number): every
    style, digit limit and context, on the suites' texts and on random strings of digits, empty digits,
    words and separators."""
    import random

    from dllm.tokenization import COUNTDOWN_PROMPT_CONTEXT, EMPTY_DIGIT, TAG_STYLES, _normalizer

    texts = [t for name in suite_names() for ex in get_suite(name).examples("test", 40, seed=5)
             for t in (ex.prompt, ex.answer)]
    rng = random.Random(0)
    alphabet = [*"0123456789" * 3, " ", " ", "a", "target", ":", "/", "+", EMPTY_DIGIT]
    texts += [" ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
                       for _ in range(rng.randint(1, 12))) for _ in range(600)]
    padded = {w: [_normalizer(w).normalize_str(t) for t in texts] for w in (3, 4)}
    for width in (3, 4):
        for style in TAG_STYLES:
            for max_digits in range(width):
                for context in ("", COUNTDOWN_PROMPT_CONTEXT, " [a-z]"):
                    norm = _normalizer(width, True, style, max_digits, context)
                    for text, pad in zip(texts, padded[width]):
                        assert norm.normalize_str(text) == _tagged_by_rule(pad, width, style, max_digits, context), \
                            (width, style, max_digits, context, text)


@pytest.mark.parametrize("kwargs, match", [
    ({"number_tags": True}, "needs pad_numbers"),
    ({"pad_numbers": 4, "number_tag_context": "countdown"}, "it needs number_tags=True"),
    ({"pad_numbers": 4, "number_tags": True, "number_tag_context": "(target"}, "not a valid regular expression"),
    ({"pad_numbers": 4, "number_tags": True, "number_tag_style": "after"}, "number_tag_style must be one of"),
    ({"pad_numbers": 4, "number_tags": True, "number_tag_digits": 4}, "number_tag_digits must be"),
    ({"number_tokens": 1}, "number_tokens must be"),
    ({"number_tokens": 4}, "number_tokens must be"),
    ({"number_tokens": 3, "pad_numbers": 4}, "exclude each other"),
])
def test_bad_number_token_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_tokenizer(["1"], **kwargs)


@pytest.mark.parametrize("settings, canvas, third_piece", [
    ({"model.number_tokens": 3}, 12, "▁15"),
    ({"model.pad_numbers": 4, "model.number_tags": "true"}, 23, "∅"),
    ({"model.pad_numbers": 4, "model.number_tags": "true", "model.number_tag_style": "replace"}, 20, "∅"),
    ({"model.pad_numbers": 4, "model.number_tags": "true", "model.number_tag_style": "replace",
      "model.number_tag_context": "countdown"}, 20, "∅"),
    ({"model.pad_numbers": 4, "model.number_tags": "true", "model.number_tag_style": "whole",
      "model.number_tag_context": "countdown"}, 20, "∅"),
])
@pytest.mark.slow
def test_a_recipe_can_train_with_number_tokens_or_tags(tmp_path, settings, canvas, third_piece):
    from dllm.training.config import SFTConfig, load_config
    from dllm.training.sft import SFTTrainer

    from .conftest import micro_overrides

    over = micro_overrides(tmp_path / "run", max_steps=2, **{
        "model.tokenizer": "null", **settings, "data.tasks": "{countdown: 1}", "data.max_new_tokens": canvas})
    result = SFTTrainer(load_config(SFTConfig, None, over)).run()
    assert result.status == "finished"
    tok = load_tokenizer(tmp_path / "run" / "final")
    assert tok.tokenize("numbers 3 15 7 target 98 :")[2] == third_piece
    if settings.get("model.number_tag_context"):  # tags in the prompt, none in the answer
        assert tok.tokenize("numbers 3 15 7 target 98 :")[1] == "▁⟦3⟧" and tok.tokenize("3 * 15")[0] == "▁∅"


def test_padding_reads_every_countdown_number_alike(padded_tokenizer):
    tok = padded_tokenizer
    # every number of the prompt is padded, as in the answer (the cell rule used to skip "15" and "7")
    assert tok.tokenize("numbers 3 15 7 target 98 :") == [
        "▁numbers", "▁∅", "∅", "∅", "3", "▁∅", "∅", "1", "5", "▁∅", "∅", "∅", "7", "▁target", "▁∅", "∅", "9", "8", "▁:"]
    assert tok.tokenize("numbers 3 5 7 target 9 :").count("▁∅") == 4
    # Sudoku grids keep their layout: the first cell padded, the later ones not, also at the end of a chat turn
    grid = "sudoku : 0 0 0 2 / 2 1 4 3 / 3 0 0 1 / 1 0 3 4"
    assert tok.tokenize(grid).count("▁∅") == 1 and len(tok.tokenize(grid)) == 24


def test_only_countdown_prompts_differ_from_the_shipped_padded_digit_tokenizer(padded_tokenizer,
                                                                              padded_digit_tokenizer):
    """The padded-digit tokenizer the bundled models shipped with keeps the older cell rule in its
    tokenizer.json; a rebuilt one differs from it on countdown prompts only, with the same vocabulary."""
    assert padded_tokenizer.get_vocab() == padded_digit_tokenizer.get_vocab()
    for name in suite_names():
        for ex in get_suite(name).examples("test", 100, seed=11):
            for kind, text in (("prompt", ex.prompt), ("answer", ex.answer)):
                same = padded_tokenizer.tokenize(text) == padded_digit_tokenizer.tokenize(text)
                assert same is not (name == "countdown" and kind == "prompt"), (name, text)
