"""Mixed-settings batches: requests of different strategies and thresholds share one batch where each row
still decodes exactly as it does alone (``dllm.decoding.batching``)."""

from __future__ import annotations

import math

import pytest
import torch

from dllm.decoding import DecodeSession
from dllm.decoding.batching import batch_form
from dllm.decoding.streaming import CollectingBatchStreamer
from dllm.testing import tiny_block_model, tiny_llada

G, B = 16, 4


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 60, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


BASE = {"max_new_tokens": G, "block_length": B, "return_dict_in_generate": True}
# four settings as a mixed load sends them: two thresholds, d2f at two skip thresholds and two pipelines
SETTINGS = [
    {"strategy": "threshold", "threshold": 0.7},
    {"strategy": "d2f", "skip_threshold": 0.6, "block_add_threshold": 0.25, "decoded_token_threshold": 0.5},
    {"strategy": "threshold", "threshold": 0.5},
    {"strategy": "d2f", "skip_threshold": 0.8},
]


@pytest.mark.parametrize("which", ["block_causal", "eos_block_causal"])
def test_threshold_and_d2f_rows_share_one_batch_and_equal_their_single_runs(bc_model, eos_bc_model, which):
    m = bc_model if which == "block_causal" else eos_bc_model
    cfgs = [m.diffusion_generation_config.replace(**BASE, **s) for s in SETTINGS]
    forms = [batch_form(m, cfg) for cfg in cfgs]
    assert len({f.key for f in forms}) == 1  # one batch takes all four
    assert {f.cfg.strategy for f in forms} == {"d2f"}
    prompts = [_ids(5, 1), _ids(9, 2), _ids(7, 3), _ids(4, 4), _ids(12, 5), _ids(6, 6)]
    settings = [i % len(SETTINGS) for i in range(len(prompts))]

    streamer = CollectingBatchStreamer()
    session = DecodeSession(m, forms[0].cfg, streamer=streamer, joinable=True)

    def add(i):
        session.add_rows([prompts[i]], **forms[settings[i]].row_values)

    for i in range(3):
        add(i)
    session.step()
    add(3)  # rows join a running batch, too
    session.step()
    add(4)
    add(5)
    out = session.run()
    assert session.forwards < int(out.num_forwards.sum())  # the rows shared forwards
    for i, p in enumerate(prompts):
        single = m.generate(torch.tensor([p]), **BASE, **SETTINGS[settings[i]])
        assert torch.equal(out.sequences[i, -G:], single.sequences[0, -G:]), (which, i, SETTINGS[settings[i]])
        assert int(out.num_forwards[i]) == int(single.num_forwards[0]), i
        assert torch.equal(out.step_map[i], single.step_map[0]), i
        assert out.finish_reason[i] == single.finish_reason[0], i
    if which == "eos_block_causal":
        assert "stop" in out.finish_reason


def test_which_settings_share_a_batch(bc_model):
    tiny = tiny_llada(initializer_range=0.5)  # bidirectional
    form = batch_form(bc_model, bc_model.diffusion_generation_config.replace(**BASE, strategy="threshold", threshold=0.9))
    assert form.cfg.strategy == "d2f" and form.row_values["block_add_threshold"] == 1.0
    assert form.row_values["skip_threshold"] == math.nextafter(0.9, -math.inf)  # conf >= 0.9  <=>  conf > that

    def key(m, **kw):
        return batch_form(m, m.diffusion_generation_config.replace(**BASE, **kw)).key

    assert key(bc_model, strategy="threshold", threshold=0.9) == key(bc_model, strategy="d2f", skip_threshold=0.3)
    # options the batch's strategy ignores do not split batches; those it reads do
    assert key(bc_model, strategy="d2f", cache="dual", factor=2.0) == key(bc_model, strategy="d2f")
    assert key(bc_model, strategy="d2f", d2f_confidence="margin") != key(bc_model, strategy="d2f")
    assert key(bc_model, strategy="d2f", top_p=0.5) != key(bc_model, strategy="d2f")
    assert key(bc_model, strategy="d2f", steps=8) != key(bc_model, strategy="d2f")  # every step limit reads it
    # threshold rows keep their own loop where a d2f row would decode differently
    for m, kw in ((tiny, {}), (bc_model, {"cache": "dual"}), (bc_model, {"stop_at_eos": False}),
                  (bc_model, {"remasking": "random"}), (bc_model, {"threshold": 0.0})):
        form = batch_form(m, m.diffusion_generation_config.replace(**BASE, strategy="threshold", **kw))
        assert form.cfg.strategy == "threshold" and set(form.row_values) == {"threshold", "temperature"}, kw
    assert key(tiny, strategy="threshold", threshold=0.5) == key(tiny, strategy="threshold", threshold=0.9)


def test_a_block_family_model_batches_threshold_with_d2f():
    m = tiny_block_model("sdar", block_size=B)
    form = batch_form(m, m.diffusion_generation_config.replace(**BASE, strategy="threshold"))
    assert form.cfg.strategy == "d2f"


@pytest.mark.parametrize("strategy", ["threshold", "d2f", "vanilla"])
def test_rows_with_their_own_temperatures_share_a_batch(bc_model, strategy):
    """Greedy rows decode as alone beside a sampling row (their plain argmax, no noise); a batch of greedy rows
    draws no noise at all."""
    cfg = bc_model.diffusion_generation_config.replace(**BASE, strategy=strategy, stop_at_eos=False)
    prompts = [_ids(5, 1), _ids(9, 2), _ids(7, 3)]
    temps = [0.0, 1.0, 0.0]
    session = DecodeSession(bc_model, cfg, joinable=True)
    session.add_rows(prompts[:2], temperature=temps[:2])
    session.step()
    session.add_rows(prompts[2:], temperature=temps[2])
    out = session.run()
    assert session.state.may_sample
    for i, (p, t) in enumerate(zip(prompts, temps)):
        if t == 0.0:
            single = bc_model.generate(torch.tensor([p]), **BASE, strategy=strategy, stop_at_eos=False)
            assert torch.equal(out.sequences[i, -G:], single.sequences[0, -G:]), i
            assert int(out.num_forwards[i]) == int(single.num_forwards[0])
    assert bool((out.sequences[1, -G:] != bc_model.config.mask_token_id).all())  # the sampled row completed

    greedy = DecodeSession(bc_model, cfg, joinable=True)
    greedy.add_rows(prompts, temperature=0.0)
    greedy.step()
    assert torch.is_tensor(greedy.state.option("temperature")) and not greedy.state.may_sample
    assert greedy.state.temperature() == 0.0


def test_temperature_does_not_split_batches_but_a_seed_does(bc_model):
    def form(**kw):
        return batch_form(bc_model, bc_model.diffusion_generation_config.replace(**BASE, **kw))

    assert form(strategy="d2f", temperature=0.7).key == form(strategy="threshold", temperature=0.0).key
    assert form(strategy="d2f", temperature=0.7).row_values["temperature"] == 0.7
    assert form(strategy="d2f", seed=3).key != form(strategy="d2f").key  # a seed is shared, never per row
