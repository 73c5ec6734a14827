"""The step cap: a row whose forwards stop committing real tokens ends "step_limit", the rest go on."""

from __future__ import annotations

import pytest
import torch

from dllm import DiffusionGenerationConfig
from dllm.decoding.errors import GenerationConfigError
from dllm.testing import EOS, MASK, tiny_dream, tiny_llada


def _prompt(seed: int) -> list[int]:
    return torch.randint(0, 60, (7,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_default_cap_is_derived_from_the_canvas():
    cfg = DiffusionGenerationConfig(max_new_tokens=64, block_length=8)
    assert cfg.step_limit() == 2 * (64 + 8)
    assert cfg.replace(steps=256).step_limit() == 2 * (256 + 8)  # fixed-step schedules may exceed the canvas
    assert cfg.replace(max_steps=5).step_limit() == 5


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "10"])
def test_max_steps_is_validated(bad):
    with pytest.raises(GenerationConfigError, match="max_steps"):
        DiffusionGenerationConfig(max_steps=bad)


def test_a_stuck_row_ends_step_limit_while_the_other_row_finishes():
    """A random LLaDA-format checkpoint viewed block-causally (B 8, 64 new tokens): for the first
    prompt the model's argmax at the fully activated block's best position is ``[MASK]``, so D2F
    commits ``[MASK]`` every forward (the reference loops to its 10,001-step cap)."""
    model = tiny_llada(seed=0, initializer_range=0.5, attention_policy="block_causal", block_size=8)
    kw = dict(strategy="d2f", max_new_tokens=64, block_length=8, suppress_mask_token=False, stop_at_eos=False,
              return_dict_in_generate=True)
    stuck, fine = _prompt(7), _prompt(1)
    out = model.generate(torch.tensor([stuck, fine]), **kw)
    cap = DiffusionGenerationConfig(max_new_tokens=64, block_length=8).step_limit()
    assert out.finish_reason == ["step_limit", "length"]
    assert out.num_forwards.tolist()[0] == cap
    alone = model.generate(torch.tensor([fine]), **kw)
    assert torch.equal(out.sequences[1], alone.sequences[0])
    assert int(out.num_forwards[1]) == int(alone.num_forwards[0]) < cap
    assert int(alone.num_forwards[0]) <= 64 + 8  # a healthy row needs at most one forward per token and block
    # the stuck row keeps what it committed; its never-filled slots hold the EOS fill
    assert bool((out.step_map[0] == -1).any()) and int(out.sequences[0, -1]) == EOS
    # with the mask suppressed (the default) the same prompt decodes normally
    assert model.generate(torch.tensor([stuck]), **{**kw, "suppress_mask_token": True}).finish_reason != ["step_limit"]


def _mask_lover(model):
    """A model whose argmax is ``[MASK]`` at every position."""
    forward = model.forward

    def always_mask(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits[..., MASK] += 1e4
        return out

    model.forward = always_mask
    return model


BIDIRECTIONAL = [
    ("threshold", {"cache": "none"}), ("threshold", {"cache": "prefix"}), ("threshold", {"cache": "dual"}),
    ("factor", {"cache": "prefix"}), ("vanilla", {"cache": "dual"}), ("entropy", {"cache": "prefix", "steps": 8}),
    ("maskgit_plus", {"cache": "dual", "steps": 16}), ("d3llm", {}), ("d3llm", {"cache": "prefix"}),
    ("lopa", {"lopa_branches": 2, "cache": "dual"}),
]
BLOCK_CAUSAL = [("d2f", {}), ("lopa", {"lopa_branches": 2}), ("threshold", {}), ("d3llm", {})]


@pytest.mark.parametrize("policy,strategy,extra", [("bidirectional", s, e) for s, e in BIDIRECTIONAL]
                         + [("block_causal", s, e) for s, e in BLOCK_CAUSAL])
@pytest.mark.parametrize("builder", [tiny_llada, tiny_dream], ids=["llada", "dream"])
def test_every_loop_ends_stuck_rows(builder, policy, strategy, extra):
    view = {"attention_policy": "block_causal", "block_size": 8} if policy == "block_causal" else {}
    model = _mask_lover(builder(seed=0, initializer_range=0.5, **view))
    cfg = DiffusionGenerationConfig(strategy=strategy, max_new_tokens=16, block_length=8, suppress_mask_token=False,
                                    stop_at_eos=False, return_dict_in_generate=True, **extra)
    out = model.generate(torch.tensor([_prompt(0), _prompt(1)]), generation_config=cfg)
    assert out.finish_reason == ["step_limit"] * 2
    assert out.num_forwards.tolist() == [cfg.step_limit()] * 2
    assert bool((out.sequences[:, 7:] == EOS).all())  # no real token was ever committed: all EOS fill


def test_fixed_step_schedules_are_not_capped_below_their_steps():
    """``vanilla`` without a cache runs exactly ``steps`` forwards (LLaDA): nothing is stuck."""
    model = _mask_lover(tiny_llada(seed=0, initializer_range=0.5))
    out = model.generate(torch.tensor([_prompt(0)]), strategy="vanilla", steps=16, max_new_tokens=16, block_length=8,
                         suppress_mask_token=False, stop_at_eos=False, return_dict_in_generate=True)
    assert out.finish_reason == ["length"] and out.num_forwards.tolist() == [16]


def test_an_explicit_max_steps_caps_the_row():
    model = _mask_lover(tiny_llada(seed=0, initializer_range=0.5, attention_policy="block_causal", block_size=8))
    out = model.generate(torch.tensor([_prompt(0)]), strategy="d2f", max_new_tokens=16, block_length=8, max_steps=5,
                         suppress_mask_token=False, return_dict_in_generate=True)
    assert out.finish_reason == ["step_limit"] and out.num_forwards.tolist() == [5]
