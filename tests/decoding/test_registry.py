"""The strategy registry: a strategy defined outside the package runs through generate, sessions and the
server's checks like a built-in one; the registry fails loudly with the valid names."""

from __future__ import annotations

import warnings

import pytest
import torch

from dllm.decoding import DecodeSession, StrategyError, get_strategy
from dllm.decoding.commit import CommitPolicy, Threshold
from dllm.decoding.loops.semi_ar import decode_semi_ar
from dllm.decoding.policies import select_top_k
from dllm.decoding.registry import (
    Strategy,
    register_strategy,
    strategy_names,
    unread_options_error,
    unregister_strategy,
)
from dllm.generation import DiffusionGenerationConfig, GenerationConfigError
from dllm.testing import tiny_llada

G, B = 16, 4


class TopTwo(CommitPolicy):
    """Commit the two most confident masked slots of the block per step."""

    def select(self, conf, candidates, step, gen):
        return select_top_k(conf, candidates, torch.full((conf.shape[0],), 2, dtype=torch.long))


@pytest.fixture(scope="module")
def model():
    return tiny_llada(initializer_range=0.5)


@pytest.fixture
def top2():
    strategy = register_strategy(Strategy("top2_test", decode_semi_ar, "two tokens per step", policy=TopTwo,
                                          options=frozenset({"cache"}), joins_rows=True))
    yield strategy
    unregister_strategy("top2_test")


def _prompt(b=1, length=7, seed=0):
    return torch.randint(0, 60, (b, length), generator=torch.Generator().manual_seed(seed))


def test_a_registered_strategy_runs_through_generate_with_two_tokens_per_forward(model, top2):
    out = model.generate(_prompt(), strategy="top2_test", max_new_tokens=G, block_length=B, stop_at_eos=False,
                         return_dict_in_generate=True)
    assert int(out.num_forwards[0]) == G // 2
    assert not bool((out.sequences[0, 7:] == model.config.mask_token_id).any())
    assert "top2_test" in strategy_names()


def test_its_capabilities_are_what_the_session_asks(model, top2):
    """joins_rows=True: rows added mid-run decode as when they run alone (the built-ins' invariance)."""
    cfg = DiffusionGenerationConfig(strategy="top2_test", max_new_tokens=G, block_length=B, stop_at_eos=False)
    alone = DecodeSession(model, cfg)
    alone.add_rows([[5, 6, 7]])
    want = alone.run().sequences[0, -G:]
    session = DecodeSession(model, cfg, joinable=True)
    session.add_rows([[1, 2, 3, 4]])
    session.step()
    session.add_rows([[5, 6, 7]])
    got = session.run().sequences[1, -G:]
    assert torch.equal(got, want)


def test_a_policy_of_its_own_on_a_shared_loop_equals_the_built_in_it_copies(model):
    """A strategy registered with the built-in Threshold policy on decode_semi_ar is token-identical to
    'threshold': the loop depends only on the record, never on the name."""
    register_strategy(Strategy("mine_test", decode_semi_ar, "threshold again", policy=Threshold,
                               options=get_strategy("threshold").options))
    try:
        kw = dict(max_new_tokens=G, block_length=B, threshold=0.3, stop_at_eos=False, return_dict_in_generate=True)
        a = model.generate(_prompt(2), strategy="threshold", **kw)
        b = model.generate(_prompt(2), strategy="mine_test", **kw)
        assert torch.equal(a.sequences, b.sequences)
        assert torch.equal(a.num_forwards, b.num_forwards)
    finally:
        unregister_strategy("mine_test")


def test_registry_errors_name_the_valid_strategies(top2):
    with pytest.raises(StrategyError, match="valid: .*threshold.*top2_test"):
        get_strategy("top3")
    with pytest.raises(StrategyError, match="already registered"):
        register_strategy(top2)
    with pytest.raises(TypeError):
        register_strategy("top2")
    with pytest.raises(StrategyError, match="grid"):
        register_strategy(Strategy("bad_test", decode_semi_ar, "x", grid="diagonal"))


def test_options_it_does_not_read_are_refused_per_row(model, top2):
    cfg = DiffusionGenerationConfig(strategy="top2_test", max_new_tokens=G, block_length=B)
    with pytest.raises(GenerationConfigError, match="per-row options: none"):
        DecodeSession(model, cfg).add_rows([[1, 2]], threshold=0.5)


def test_an_option_set_for_one_call_that_the_strategy_does_not_read_warns(model, top2):
    """A config may carry every strategy's fields (a sweep keeps one), but an option passed to one call is meant
    to act: generate warns, naming each unread option and the strategies that read it; ``steps`` never counts."""
    assert top2.unread(["threshold", "cache", "steps", "max_new_tokens", "temperature"]) == ["threshold"]
    assert unread_options_error("top2_test", ["cache", "steps"]) is None
    said = unread_options_error("vanilla", ["skip_threshold", "threshold"])
    assert said.startswith("strategy 'vanilla' does not read skip_threshold (read by d2f, lopa); threshold (read by ")
    with pytest.warns(UserWarning, match=r"strategy 'top2_test' does not read threshold \(read by threshold,"):
        model.generate(_prompt(), strategy="top2_test", threshold=0.5, max_new_tokens=G, block_length=B)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.generate(_prompt(), strategy="top2_test", cache="prefix", steps=8, max_new_tokens=G, block_length=B)
        # a whole config is not "set for the call": its other strategies' fields stay quiet
        model.generate(_prompt(), generation_config=DiffusionGenerationConfig(
            strategy="top2_test", threshold=0.5, max_new_tokens=G, block_length=B))
