"""Several EOS ids (``eos_token_id=[a, b]``, as the block-diffusion checkpoints' generation_config.json lists
them): every id stops a row, in every strategy, exactly as that id alone does; ``min_tokens`` and
``ignore_eos`` cover every id; text and streams are cut at the first of any; a checkpoint's list is the
default of ``model.generate``, ``generate_text`` and ``dllm generate``.

The construction: a decode whose answer holds EOS id ``e`` (the model's own EOS on the bundled models, a
token the model commits on the tiny family checkpoints, whose EOS row is silent) is run again with
``eos_token_id=[other, e]``, ``other`` an id the model never commits there: same tokens (the tail after the
EOS is padded with the first id, ``other``), same forwards, same text and stream. ``other`` alone must not
stop it: the second id is what did."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

import dllm
from dllm import DiffusionGenerationConfig, GenerationConfigError
from dllm.decoding.runner import LogitRules
from dllm.decoding.stopping import EosIds
from dllm.decoding.streaming import CollectingBatchStreamer
from dllm.testing import save_tiny_block_checkpoint, tiny_block_model
from dllm.text import completion_text, encode_prompts, generate_text

PROMPTS = ["What is 123 + 45 ?", "reverse : Ann Bob Cal"]
SPECIAL = {0, 1, 2, 3}  # the bundled tokenizer's pad, unk, EOS and [MASK]


@pytest.fixture(scope="module")
def tok():
    return dllm.load_tokenizer("tiny")


@pytest.fixture(scope="module")
def models(moe_checkpoints):
    return {
        "tiny": dllm.load_model("tiny"),
        "tiny-d2f": dllm.load_model("tiny-d2f"),
        "sdar": tiny_block_model("sdar", seed=0, scale=8.0, silent=(2, 3)),
        "fast-dllm-v2": tiny_block_model("fast-dllm-v2", seed=0, scale=8.0, silent=(2, 3)),
        "llada2": dllm.load_model(moe_checkpoints["llada2"]),
    }


# (model, options, whether the model commits its own EOS; if not, a committed token plays EOS)
CASES = [
    ("tiny", {"strategy": "vanilla", "block_length": 8}, True),
    ("tiny", {"strategy": "threshold", "block_length": 8}, True),
    ("tiny", {"strategy": "threshold", "block_length": 8, "cache": "dual"}, True),
    ("tiny", {"strategy": "d3llm", "block_length": 8}, True),
    ("tiny", {"strategy": "lopa", "block_length": 8, "lopa_branches": 2}, True),  # on the semi-AR rule
    ("tiny-d2f", {"strategy": "d2f", "block_length": 8}, True),
    ("tiny-d2f", {"strategy": "lopa", "block_length": 8, "lopa_branches": 2}, True),  # on the D2F pipeline
    ("sdar", {"strategy": "sdar", "block_length": 4}, False),
    ("fast-dllm-v2", {"strategy": "fast_dllm_v2", "block_length": 8, "sub_block_length": 4}, False),
    ("fast-dllm-v2", {"strategy": "fast_dllm_v2", "block_length": 8, "sub_block_length": 4, "cache": "dual"}, False),
    ("llada2", {"strategy": "edit", "block_length": 4, "threshold": 0.5, "editing_threshold": 0.2}, False),
]


def _decode(model, tok, **kw):
    streamer = CollectingBatchStreamer()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*one id")  # a list of EOS ids is no reason for a warning
        results = generate_text(model, tok, PROMPTS, streamer=streamer, max_new_tokens=16, temperature=0.0, **kw)
    return results, streamer


def _played_eos(results) -> int:
    """A token row 0 commits (first at its third slot or later): the EOS of a model that never commits its own."""
    ids = results[0].token_ids
    return next(t for k, t in enumerate(ids) if k >= 2 and t not in ids[:k] and t not in SPECIAL)


def _unused(results, *avoid) -> int:
    seen = {t for r in results for t in r.token_ids} | SPECIAL | set(avoid)
    return next(t for t in range(4, 402) if t not in seen)


@pytest.mark.parametrize("name,kw,own_eos", CASES, ids=[f"{c[0]}-{c[1]['strategy']}-{c[1].get('cache', 'none')}"
                                                         for c in CASES])
def test_the_second_eos_id_stops_a_row_as_that_id_alone(models, tok, name, kw, own_eos):
    model = models[name]
    e = tok.eos_token_id if own_eos else _played_eos(_decode(model, tok, stop_at_eos=False, **kw)[0])
    free, _ = _decode(model, tok, eos_token_id=e, stop_at_eos=False, **kw)
    other = _unused(free, e)
    one, one_stream = _decode(model, tok, eos_token_id=e, **kw)
    two, two_stream = _decode(model, tok, eos_token_id=[other, e], **kw)
    assert "stop" in [r.finish_reason for r in one]  # e ends some row
    for a, b in zip(one, two):
        n = a.generated_tokens
        assert (b.finish_reason, b.generated_tokens, b.num_forwards, b.step_map) == \
               (a.finish_reason, n, a.num_forwards, a.step_map)
        # the answer up to and with its EOS is the same; the padding after it is the first id
        assert b.token_ids == a.token_ids[:n] + [other if t == e else t for t in a.token_ids[n:]]
        assert b.text == a.text
    assert two_stream.tokens == one_stream.tokens and two_stream.finished == one_stream.finished
    # ``other`` alone stops nothing: the second id is what ended the rows that stopped
    alone, _ = _decode(model, tok, eos_token_id=other, **kw)
    for a, c in zip(one, alone):
        if a.finish_reason == "stop":
            assert c.generated_tokens > a.generated_tokens


def test_order_does_not_matter_for_stopping(models, tok):
    model = models["tiny"]
    e = tok.eos_token_id
    free, _ = _decode(model, tok, stop_at_eos=False, block_length=8)
    other = _unused(free, e)
    a, _ = _decode(model, tok, eos_token_id=[e, other], block_length=8)
    b, _ = _decode(model, tok, eos_token_id=[other, e], block_length=8)
    assert [(r.text, r.num_forwards, r.generated_tokens) for r in a] == \
           [(r.text, r.num_forwards, r.generated_tokens) for r in b]
    assert all(t == e for r in a for t in r.token_ids[r.generated_tokens:])  # a's padding: its first id, e
    assert all(t == other for r in b for t in r.token_ids[r.generated_tokens:])


# ----------------------------------------------------------------------------- min_tokens, ignore_eos
def test_logit_rules_suppress_every_eos_id():
    logits = torch.zeros(2, 4, 8)
    LogitRules(eos_ids=(1, 6), min_tokens=2).apply(logits, first_slot=10, prompt_length=torch.tensor([10, 11]))
    for tok_id in (1, 6):
        assert torch.isinf(logits[0, :, tok_id]).tolist() == [True, True, False, False]
        assert torch.isinf(logits[1, :, tok_id]).tolist() == [True, True, True, False]
    assert not bool(torch.isinf(logits[..., [0, 2, 3, 4, 5, 7]]).any())
    cfg = DiffusionGenerationConfig(ignore_eos=True, eos_token_id=[1, 6, 99])
    rules = LogitRules.from_config(cfg, mask_id=3, eos_ids=EosIds(cfg.eos_token_ids))
    assert rules.banned == (3, 1, 6, 99) and rules.eos_id == 1
    logits = torch.zeros(1, 2, 8)
    rules.apply(logits, first_slot=0, prompt_length=0)  # 99 lies past the vocabulary: nothing to ban
    assert torch.isinf(logits[0, 0]).tolist() == [False, True, False, True, False, False, True, False]
    # one id, given the old way, is the one-element set
    assert LogitRules(eos_id=5, min_tokens=1).eos_ids == (5,)


@pytest.mark.parametrize("kw", [{"strategy": "threshold"}, {"strategy": "d3llm"}], ids=lambda k: k["strategy"])
def test_min_new_tokens_and_ignore_eos_cover_both_ids(models, tok, kw):
    model = models["tiny"]
    e = tok.eos_token_id
    ids, mask = encode_prompts(tok, PROMPTS)
    P = ids.shape[1]
    gen = dict(max_new_tokens=16, block_length=8, return_dict_in_generate=True, **kw)
    free = model.generate(ids, attention_mask=mask, stop_at_eos=False, **gen)
    first = int(free.sequences[0, P])  # row 0's first answer token: as an EOS id, row 0 ends at once
    both = [first, e]
    early = model.generate(ids, attention_mask=mask, eos_token_id=both, **gen)
    assert int(early.generated_tokens[0]) == 1
    for order in (both, both[::-1]):
        late = model.generate(ids, attention_mask=mask, eos_token_id=order, min_new_tokens=5, **gen)
        head = late.sequences[:, P:P + 5]
        assert not bool(torch.isin(head, torch.tensor(both)).any())  # neither id in the first 5 slots
        filled = model.generate(ids, attention_mask=mask, eos_token_id=order, ignore_eos=True, **gen)
        assert not bool(torch.isin(filled.sequences[:, P:], torch.tensor(both)).any())
        assert filled.finish_reason == ["length", "length"]


# ----------------------------------------------------------------------------- the config and its callers
def test_the_config_takes_one_id_or_a_list():
    assert DiffusionGenerationConfig(eos_token_id=[5, 7]).eos_token_id == (5, 7)
    assert DiffusionGenerationConfig(eos_token_id=(5, 7, 5)).eos_token_ids == (5, 7)
    assert DiffusionGenerationConfig(eos_token_id=[5]).eos_token_id == 5  # a list of one is its id
    assert DiffusionGenerationConfig(eos_token_id=5).eos_token_ids == (5,)
    assert DiffusionGenerationConfig().eos_token_ids == ()
    assert DiffusionGenerationConfig(eos_token_id="5,7").eos_token_id == (5, 7)  # --set eos_token_id=5,7
    for bad in ([], [5, -1], [5, 1.5], [True], "five", 2.0):
        with pytest.raises(GenerationConfigError, match="eos_token_id"):
            DiffusionGenerationConfig(eos_token_id=bad)
    cfg = DiffusionGenerationConfig(eos_token_id=[5, 7])
    assert cfg.to_dict()["eos_token_id"] == [5, 7]
    assert DiffusionGenerationConfig.from_dict(json.loads(cfg.to_json_string())) == cfg
    assert hash(cfg) == hash(DiffusionGenerationConfig(eos_token_id=(5, 7)))


def test_eos_ids_match():
    x = torch.tensor([[4, 5, 6, 7]])
    assert EosIds([5]).match(x).tolist() == [[False, True, False, False]]
    assert EosIds([7, 5]).match(x).tolist() == [[False, True, False, True]]
    assert not bool(EosIds().match(x).any()) and not EosIds()
    assert 7 in EosIds([7, 5]) and EosIds([7, 5, 7]).ids == (7, 5) and EosIds([7, 5]).first == 7


def test_completion_text_cuts_at_the_first_of_any_id(tok):
    ids = tok("Ann Bob Eve", add_special_tokens=False)["input_ids"]
    bob = ids[1]
    assert completion_text(tok, ids, None) == "Ann Bob Eve"
    assert completion_text(tok, ids, bob) == "Ann"
    assert completion_text(tok, ids, [ids[2], bob]) == "Ann"
    assert completion_text(tok, ids, (999,)) == "Ann Bob Eve"


def test_generate_takes_a_transformers_list_without_a_warning(models, tok):
    from transformers import GenerationConfig

    model = models["tiny"]
    ids, mask = encode_prompts(tok, PROMPTS)
    never = tok.convert_tokens_to_ids("<|unk|>")
    alone = model.generate(ids, attention_mask=mask, eos_token_id=tok.eos_token_id, return_dict_in_generate=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*one id")
        listed = model.generate(ids, attention_mask=mask, eos_token_id=[never, tok.eos_token_id],
                                return_dict_in_generate=True)
        hf = model.generate(ids, attention_mask=mask, return_dict_in_generate=True,
                            generation_config=GenerationConfig(eos_token_id=[never, tok.eos_token_id]))
    assert alone.eos_token_ids == (tok.eos_token_id,) and listed.eos_token_ids == (never, tok.eos_token_id)
    for out in (listed, hf):
        assert out.finish_reason == alone.finish_reason == ["stop", "stop"]
        assert torch.equal(out.num_forwards, alone.num_forwards)
        assert torch.equal(out.generated_tokens, alone.generated_tokens)


def test_the_model_generation_config_list_is_the_default(tok):
    """Without ``eos_token_id`` in the decoding config, every id of the model's ``generation_config`` counts."""
    model = tiny_block_model("sdar", seed=0, scale=8.0, silent=(2, 3))
    kw = dict(strategy="sdar", block_length=4, mask_token_id=3)
    e = _played_eos(_decode(model, tok, stop_at_eos=False, **kw)[0])
    free, _ = _decode(model, tok, eos_token_id=e, stop_at_eos=False, **kw)
    other = _unused(free, e)
    want, _ = _decode(model, tok, eos_token_id=e, **kw)
    model.generation_config.eos_token_id = [other, e]
    got, _ = _decode(model, tok, **kw)
    assert [(r.text, r.num_forwards, r.finish_reason) for r in got] == \
           [(r.text, r.num_forwards, r.finish_reason) for r in want]


