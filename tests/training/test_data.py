"""The task stream: chat format, EOS padding, determinism and resumable position."""

from __future__ import annotations

import pytest
import torch

from dllm.training.config import DataSection, SFTConfig, load_config
from dllm.training.data import TaskStream
from dllm.training.encoding import encode_answer, encode_prompt
from dllm.training.sft import SFTTrainer

from .conftest import micro_overrides

# numbers are padded to 4 digits by the bundled tokenizer, so countdown answers need more than 16
CANVAS = 32


def _stream(tokenizer, **kw):
    cfg = DataSection(tasks={"arith": 1, "lists": 1, "countdown": 1}, max_new_tokens=CANVAS, chunk_size=32,
                      eos_pad=kw.pop("eos_pad", "random"), mix=kw.pop("mix", "per_batch"))
    return TaskStream(tokenizer, cfg, batch_size=kw.pop("batch_size", 6), seed=kw.pop("seed", 0), **kw)


def test_encoding_follows_the_chat_template(tokenizer):
    p = encode_prompt(tokenizer, "What is 3 + 4 ?")
    assert tokenizer.convert_ids_to_tokens(p)[0] == "<|user|>"
    assert tokenizer.decode(p, skip_special_tokens=True) == "What is 3 + 4 ?"
    assert tokenizer.convert_ids_to_tokens(p)[-1] == "<|assistant|>"
    a = encode_answer(tokenizer, "7")
    assert a[-1] == tokenizer.eos_token_id and tokenizer.decode(a[:-1]) == "7"


def test_batches_are_left_padded_and_eos_padded(tokenizer):
    s = _stream(tokenizer)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    for _ in range(20):
        b = s.next_batch()
        p = b.prompt_length
        assert len(set(b.suites)) == 1  # per_batch mix
        assert (b.input_ids[:, p - 1] == tokenizer.convert_tokens_to_ids("<|assistant|>")).all()
        assert torch.equal(b.attention_mask == 0, b.input_ids == pad)
        assert (b.input_ids[:, -1] == eos).all() and b.gen_length <= CANVAS
        assert b.answer_mask[:, p:].all() and not b.answer_mask[:, :p].any()
        for row in b.input_ids[:, p:].tolist():  # EOS then only EOS
            first = row.index(eos)
            assert all(t == eos for t in row[first:]) and all(t != eos for t in row[:first])


def test_fixed_padding_and_block_multiples(tokenizer):
    assert {_stream(tokenizer, eos_pad="fixed").next_batch().gen_length for _ in range(5)} == {CANVAS}
    s = _stream(tokenizer, pad_multiple=5)
    assert all(s.next_batch().gen_length % 5 == 0 for _ in range(20))


def test_stream_is_deterministic_and_resumable(tokenizer):
    a = _stream(tokenizer, mix="per_example")
    first = [a.next_batch() for _ in range(7)]
    assert len({s for b in first for s in b.suites}) > 1
    b = _stream(tokenizer, mix="per_example")
    for _ in range(4):
        b.next_batch()
    state = b.state_dict()
    c = _stream(tokenizer, mix="per_example")
    c.load_state_dict(state)
    for want in first[4:]:
        got = c.next_batch()
        assert torch.equal(got.input_ids, want.input_ids) and got.suites == want.suites
    other = _stream(tokenizer, seed=1).next_batch()
    assert not torch.equal(other.input_ids[:, -3:], first[0].input_ids[:, -3:]) or other.suites != first[0].suites


def test_too_short_generation_length_is_an_error(tokenizer):
    cfg = DataSection(tasks={"gsm": 1}, max_new_tokens=16)
    with pytest.raises(ValueError, match="max_new_tokens"):
        TaskStream(tokenizer, cfg, batch_size=2, seed=0)


def test_block_diffusion_sft_runs(tmp_path):
    cfg = load_config(SFTConfig, None, micro_overrides(
        tmp_path / "run", max_steps=2, **{"model.attention_policy": "block_causal", "model.block_size": 4}))
    trainer = SFTTrainer(cfg)
    result = trainer.run()
    assert result.status == "finished" and trainer.pad_multiple() == 4
    import json

    conf = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert conf["attention_policy"] == "block_causal" and conf["block_size"] == 4


def test_suite_options_reweight_the_training_stream_only(tokenizer):
    ops = ["copy", "replace_random", "replace_random", "replace_random"]
    cfg = DataSection(tasks={"lists": 1}, max_new_tokens=CANVAS, chunk_size=64,
                      suite_options={"lists": {"ops": ops}})
    s = TaskStream(tokenizer, cfg, batch_size=8, seed=0)
    texts = [tokenizer.decode(q, skip_special_tokens=True) for _ in range(25) for q in s.next_batch().input_ids]
    n_copy = sum("copy :" in t for t in texts)
    n_rand = sum("replace any one name" in t for t in texts)
    assert n_copy + n_rand == len(texts) == 200  # no other op is drawn
    assert 2 * n_copy < n_rand  # a name listed three times is drawn about three times as often
    with pytest.raises(ValueError, match="does not train on"):
        TaskStream(tokenizer, DataSection(tasks={"arith": 1}, suite_options={"lists": {"ops": ["copy"]}}),
                   batch_size=2, seed=0)


@pytest.mark.parametrize("override, message", [
    ("data.suite_options.gsm.ops=[copy]", "does not train on"),
    ("data.suite_options.lists.opz=[copy]", "does not take options \\['opz'\\]"),
    ("data.suite_options.lists.ops=[juggle]", "valid ops"),
    ("data.suite_options.lists=copy", "must be a mapping"),
])
def test_bad_suite_options_fail_when_the_config_loads(override, message):
    from dllm.training.config import ConfigError

    from .conftest import REPO

    with pytest.raises(ConfigError, match=message):
        load_config(SFTConfig, REPO / "recipes" / "smoke-sft.yaml", [override])
