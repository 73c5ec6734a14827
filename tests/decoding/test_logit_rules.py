"""Rules every strategy's choices obey (dllm.decoding.runner.LogitRules): banned tokens, min_tokens, min_p."""

import pytest
import torch

import dllm
from dllm.decoding.errors import GenerationConfigError
from dllm.decoding.runner import LogitRules
from dllm.text import encode_prompts

STRATEGIES = [{"strategy": "vanilla"}, {"strategy": "threshold", "cache": "dual"}, {"strategy": "d3llm"},
              {"strategy": "lopa", "lopa_branches": 2}]


def test_apply_per_slot_and_per_row():
    logits = torch.zeros(2, 4, 6)
    logits[..., 5] = 3.0
    # slots 10..13; row 0's answer starts at 10, row 1's (joined later) at 11
    LogitRules(banned=(0,), eos_id=1, min_tokens=2).apply(logits, first_slot=10, prompt_length=torch.tensor([10, 11]))
    assert bool(torch.isinf(logits[..., 0]).all())  # banned everywhere
    assert torch.isinf(logits[0, :, 1]).tolist() == [True, True, False, False]
    assert torch.isinf(logits[1, :, 1]).tolist() == [True, True, True, False]
    assert bool((logits[..., 2:] > float("-inf")).all())
    # min_p 0.5 of the top token (e^3 against e^0): every other token dropped
    LogitRules(min_p=0.5).apply(logits, first_slot=10, prompt_length=10)
    assert bool((logits[..., :5] == float("-inf")).all()) and bool((logits[..., 5] == 3.0).all())


@pytest.fixture(scope="module")
def models():
    out = {}
    for name in ("tiny", "tiny-d2f"):
        tok = dllm.load_tokenizer(name)
        ids, mask = encode_prompts(tok, ["What is 123 + 45 ?", "reverse : Ann Bob Cal"])
        out[name] = (dllm.load_model(name), tok, ids, mask)
    return out


@pytest.mark.parametrize("kw", STRATEGIES + [{"strategy": "d2f"}], ids=lambda k: k["strategy"])
def test_ignore_eos_fills_the_answer_and_min_tokens_delays_eos(models, kw):
    model, tok, ids, mask = models["tiny-d2f" if kw["strategy"] in ("d2f", "lopa") else "tiny"]
    eos = tok.eos_token_id
    gen = dict(max_new_tokens=16, block_length=8, return_dict_in_generate=True, **kw)
    plain = model.generate(ids, attention_mask=mask, **gen)
    assert bool((plain.sequences[:, ids.shape[1]:] == eos).any(-1).all())  # both answers end early
    filled = model.generate(ids, attention_mask=mask, ignore_eos=True, **gen)
    assert not bool((filled.sequences[:, ids.shape[1]:] == eos).any())
    assert filled.finish_reason == ["length", "length"] and filled.generated_tokens.tolist() == [16, 16]
    late = model.generate(ids, attention_mask=mask, min_tokens=9, **gen)
    answer = late.sequences[:, ids.shape[1]:]
    first_eos = [int((row == eos).nonzero()[0]) if bool((row == eos).any()) else 16 for row in answer]
    assert min(first_eos) >= 9


def test_min_p_near_one_leaves_only_the_top_token(models):
    model, tok, ids, mask = models["tiny"]
    greedy = model.generate(ids, attention_mask=mask, strategy="threshold", temperature=0.0)
    sampled = model.generate(ids, attention_mask=mask, strategy="threshold", temperature=1.0, seed=0, min_p=0.999)
    assert torch.equal(sampled, greedy)
    wild = model.generate(ids, attention_mask=mask, strategy="threshold", temperature=5.0, seed=0)
    assert not torch.equal(wild, greedy)  # without min_p, sampling at that temperature wanders


@pytest.mark.parametrize("bad,match", [({"min_p": 1.0}, "min_p"), ({"min_p": -0.1}, "min_p"),
                                       ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 99}, "exceeds")])
def test_rules_are_validated(bad, match):
    with pytest.raises(GenerationConfigError, match=match):
        dllm.DiffusionGenerationConfig(max_new_tokens=64, **bad)