# ----------------------------------------------------------------------------- a checkpoint folder
def test_a_checkpoint_whose_generation_config_lists_two_ids_stops_at_both(tmp_path, tok):
    """The SDAR fixture's folder with generation_config.json's ``eos_token_id`` = ``[other, e]``: ``generate``,
    ``generate_text`` and ``dllm generate`` stop at ``e`` (the second id) by default; ``dllm info`` lists both."""
    from typer.testing import CliRunner

    from dllm.cli import app

    base = tmp_path / "base"
    save_tiny_block_checkpoint(base, "sdar", seed=0, scale=8.0, silent=(2, 3))
    model = dllm.load_model(base)
    assert model.diffusion_generation_config.eos_token_id == 2  # the fixture lists one id: [2]
    ckpt_tok = dllm.load_tokenizer(base)
    prompt = "reverse : Ann Bob Cal"
    free = generate_text(model, ckpt_tok, prompt, stop_at_eos=False, max_new_tokens=16)
    e = _played_eos(free)
    free = generate_text(model, ckpt_tok, prompt, eos_token_id=e, stop_at_eos=False, max_new_tokens=16)
    other = _unused(free, e)
    [want] = generate_text(model, ckpt_tok, prompt, eos_token_id=e, max_new_tokens=16)
    assert want.finish_reason == "stop" and want.generated_tokens < 16

    folder = tmp_path / "two-eos"
    shutil.copytree(base, folder)
    gen_file = folder / "generation_config.json"
    published = json.loads(gen_file.read_text())
    gen_file.write_text(json.dumps({**published, "eos_token_id": [other, e]}, indent=2))
    two = dllm.load_model(folder)
    assert two.diffusion_generation_config.eos_token_ids == (other, e)
    [got] = generate_text(two, ckpt_tok, prompt, max_new_tokens=16)
    assert (got.text, got.num_forwards, got.generated_tokens, got.finish_reason) == \
           (want.text, want.num_forwards, want.generated_tokens, want.finish_reason)
    ids, mask = encode_prompts(ckpt_tok, [prompt])
    out = two.generate(ids, attention_mask=mask, max_new_tokens=16, return_dict_in_generate=True)
    assert out.finish_reason == ["stop"] and int(out.generated_tokens[0]) == want.generated_tokens
    assert out.sequences[0, ids.shape[1]:].tolist()[: want.generated_tokens] == want.token_ids[: want.generated_tokens]

    runner = CliRunner()
    result = runner.invoke(app, ["generate", prompt, "--model", str(folder), "--max-new-tokens", "16", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert (payload["text"], payload["num_forwards"], payload["finish_reason"]) == \
           (want.text, want.num_forwards, "stop")
    facts = json.loads(runner.invoke(app, ["info", str(folder), "--json"]).stdout)
    assert facts["eos_token_id"] == [other, e]
    # the list survives save_pretrained (the decoding defaults under "dllm", the published keys beside them)
    two.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    assert saved["eos_token_id"] == [other, e] and saved["dllm"]["eos_token_id"] == [other, e]
    assert dllm.load_model(tmp_path / "saved").diffusion_generation_config.eos_token_ids == (other, e)
