"""Incremental detokenization and stop strings: deltas only append, never split characters, cut at stops."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm.decoding.textstream import IncrementalDetokenizer, RowText
from dllm.serving.testing import WORDS
from dllm.tokenization import build_tokenizer

TEXT = "naïve café 中文字 🙂🙂 ok — ünïcödé déjà vu 🚀 done"


@pytest.fixture(scope="module")
def byte_tok():
    """A byte-level BPE tokenizer (GPT-2 style): multi-byte characters span several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"])
    tok.train_from_iterator(["naive cafe done ok vu", "hello world"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def word_tok():
    return build_tokenizer([WORDS])


def _chunks(ids, sizes):
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        out.append(ids[i:i + n])
        i, k = i + n, k + 1
    return out


@pytest.mark.parametrize("sizes", [[1], [2, 1, 3], [5]])
def test_byte_level_deltas_never_split_characters(byte_tok, sizes):
    ids = byte_tok(TEXT)["input_ids"]
    assert len(ids) > len(TEXT.split())  # multi-byte characters really are split over tokens
    d = IncrementalDetokenizer(byte_tok)
    deltas = [d.add(c) for c in _chunks(ids, sizes)] + [d.flush()]
    assert "".join(deltas) == byte_tok.decode(ids) == TEXT
    assert not any("\ufffd" in x for x in deltas)


def test_word_level_deltas_keep_spaces(word_tok):
    text = "the cat sat on the mat . what is 7 + 5 ?"
    ids = word_tok(text)["input_ids"]
    d = IncrementalDetokenizer(word_tok)
    deltas = [d.add([i]) for i in ids] + [d.flush()]
    assert "".join(deltas) == text and deltas[0] == "the" and deltas[1] == " cat"


def test_stop_string_across_chunks_is_held_back_then_cut(word_tok):
    ids = word_tok("the cat sat on the mat")["input_ids"]
    row = RowText(word_tok, max_tokens=100, stop=("sat on",))
    out = [row.add(ids[:3])]  # "the cat sat": "sat" might start the stop string
    assert out[0] == "the cat " and row.finished is None
    out.append(row.add(ids[3:4]))  # " on" completes it
    assert row.finished == "stop" and row.stop_hit and "".join(out) == "the cat "
    assert row.add(ids[4:]) == "" and row.finish("length") == ""


def test_stop_string_never_seen_releases_held_text_at_the_end(word_tok):
    ids = word_tok("the cat sat")["input_ids"]
    row = RowText(word_tok, max_tokens=100, stop=("sat on",))
    out = row.add(ids) + row.finish("stop")
    assert out == "the cat sat" and row.finished == "stop" and not row.stop_hit


def test_max_tokens_caps_tokens_and_text(word_tok):
    ids = word_tok("the cat sat on the mat")["input_ids"]
    row = RowText(word_tok, max_tokens=4)
    out = row.add(ids[:3]) + row.add(ids[3:])
    assert out == "the cat sat on" and row.finished == "length" and row.n_tokens == 4


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_chunking_gives_the_cut_full_text(word_tok, data):
    words = WORDS.split() + [".", "?", "7", "5", "+"]
    text = " ".join(data.draw(st.lists(st.sampled_from(words), min_size=1, max_size=25)))
    ids = word_tok(text)["input_ids"]
    full = word_tok.decode(ids)
    start = data.draw(st.integers(0, len(full) - 1))
    stop = data.draw(st.sampled_from([full[start:start + n] for n in (1, 2, 4, 7)] + ["zz", "q"]))
    cap = data.draw(st.integers(1, len(ids) + 2))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    row = RowText(word_tok, max_tokens=cap, stop=(stop,))
    deltas = [row.add(c) for c in _chunks(ids, sizes)]
    deltas.append(row.finish("stop"))
    capped = word_tok.decode(ids[:cap])
    expected = capped[: capped.index(stop)] if stop in capped else capped
    assert "".join(deltas) == expected
    assert row.finished == ("stop" if stop in capped or cap > len(ids) else "length")
